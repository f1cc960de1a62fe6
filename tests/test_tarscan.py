"""bakery.tarscan lists a tar stream as Python's tarfile does in stream mode ("r|"), the reader
layers were indexed with before: the same members with the same names, types, sizes, modes, link
names and bytes, or an error where tarfile raises one. tarfile is the reference throughout; the
archives are written by tarfile (ustar, GNU, pax), then mutated byte by byte and cut short.
"""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bakery import base as base_mod
from bakery.extract import _scan
from bakery.extract import LayerCache
from bakery.registry import Registry
from bakery.tarscan import TarError, TarReader, Unsupported

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KINDS = {"file": tarfile.REGTYPE, "old-file": tarfile.AREGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "char": tarfile.CHRTYPE, "contiguous": tarfile.CONTTYPE}
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
HAS_DATA = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)


def by_tarfile(data: bytes) -> list | str:
    try:
        out = []
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
            for m in tar:
                body = tar.extractfile(m).read() if m.type in HAS_DATA else None
                out.append((m.name, m.type, m.size, m.mode, m.linkname, body))
        return out
    except (tarfile.TarError, EOFError, ValueError, UnicodeError) as e:
        return f"error ({type(e).__name__})"


def by_tarscan(data: bytes) -> list | str:
    """The same listing from TarReader; a member it leaves to tarfile is tarfile's to read."""
    try:
        reader, out = TarReader(io.BytesIO(data)), []
        for m in reader:
            body = reader.read_data(m) if m.type in HAS_DATA else None
            out.append((m.name, m.type, m.size, m.mode, m.linkname, body))
        return out
    except Unsupported:
        return by_tarfile(data)
    except Exception as e:  # noqa: BLE001 - any error counts as "raised"; tarfile's kinds differ
        return f"error ({type(e).__name__})"


def same(data: bytes) -> None:
    expected, got = by_tarfile(data), by_tarscan(data)
    if isinstance(expected, str) or isinstance(got, str):
        assert isinstance(expected, str) and isinstance(got, str), (expected, got)
    else:
        assert got == expected


names = st.one_of(st.text(alphabet="ab/._-é", min_size=1, max_size=12),
                  st.text(alphabet="abc/", min_size=90, max_size=300),
                  st.sampled_from(["dir/", "./x", "/abs", "a//b", ".wh.x", "d/.wh..wh..opq"]))
members = st.lists(st.tuples(names, st.sampled_from(sorted(KINDS)), st.binary(max_size=1100), names,
                             st.integers(0, 0o7777)), min_size=0, max_size=6)


def archive(items, fmt: str) -> bytes | None:
    out = io.BytesIO()
    try:
        with tarfile.open(fileobj=out, mode="w", format=FORMATS[fmt]) as tar:
            for name, kind, data, link, mode in items:
                info = tarfile.TarInfo(name)
                info.type, info.mode = KINDS[kind], mode
                info.linkname = link if kind in ("symlink", "hardlink") else ""
                info.size = len(data) if KINDS[kind] in HAS_DATA else 0
                tar.addfile(info, io.BytesIO(data) if info.size else None)
    except ValueError:  # a name ustar cannot hold
        return None
    return out.getvalue()


@SETTINGS
@given(items=members, fmt=st.sampled_from(sorted(FORMATS)))
def test_archives_tarfile_wrote_are_listed_as_tarfile_lists_them(items, fmt):
    data = archive(items, fmt)
    if data is not None:
        expected = by_tarfile(data)
        assert not isinstance(expected, str)
        assert by_tarscan(data) == expected


@SETTINGS
@given(items=members, fmt=st.sampled_from(sorted(FORMATS)), data=st.data())
def test_mutated_and_cut_archives_fail_or_list_as_tarfile_does(items, fmt, data):
    raw = archive(items, fmt)
    if not raw:
        return
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 6))):
        # header fields (names, octal numbers, checksum, type, magic, prefix) are where readers differ
        block = data.draw(st.integers(0, len(buf) // 512 - 1)) * 512
        buf[block + data.draw(st.integers(0, 511))] = data.draw(st.sampled_from(
            [0, 0x20, 0x30, 0x37, 0x38, 0x2f, ord("L"), ord("K"), ord("x"), ord("5"), 0x80, 0xff]))
    if data.draw(st.booleans()):
        buf = buf[:data.draw(st.integers(0, len(buf)))]
    same(bytes(buf))


def test_pax_records_that_override_size_path_and_link():
    items = [("p" * 150 + "/file", "file", b"x" * 700, "", 0o644), ("short", "symlink", b"", "t" * 200, 0o777),
             ("é/ü", "hardlink", b"", "p" * 150 + "/file", 0o644)]
    data = archive(items, "pax")
    listing = by_tarscan(data)
    assert [m[0] for m in listing] == ["p" * 150 + "/file", "short", "é/ü"]
    assert listing == by_tarfile(data)


def test_members_it_leaves_to_tarfile_say_so():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        tar.addfile(tarfile.TarInfo("a"))
    with pytest.raises(Unsupported):
        list(TarReader(io.BytesIO(out.getvalue())))


def test_every_fixture_layer_is_indexed_as_tarfile_indexes_it(registry, fixture_base, tmp_path):
    """The real layers (Debian, vLLM and AITER as Docker wrote them): fast and tarfile indexes,
    kept files included, are equal."""
    reg = Registry(registry)
    image = base_mod.resolve(reg, fixture_base, "linux/amd64")
    keep = ("usr/local/lib/python3*/dist-packages/*.dist-info/METADATA", "etc/os-release")
    for desc in image.layers:
        fast = _scan(reg, fixture_base.repository, desc, set(), LayerCache(tmp_path / "fast"), keep, fast=True)
        slow = _scan(reg, fixture_base.repository, desc, set(), LayerCache(tmp_path / "slow"), keep, fast=False)
        assert fast == slow and fast[0]["entries"]


def with_fields(raw: bytes, block: int, fields: dict) -> bytes:
    """Rewrite header fields ({offset: bytes}) of the header at `block` and fix its checksum, as
    a hostile (or merely unusual) writer would."""
    buf = bytearray(raw)
    at = block * 512
    for start, value in fields.items():
        buf[at + start:at + start + len(value)] = value
    buf[at + 148:at + 156] = b" " * 8
    buf[at + 148:at + 156] = b"%06o\0 " % sum(buf[at:at + 512])
    return bytes(buf)


TWO = archive([("first", "file", b"1" * 10, "", 0o644), ("second", "file", b"2" * 10, "", 0o600)], "gnu")
EMPTY_FIRST = archive([("first", "file", b"", "", 0o644), ("second", "file", b"2" * 10, "", 0o600)], "gnu")
HEADER_CASES = {  # (header block, {offset: bytes}) -> how many members tarfile lists, or "error"
    "negative base-256 mtime": ((0, {136: b"\xff" * 12}), 2),
    "base-256 mode": ((0, {100: b"\x80" + b"\0" * 6 + b"\x01"}), 2),
    "negative base-256 mode": ((0, {100: b"\xff" * 7 + b"\xfe"}), 2),
    "a type tarfile does not know, with data": ((0, {156: b"Z"}), 2),
    "base-256 size": ((0, {124: b"\x80" + b"\0" * 10 + b"\x0a"}), 2),
    "bad octal uid in the first header": ((0, {108: b"zz\0"}), "error"),
    "bad octal mtime in the second header": ((2, {136: b"9" * 11 + b"\0"}), 1),
    "old-style directory: no type, trailing slash": ((0, {0: b"first/\0", 156: b"\0"}), 2),
    "ustar prefix on a GNU header": ((0, {345: b"pre\0"}), 2),
}


@pytest.mark.parametrize("case", sorted(HEADER_CASES))
def test_header_fields_are_read_as_tarfile_reads_them(case):
    (block, fields), expected = HEADER_CASES[case]
    data = with_fields(EMPTY_FIRST if "directory" in case else TWO, block, fields)
    listing = by_tarfile(data)
    assert ("error" if isinstance(listing, str) else len(listing)) == expected
    same(data)


def test_a_pax_size_that_points_backwards_is_an_error_as_in_tarfile():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, extra in (("a", {"size": "-600"}), ("b", {})):
            info = tarfile.TarInfo(name)
            info.size, info.pax_headers = 700, extra
            tar.addfile(info, io.BytesIO(b"x" * 700))
    assert by_tarfile(out.getvalue()).startswith("error")
    same(out.getvalue())


def test_a_long_name_header_claiming_gigabytes_is_refused_without_allocating_them():
    """tarfile would try to read an 8 GiB long name into memory; container runtimes (Go's
    archive/tar) refuse such a header over 1 MiB, and so does tarscan, at once."""
    data = with_fields(archive([("x" * 150, "file", b"1", "", 0o644)], "gnu"), 0, {124: b"77777777777\0"})
    with pytest.raises(TarError, match="refuses any over 1048576"):
        list(TarReader(io.BytesIO(data)))


def test_a_member_whose_size_outruns_the_stream_is_cut_not_allocated():
    """A kept file (say a dist-info METADATA) whose size field claims 8 GiB in a gzip layer: a
    single read of that size makes the gzip reader allocate it up front."""
    import gzip
    import tracemalloc

    data = with_fields(archive([("f", "file", b"1" * 10, "", 0o644)], "gnu"), 0, {124: b"77777777777\0"})
    reader = TarReader(gzip.GzipFile(fileobj=io.BytesIO(gzip.compress(data))))
    member = next(iter(reader))
    assert member.size == 0o77777777777
    tracemalloc.start()
    try:
        with pytest.raises(TarError, match="unexpected end of data"):
            reader.read_data(member)
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()
    assert by_tarscan(data).startswith("error") and by_tarfile(data).startswith("error")


def test_a_layer_with_a_global_pax_header_is_read_by_tarfile_instead(registry, tmp_path):
    """scan_layer's fallback: tarscan leaves the layer to tarfile, which reads it whole (streamed
    a second time), so the index still lists every member."""
    import gzip

    from bakery.extract import scan_layer
    from bakery.refs import Descriptor

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global"}) as tar:
        for name, data in (("etc/a", b"alpha"), ("etc/b", b"beta")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = gzip.compress(out.getvalue(), mtime=0)
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    reg = Registry(registry)
    reg.upload_blob("test/pax-global", desc, lambda: iter([blob]))
    cache = LayerCache(tmp_path)
    index, found = scan_layer(reg, "test/pax-global", desc, {"etc/b"}, cache)
    assert sorted(index["entries"]) == ["etc/a", "etc/b"] and cache.downloads == 2
    assert cache.content(found["etc/b"]) == b"beta"
