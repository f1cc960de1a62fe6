"""Deterministic layers, read back by Python's tarfile/gzip (not by our writer)."""

import gzip
import hashlib
import io
import os
import tarfile

import pytest

from bakery.errors import InputError
from bakery.oci.layer import FileEntry, gzip_bytes, tar_bytes, write_layer

FILES = (FileEntry("/usr/local/bin/tool", b"#!/bin/sh\necho hi\n", executable=True),
         FileEntry("/usr/local/lib/python3.12/dist-packages/vllm/" + "deep/" * 30 + "x.py", b"x = 1\n"),
         FileEntry("/etc/bakery/manifest.json", b"{}\n"))


def test_entries_sorted_with_parents_fixed_owner_mode_mtime_no_pax():
    members = list(tarfile.open(fileobj=io.BytesIO(tar_bytes(FILES, 1234567890))))
    names = [m.name for m in members]
    assert names == sorted(names)
    assert "usr/local/bin" in names and "etc" in names  # explicit parent directories
    for m in members:
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", 1234567890)
        assert m.pax_headers == {}
        assert m.mode == (0o755 if m.isdir() or m.name.endswith("tool") else 0o644)


def test_same_files_same_bytes_whatever_order_umask_or_clock(tmp_path):
    a = write_layer(FILES, 1700000000, tmp_path / "a", "t")
    old = os.umask(0o077)
    try:
        b = write_layer(tuple(reversed(FILES)), 1700000000, tmp_path / "b", "t")
    finally:
        os.umask(old)
    assert a.descriptor.digest == b.descriptor.digest
    assert a.path.read_bytes() == b.path.read_bytes()
    assert write_layer(FILES, 1700000001, tmp_path / "c", "t").descriptor.digest != a.descriptor.digest


def test_digest_and_diff_id_are_of_the_compressed_and_raw_bytes(tmp_path):
    layer = write_layer(FILES, 1, tmp_path, "t")
    blob = layer.path.read_bytes()
    assert layer.descriptor.digest.hex == hashlib.sha256(blob).hexdigest() == layer.path.name
    assert layer.diff_id.hex == hashlib.sha256(gzip.decompress(blob)).hexdigest()
    assert blob[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # no name, mtime 0, level 9


def test_gzip_header_is_fixed():
    assert gzip_bytes(b"a")[:10] == gzip_bytes(b"b")[:10]


@pytest.mark.parametrize("path", ["relative/path", "/a/../b", "/a//b"])
def test_image_paths_must_be_absolute_and_normal(path):
    with pytest.raises(InputError):
        FileEntry(path, b"")


def test_two_files_for_one_path_are_refused():
    with pytest.raises(InputError, match="same image path"):
        tar_bytes((FileEntry("/a", b"1"), FileEntry("/a", b"2")), 0)
