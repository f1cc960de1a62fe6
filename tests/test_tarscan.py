"""bakery.oci.tarscan lists a tar stream as the container engine unpacks it (Go's archive/tar, run
here through tests/golister), or refuses it: wherever it lists, the listing is Go's, member for
member (names, types, sizes, modes, link names, bytes); wherever the two could read a header
differently it raises TarError, and the base is refused. The archives are written by tarfile
(ustar, GNU, pax), then mutated byte by byte and cut short; the real fixture layers are listed too.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from bakery.base import spec as base_mod
from bakery.base.layercache import LayerCache
from bakery.base.scan import scan_layer
from bakery.errors import IntegrityError
from bakery.oci.registry import Registry
from bakery.oci.tarscan import TarError, TarReader

SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
KINDS = {"file": tarfile.REGTYPE, "old-file": tarfile.AREGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE, "char": tarfile.CHRTYPE, "contiguous": tarfile.CONTTYPE}
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
HAS_DATA = (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE)
GOLISTER = Path(__file__).parent / "golister"


class Go:
    """One long-lived golister process: an archive in, Go's listing out."""

    def __init__(self, binary: Path):
        self.proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both piped
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def list(self, data: bytes) -> list | str:
        self.stdin.write(struct.pack(">Q", len(data)) + data)
        self.stdin.flush()
        said = json.loads(self.stdout.readline())
        if said["error"]:
            return "error: " + said["error"]
        out = []
        for name, kind, size, link, mode, sha in said["members"]:
            name = bytes.fromhex(name).decode("utf-8", "surrogateescape")
            out.append((name.rstrip("/") if kind == "5" else name, kind.encode(), size, mode,
                        bytes.fromhex(link).decode("utf-8", "surrogateescape"), sha or None))
        return out


@pytest.fixture(scope="module")
def go(tmp_path_factory):
    """Go's archive/tar, built here from tests/golister (golang-go: scripts/bootstrap.sh installs it)."""
    if shutil.which("go") is None:
        pytest.fail("no Go toolchain: the reference reader is Go's archive/tar; run scripts/bootstrap.sh "
                    "(apt-get install golang-go)")
    where = tmp_path_factory.mktemp("golister")
    env = {"GOCACHE": str(where / "cache"), "GOPATH": str(where / "gopath"), "GOFLAGS": "-mod=mod",
           "GO111MODULE": "on", "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(where), "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-o", str(where / "golister"), "."], cwd=GOLISTER, env=env, check=True)
    reader = Go(where / "golister")
    yield reader
    reader.stdin.close()
    reader.proc.wait()


def by_tarscan(data: bytes) -> list | str:
    """TarReader's listing in golister's terms ('\\0' is a regular file to Go), or its refusal."""
    try:
        reader, out = TarReader(io.BytesIO(data)), []
        for m in reader:
            body = reader.read_data(m) if m.type in HAS_DATA else None
            kind = b"0" if m.type == b"\0" else m.type
            out.append((m.name, kind, m.size, m.mode, m.linkname, hashlib.sha256(body).hexdigest()
                        if body is not None else None))
        return out
    except TarError as e:
        return f"refused: {e}"


def agree(go: Go, data: bytes, refusal_ok: bool = True) -> list | str:
    """Ours is Go's listing, or a refusal (where allowed); never a listing Go does not give."""
    ours, theirs = by_tarscan(data), go.list(data)
    if isinstance(ours, str):
        assert refusal_ok, (ours, theirs)
        return ours
    assert ours == theirs, (ours, theirs)
    return ours


names = st.one_of(st.text(alphabet="ab/._-é", min_size=1, max_size=12),
                  st.text(alphabet="abc/", min_size=90, max_size=300),
                  st.sampled_from(["dir/", "./x", "/abs", "a//b", ".wh.x", "d/.wh..wh..opq"]))
members = st.lists(st.tuples(names, st.sampled_from(sorted(KINDS)), st.binary(max_size=1100), names,
                             st.integers(0, 0o7777)), min_size=0, max_size=6)


def archive(items, fmt: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=FORMATS[fmt]) as tar:
        for name, kind, data, link, mode in items:
            info = tarfile.TarInfo(name)
            info.type, info.mode = KINDS[kind], mode
            info.linkname = link if kind in ("symlink", "hardlink") else ""
            info.size = len(data) if KINDS[kind] in HAS_DATA else 0
            tar.addfile(info, io.BytesIO(data) if info.size else None)
    return out.getvalue()


def archive_or_none(items, fmt: str) -> bytes | None:
    """archive(), or None where the format cannot hold a name (ustar's limits): drawn items may not fit."""
    try:
        return archive(items, fmt)
    except ValueError:
        return None


def ambiguous(items) -> bool:
    """An old-style ('\\0') entry whose name, or the part of a long one its header holds, may end
    in '/': a folder to tarfile, a file to Go, or the other way round. Refused."""
    return any(kind == "old-file" and "/" in name for name, kind, *_ in items)


@SETTINGS
@given(items=members, fmt=st.sampled_from(sorted(FORMATS)))
@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_archives_tarfile_wrote_are_listed_as_go_lists_them(go, items, fmt):
    data = archive_or_none(items, fmt)
    if data is not None:
        agree(go, data, refusal_ok=ambiguous(items))


@SETTINGS
@given(items=members, fmt=st.sampled_from(sorted(FORMATS)), data=st.data())
@pytest.mark.slow
def test_mutated_and_cut_archives_are_refused_or_listed_as_go_does(go, items, fmt, data):
    raw = archive_or_none(items, fmt)
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
    agree(go, bytes(buf))


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


@SETTINGS
@given(items=members, fmt=st.sampled_from(sorted(FORMATS)), data=st.data())
@pytest.mark.slow
def test_rewritten_header_fields_with_good_checksums_are_refused_or_listed_as_go_does(go, items, fmt, data):
    """What a hostile writer does: any field rewritten and the checksum made right again."""
    raw = archive_or_none(items, fmt)
    if not raw:
        return
    block = data.draw(st.integers(0, len(raw) // 512 - 1))
    if not raw[block * 512:block * 512 + 512].strip(b"\0"):
        return
    offset = data.draw(st.sampled_from([0, 99, 100, 108, 116, 124, 135, 136, 156, 157, 257, 263, 265, 329, 337, 345,
                                        500, 508]))
    value = data.draw(st.sampled_from([b"\0", b" ", b"/", b"7", b"9", b"\x80", b"\xff", b"x/", b"ustar\x0000",
                                       b"ustar  \x00", b"\0" * 8, b"tar\0", b"L", b"K", b"x", b"g", b"S", b"5"]))
    agree(go, with_fields(raw, block, {offset: value}))


@pytest.mark.slow
def test_a_base_256_number_past_int64_is_refused_as_go_does(go):
    """Found by the test above on a CI run: a size field 0x80 + its old octal digits reads as a
    number near 2**85, which Go's int64 cannot hold (invalid header) and tarscan listed."""
    raw = archive([("_", "char", b"", "_", 0)], "gnu")
    huge = with_fields(raw, 0, {124: b"\x80"})
    said, ours = go.list(huge), agree(go, huge)
    assert isinstance(said, str) and said.startswith("error:")
    assert isinstance(ours, str) and ours.startswith("refused: a base-256 number")
    small = with_fields(raw, 0, {124: b"\x80" + b"\0" * 10 + b"\x05"})  # base-256 five: both read it
    assert agree(go, small)[0][2] == 5


def record(key: str, value: str) -> bytes:
    """One pax record, its length counting itself."""
    body = f" {key}={value}\n".encode()
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def pax_member(*headers: bytes, name: str = "f", data: bytes = b"0123456789") -> bytes:
    """A pax header per `headers` (each its records exactly), then a regular member `name`."""
    def header(name: str, kind: bytes, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.type, info.size, info.mode = kind, size, 0o644
        return info.tobuf(tarfile.USTAR_FORMAT)

    pad = lambda b: b + b"\0" * (-len(b) % 512)  # noqa: E731 (one line, used below)
    out = b"".join(header("PaxHeaders/f", b"x", len(r)) + pad(r) for r in headers)
    return out + header(name, b"0", len(data)) + pad(data) + b"\0" * 1024


@pytest.mark.slow
def test_pax_records_that_override_size_path_and_link(go):
    items = [("p" * 150 + "/file", "file", b"x" * 700, "", 0o644), ("short", "symlink", b"", "t" * 200, 0o777),
             ("é/ü", "hardlink", b"", "p" * 150 + "/file", 0o644)]
    listing = agree(go, archive(items, "pax"), refusal_ok=False)
    assert [m[0] for m in listing] == ["p" * 150 + "/file", "short", "é/ü"]


# the issue's two findings, and their kin: Go reads on where tarfile (our old reader) did not, or
# the other way round; either way the base could hide an entry or show one never unpacked
V7 = with_fields(archive([("first", "file", b"1" * 10, "", 0o644), ("second", "file", b"2" * 10, "", 0o600)],
                         "ustar"), 0, {257: b"\0" * 8, 329: b"garbage!"})
EMPTY_SIZE = pax_member(b"8 size=\n", data=b"x" * 600)
assert record("size", "") == b"8 size=\n"
HIDDEN = {
    "a V7 header with garbage in the device fields (tarfile ended the listing there)": V7,
    "an empty pax size= (tarfile read the file's data as headers; Go keeps the header's size)": EMPTY_SIZE,
    "an empty pax path= (tarfile empties the name; Go keeps the header's)": pax_member(record("path", "")),
    "two pax headers for one member (Go takes the second's records, tarfile merges the first's last)":
        pax_member(record("path", "one"), record("path", "two")),
    "a pax global header (Go does not apply it; tarfile does)":
        archive([("a", "file", b"1", "", 0o644)], "pax").replace(b"0000000\x00", b"0000000\x00", 1),
    "a pax size that is not digits": pax_member(record("size", "+10")),
}
def gnu_long(kind: bytes, payload: bytes, name: str = "usr/lib/python3/dist-packages/evil.pth") -> bytes:
    """A GNU long-name ('L') or long-link ('K') header carrying `payload`, then a symlink `name`."""
    def header(name: str, kind: bytes, size: int, link: str = "") -> bytes:
        info = tarfile.TarInfo(name)
        info.type, info.size, info.mode, info.linkname = kind, size, 0o644, link
        return info.tobuf(tarfile.GNU_FORMAT)

    pad = lambda b: b + b"\0" * (-len(b) % 512)  # noqa: E731 (one line, used below)
    return header("././@LongLink", kind, len(payload)) + pad(payload) + header(name, b"2", 0, "/tmp/evil") + \
        b"\0" * 1024


HIDDEN.update({
    "an empty GNU long name (Go keeps the header's name; tarfile took the empty one)": gnu_long(b"L", b""),
    "a GNU long name that starts with NUL": gnu_long(b"L", b"\0hidden"),
    "an empty GNU long link (Go keeps the header's link)": gnu_long(b"K", b""),
})
def base256_checksum(raw: bytes) -> bytes:
    """The first header's checksum written in base-256 (right value, a form Go does not read)."""
    return raw[:148] + b"\x80" + (256 + sum(raw[:512]) - sum(raw[148:156])).to_bytes(7, "big") + raw[156:]


GO_REFUSES = {  # tarfile (or our reader) listed these; the engine cannot unpack them
    "a base-256 checksum": base256_checksum(archive([("a.txt", "file", b"1", "", 0o644)], "ustar")),
    "a NUL inside a number field": with_fields(archive([("a", "file", b"1", "", 0o644)], "ustar"), 0,
                                               {124: b"0000\x0000001\0"}),
}


@pytest.mark.slow
def test_each_header_the_issue_found_is_read_by_go(go):
    """The control: the engine reads each of these archives without an error (so a layer holding
    one unpacks, and whatever we would read differently is in the image)."""
    for case, data in HIDDEN.items():
        if "global" in case:
            continue  # built below, by tarfile
        assert isinstance(go.list(data), list), case
    for case, data in GO_REFUSES.items():
        assert go.list(data).startswith("error"), case


@pytest.mark.parametrize("case", sorted(HIDDEN) + sorted(GO_REFUSES))
@pytest.mark.slow
def test_each_header_the_issue_found_is_refused(go, case):
    data = HIDDEN.get(case) or GO_REFUSES[case]
    if "global" in case:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"path": "g"}) as tar:
            info = tarfile.TarInfo("a")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
        data = out.getvalue()
        assert [m[0] for m in go.list(data)] == ["g", "a"]  # Go: the global header is a member of its own
    with pytest.raises(TarError):
        list(TarReader(io.BytesIO(data)))


@pytest.mark.slow
def test_every_fixture_layer_is_listed_as_go_lists_it(go, registry, fixture_base, tmp_path):
    """The real layers (Debian, vLLM and AITER as Docker wrote them): none refused, each Go's listing."""
    import gzip

    reg = Registry(registry)
    image = base_mod.resolve(reg, fixture_base, "linux/amd64")
    for desc in image.layers:
        data = gzip.decompress(b"".join(reg.stream_blob(fixture_base.repository, desc, label="layer")))
        listing = agree(go, data, refusal_ok=False)
        assert listing


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


@pytest.mark.slow
def test_a_layer_go_and_we_read_differently_refuses_the_base(registry, tmp_path):
    """scan_layer, as the build calls it: the V7 layer above is an integrity error (exit 5), its
    digest checked first; no listing of ours is kept."""
    import gzip

    from bakery.oci.refs import Descriptor

    blob = gzip.compress(V7, mtime=0)
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    reg = Registry(registry)
    reg.upload_blob("test/v7-layer", desc, lambda: iter([blob]))
    cache = LayerCache(tmp_path)
    with pytest.raises(IntegrityError, match="without ustar or GNU magic") as refused:
        scan_layer(reg, "test/v7-layer", desc, set(), cache)
    assert refused.value.exit_code == 5


@given(st.binary(min_size=512, max_size=512))
@settings(max_examples=300)
def test_the_checksum_sum_in_c_is_the_sum_of_the_bytes(block):
    """The header checksum's byte sum is taken from Adler-32 (exact for 256-byte halves)."""
    from bakery.oci.tarscan import _byte_sum

    assert _byte_sum(block) == sum(block)


def test_the_checksum_sum_in_c_holds_at_the_extremes():
    from bakery.oci.tarscan import _byte_sum

    for block in (bytes(512), b"\xff" * 512, b"\xff" * 256 + bytes(256), bytes(256) + b"\xff" * 256):
        assert _byte_sum(block) == sum(block)


@pytest.mark.parametrize("xattr", ["trusted.overlay.opaque", "user.overlay.opaque", "trusted.overlay.redirect"])
def test_an_overlayfs_attribute_in_a_layer_is_refused(xattr):
    """Found by the attacker review: a folder carrying trusted.overlay.opaque in a pax record is one
    overlay2 unpacks and then hides the layers below (it sets the attribute it reads), while our
    readers, and an engine unpacking into a plain folder, keep them. No builder writes one."""
    def layer(records: dict) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
            info = tarfile.TarInfo("etc")
            info.type, info.pax_headers = tarfile.DIRTYPE, records
            t.addfile(info)
        return out.getvalue()

    with pytest.raises(TarError, match="an overlayfs attribute"):
        list(TarReader(io.BytesIO(layer({f"SCHILY.xattr.{xattr}": "y"}))))
    assert [m.name for m in TarReader(io.BytesIO(layer({"SCHILY.xattr.user.note": "y"})))] == ["etc"]  # the control
