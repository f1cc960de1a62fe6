// golister lists tar archives the way the container engines unpack layers: with Go's archive/tar.
// stdin: archives, each an 8-byte big-endian length and that many bytes. stdout: one JSON line per
// archive, {"members": [[name hex, type, size, linkname hex, mode, data sha256 or ""]], "error": ""}.
// A test tool for bakery's tarscan (tests/test_tarscan.py); not part of bakery.
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
)

type listing struct {
	Members [][]interface{} `json:"members"`
	Error   string          `json:"error"`
}

func list(data []byte) listing {
	out := listing{Members: [][]interface{}{}}
	r := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			out.Error = err.Error()
			return out
		}
		sum := ""
		if h.Typeflag == tar.TypeReg || h.Typeflag == tar.TypeCont {
			hash := sha256.New()
			if _, err := io.Copy(hash, r); err != nil {
				out.Error = err.Error()
				return out
			}
			sum = hex.EncodeToString(hash.Sum(nil))
		}
		out.Members = append(out.Members, []interface{}{hex.EncodeToString([]byte(h.Name)), string([]byte{h.Typeflag}),
			h.Size, hex.EncodeToString([]byte(h.Linkname)), h.Mode, sum})
	}
}

func main() {
	in := bufio.NewReader(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	for {
		var n uint64
		if err := binary.Read(in, binary.BigEndian, &n); err != nil {
			return
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(in, data); err != nil {
			panic(err)
		}
		if err := enc.Encode(list(data)); err != nil {
			panic(err)
		}
	}
}
