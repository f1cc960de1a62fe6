"""List a layer's tar stream member by member without building tarfile.TarInfo objects.

tarfile spends about 25 us on each member; a ROCm base holds hundreds of thousands of them, so
indexing a layer of small files was CPU-bound on tar headers. This reader gives the same names,
types, sizes, modes and link names as tarfile in stream mode ("r|") for ustar, GNU (long names and
links) and pax (extended headers) archives, including where tarfile stops early or raises. What
it does not read itself (GNU sparse members, pax global headers, hdrcharset, GNU.sparse keys) it
reports as Unsupported before yielding anything wrong, and the caller reads the layer with tarfile.
Two differences, both refusals: a long-name or pax payload over 1 MiB is an error (as in Go's
archive/tar; tarfile would allocate it whole), and no size field makes it allocate more than the
stream holds.
"""

from __future__ import annotations

import re
import struct
from typing import Iterator

BLOCK = 512
REGULAR, AREGULAR, HARDLINK, SYMLINK, DIRECTORY, CONTIGUOUS = b"0", b"\0", b"1", b"2", b"5", b"7"
LONGNAME, LONGLINK, SPARSE = b"L", b"K", b"S"
PAX_ONE, PAX_GLOBAL, PAX_SOLARIS = b"x", b"g", b"X"
SUPPORTED = (REGULAR, AREGULAR, HARDLINK, SYMLINK, DIRECTORY, b"6", CONTIGUOUS, b"3", b"4", LONGNAME, LONGLINK,
             SPARSE)
HAS_DATA = (REGULAR, AREGULAR, CONTIGUOUS)
SPECIAL_LIMIT = 1 << 20  # long names and pax records: Go's archive/tar limit
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")


class TarError(Exception):
    """The stream is not a readable tar archive (tarfile would raise ReadError)."""


class Unsupported(Exception):
    """A member kind this reader leaves to tarfile."""


class _End(Exception):
    """tarfile ends the archive here (an end block, or a bad header after the first)."""


class Member:
    __slots__ = ("name", "type", "size", "mode", "linkname")

    def __init__(self, name: str, type: bytes, size: int, mode: int, linkname: str):
        self.name, self.type, self.size, self.mode, self.linkname = name, type, size, mode, linkname

    def isdir(self) -> bool:
        return self.type == DIRECTORY


def _text(field: bytes) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode("utf-8", "surrogateescape")


_NUMBERS: dict[bytes, int] = {}  # field bytes -> value: uid, gid, mtime and modes repeat across a layer


def _number(field: bytes) -> int:
    n = _NUMBERS.get(field)
    if n is None:
        n = _parse_number(field)
        if len(_NUMBERS) > 200_000:
            _NUMBERS.clear()
        _NUMBERS[field] = n
    return n


def _parse_number(field: bytes) -> int:
    """tarfile's nti: octal text, or base-256 when the first byte says so."""
    if field[0] in (0o200, 0o377):
        n = int.from_bytes(field[1:], "big")
        return n - 256 ** (len(field) - 1) if field[0] == 0o377 else n
    end = field.find(b"\0")
    try:
        return int((field if end < 0 else field[:end]).decode("ascii").strip() or "0", 8)
    except ValueError:
        raise _Invalid() from None


class _Invalid(Exception):
    """A header tarfile would call invalid (or empty, or truncated)."""


# name mode uid gid size mtime checksum type linkname magic+version uname gname devmajor devminor prefix
_FIELDS = struct.Struct("100s8s8s8s12s12s8sc100s8s32s32s8s8s155s")


def _header(buf: bytes) -> tuple[Member, int]:
    """(member, its size field) from one header block, as tarfile's TarInfo.frombuf reads it."""
    if len(buf) != BLOCK:
        raise _Invalid()
    if not buf.strip(b"\0"):
        raise _End()
    (name, mode, uid, gid, size, mtime, checksum, kind, link, _, _, _, major, minor, prefix) = _FIELDS.unpack_from(buf)
    checksum = _number(checksum)
    unsigned = 256 + sum(buf) - sum(buf[148:156])
    if checksum != unsigned and checksum != 256 + sum(struct.unpack_from("148b8x356b", buf)):
        raise _Invalid()
    for field in (uid, gid, mtime, major, minor):
        _number(field)  # tarfile refuses a header with any of them unreadable
    name, size, mode, prefix = _text(name), _number(size), _number(mode), _text(prefix)
    if kind == AREGULAR and name.endswith("/"):
        kind = DIRECTORY
    if kind == DIRECTORY:
        name = name.rstrip("/")
    if prefix and kind not in (LONGNAME, LONGLINK, SPARSE):
        name = prefix + "/" + name
    return Member(name, kind, size, mode, _text(link)), size


def _blocks(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


class TarReader:
    """Members of a tar stream in order; read_data() gives a regular member's bytes before the
    next member is asked for."""

    def __init__(self, stream):
        self.stream = stream
        self.pos = 0  # bytes consumed
        self.next_header = 0
        self.data_at = 0  # where the current member's data starts

    def _read(self, n: int) -> bytes:
        data = self.stream.read(n) if n > 0 else b""
        self.pos += len(data)
        return data

    def _skip_and_read_header(self) -> bytes:
        """Skip to the next header (as tarfile does: an error if the data ends first) and read it,
        small skips and the header in one read."""
        gap = self.next_header - self.pos
        if gap < 0:  # a negative size: tarfile cannot seek back in a stream either
            raise TarError("seeking backwards is not allowed")
        while gap > 1 << 20:
            got = len(self._read(1 << 20))
            if got == 0:
                raise TarError("unexpected end of data")
            gap -= got
        buf = self._read(gap + BLOCK)
        if len(buf) < gap:
            raise TarError("unexpected end of data")
        return buf[gap:]

    def __iter__(self) -> Iterator[Member]:
        while True:
            header = self._skip_and_read_header()
            start = self.pos - len(header)
            try:
                member = self._member(header)
            except _End:
                return
            except _Invalid:
                if start == 0:
                    raise TarError("not a tar archive (bad first header)") from None
                return  # tarfile in stream mode ends the listing at a bad header
            yield member

    def read_data(self, member: Member) -> bytes:
        if self.pos != self.data_at:
            raise TarError("member data read out of order")
        if member.size <= 0:
            return b""
        chunks, left = [], member.size
        while left:  # in pieces: a size field cannot make us allocate what the stream does not hold
            chunk = self._read(min(left, 1 << 20))
            if not chunk:
                raise TarError("unexpected end of data")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _member(self, header: bytes | None = None) -> Member:
        member, size = _header(self._read(BLOCK) if header is None else header)
        if member.type in (LONGNAME, LONGLINK, PAX_ONE, PAX_SOLARIS) and size > SPECIAL_LIMIT:
            raise TarError(f"a {member.type!r} header of {size} bytes (Go's archive/tar, which container "
                           f"runtimes use, refuses any over {SPECIAL_LIMIT})")
        if member.type in (LONGNAME, LONGLINK):
            text = _text(self._read(_blocks(size)))
            following = self._subsequent()
            if member.type == LONGNAME:
                following.name = text
            else:
                following.linkname = text
            if following.isdir():
                following.name = following.name.removesuffix("/")
            return following
        if member.type in (PAX_ONE, PAX_SOLARIS):
            return self._pax(self._read(_blocks(size)))
        if member.type in (SPARSE, PAX_GLOBAL):
            raise Unsupported(f"tar member type {member.type!r}")
        self.data_at = self.pos
        self.next_header = self.pos + (_blocks(size) if member.type in HAS_DATA or member.type not in SUPPORTED
                                       else 0)
        return member

    def _subsequent(self) -> Member:
        try:
            return self._member()
        except (_Invalid, _End):
            raise TarError("bad header after an extended header") from None

    def _pax(self, buf: bytes) -> Member:
        if re.search(rb"\d+ hdrcharset=([^\n]+)\n", buf):
            raise Unsupported("pax hdrcharset")
        records, pos = {}, 0
        while (match := _PAX_RECORD.match(buf, pos)) is not None:
            length = int(match.group(1))
            if length == 0:
                raise _Invalid()
            key = match.group(2).decode("utf-8", "surrogateescape")
            records[key] = buf[match.end(2) + 1:match.start(1) + length - 1].decode("utf-8", "surrogateescape")
            pos += length
        if any(k.startswith("GNU.sparse") for k in records):
            raise Unsupported("GNU sparse pax records")
        following = self._subsequent()
        if "path" in records:
            following.name = records["path"].rstrip("/")
        if "linkpath" in records:
            following.linkname = records["linkpath"]
        if "size" in records:
            try:
                following.size = int(records["size"])
            except ValueError:
                following.size = 0
            self.next_header = self.data_at + (_blocks(following.size) if following.type in HAS_DATA or
                                               following.type not in SUPPORTED else 0)
        return following
