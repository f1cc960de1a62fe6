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


def _kept_entry(kept):
    entries = list(kept.rglob("*.gz"))
    assert len(entries) == 1
    return entries[0]


def test_a_tar_compressed_before_is_not_compressed_again(tmp_path, monkeypatch):
    """The gzip cache: the second write of the same tar takes the kept stream (compressing at
    level 9 is most of a warm build's layer writing) and gives the same blob."""
    import bakery.oci.layer as layer_mod

    kept = tmp_path / "gzip"
    first = write_layer(FILES, 7, tmp_path / "a", "t", kept=kept)
    assert _kept_entry(kept).read_bytes() == first.path.read_bytes()

    def no_compressing(data):
        raise AssertionError("compressed again")

    monkeypatch.setattr(layer_mod, "gzip_bytes", lambda data: b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
                        if data == b"" else no_compressing(data))  # the header it checks against stays
    second = write_layer(FILES, 7, tmp_path / "b", "t", kept=kept)
    assert second.descriptor == first.descriptor and second.path.read_bytes() == first.path.read_bytes()


def _other_tar_stream():
    return gzip_bytes(tar_bytes(FILES[:1], 7))


def _cut(stream):
    return stream[:-9]


def _trailing(stream):
    return stream + gzip_bytes(b"more")


def _another_header(stream):
    return stream[:4] + b"\x01\x00\x00\x00" + stream[8:]  # an mtime of its own: another digest


@pytest.mark.parametrize("forge", [lambda s: _other_tar_stream(), _cut, _trailing, _another_header,
                                   lambda s: b"not gzip"],
                         ids=["another tar", "cut", "trailing member", "another header", "garbage"])
def test_a_kept_stream_that_is_not_exactly_ours_for_this_tar_is_dropped(tmp_path, capsys, forge):
    """A kept stream counts only if it has our fixed header and inflates to exactly this tar,
    whole and alone; anything else is one warning, compressed again, the same digest as ever."""
    kept = tmp_path / "gzip"
    first = write_layer(FILES, 7, tmp_path / "a", "t", kept=kept)
    entry = _kept_entry(kept)
    entry.write_bytes(forge(entry.read_bytes()))
    again = write_layer(FILES, 7, tmp_path / "b", "t", kept=kept)
    assert again.descriptor == first.descriptor and again.path.read_bytes() == first.path.read_bytes()
    assert entry.read_bytes() == first.path.read_bytes()  # made again
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "gzip cache entry" in warnings[0]


@pytest.mark.parametrize("plant", ["folder", "fifo", "oversized"])
def test_a_kept_entry_that_is_not_a_plain_small_file_is_ignored_with_a_warning(tmp_path, capsys, plant):
    """A folder, a FIFO (which would block a plain open) or a file far larger than its tar could
    compress to: one warning each, compressed again, the same blob; never an error or a hang."""
    kept = tmp_path / "gzip"
    first = write_layer(FILES, 7, tmp_path / "a", "t", kept=kept)
    entry = _kept_entry(kept)
    entry.unlink()
    if plant == "folder":
        entry.mkdir()
    elif plant == "fifo":
        os.mkfifo(entry)
    else:
        entry.write_bytes(first.path.read_bytes() + bytes(1 << 20))
    again = write_layer(FILES, 7, tmp_path / "b", "t", kept=kept)
    assert again.descriptor == first.descriptor and again.path.read_bytes() == first.path.read_bytes()
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings and all("gzip cache entry" in w or "could not keep" in w for w in warnings)
