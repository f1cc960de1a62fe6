"""What one layer may hold, as a layer's pass reads it (base/scan.py): nothing the engines would unpack
differently, nothing no image builder writes. Each refused case is refused with one line naming the
layer and the entry; the accepted ones are what Docker's and BuildKit's diffs write. Which refused
cases Docker, containerd and podman unpack apart, all fail on, or read alike (refused then as what
no builder writes), seen by pulling each through the registry: tests/test_engines.py. Pure: a layer
in memory, served to the real scanner."""

from __future__ import annotations

import io
import tarfile

import pytest

from bakery.base.layercache import LayerCache
from bakery.base.scan import clean, scan_layer
from bakery.errors import IntegrityError
from bakery.oci.refs import Descriptor


def layer(*members) -> bytes:
    """(name, kind, data or link) each: file, dir, symlink, hardlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, what in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(what)
                t.addfile(info, io.BytesIO(what))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = what if kind != "dir" else ""
            t.addfile(info)
    return out.getvalue()


class Served:
    def __init__(self, blob: bytes):
        self.blob = blob

    def stream_blob(self, repo, desc, label=None):
        from bakery.oci.registry import check_digest

        yield self.blob
        check_digest(desc, desc.digest.hex, len(self.blob), "test")


def scan(raw: bytes, tmp_path):
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar", raw)
    return scan_layer(Served(raw), "test/r", desc, set(), LayerCache(tmp_path / "cache")), desc


# {case: (the layer's members: name, kind, bytes or link target[, mode]; what the refusal says)}
REFUSED: dict[str, tuple[list[tuple], str]] = {
    "a name twice": ([("a", "file", b"1"), ("a", "file", b"2")], "names 'a' twice"),
    "a name twice, spelled two ways": ([("a/b", "file", b"1"), ("/a//b", "file", b"2")], "names 'a/b' twice"),
    "a folder the layer then makes a file": ([("d", "dir", ""), ("d/x", "file", b"x"), ("d", "file", b"f")],
                                             "names 'd' twice"),
    "a write through a link the layer made": ([("l", "symlink", "/etc"), ("l/passwd", "file", b"x")],
                                              "writes under 'l', which it gives as symlink"),
    "a write under a file the layer made": ([("f", "file", b"x"), ("f/y", "file", b"y")],
                                            "writes under 'f', which it gives as file"),
    "a file before the link over its folder": ([("l/x", "file", b"x"), ("l", "symlink", "/etc")],
                                               "writes under 'l', which it gives as symlink"),
    "a whiteout of what the layer gives": ([(".wh.a", "file", b""), ("a", "file", b"new")], "names 'a' twice"),
    "a whiteout of a folder it fills": ([("d/.wh.x", "file", b""), ("d/x/y", "file", b"y")],
                                        "whites out 'd/x' and gives what lies under it"),
    "an opaque marker in what it gives as a file": ([("d", "file", b"f"), ("d/.wh..wh..opq", "file", b"")],
                                                    "writes under 'd'"),
    "a hard link to what the layer does not hold": ([("h", "hardlink", "usr/bin/python3")],
                                                    "is a hard link to 'usr/bin/python3', which is not a file"),
    "a hard link to a name given after it": ([("h", "hardlink", "f"), ("f", "file", b"x")],
                                             "is a hard link to 'f', which is not a file this layer gave before"),
    "a hard link whose target is then replaced": ([("f", "file", b"1"), ("h", "hardlink", "f"), ("f", "file", b"2")],
                                                  "names 'f' twice"),
    "a hard link to a folder": ([("d", "dir", ""), ("h", "hardlink", "d")], "is a hard link to 'd'"),
    "an AUFS name": ([(".wh..wh.aufs", "file", b"")], "an AUFS metadata name"),
    "under an AUFS folder": ([(".wh..wh.plnk/1", "file", b"")], "under an AUFS metadata folder"),
    "an opaque marker on the root": ([("new", "file", b"n"), (".wh..wh..opq", "file", b"")],
                                     "an opaque marker on the root itself"),
    "a name out of the root": ([("../../etc/passwd", "file", b"x")], "climbs out of the root"),
    "a hard link out of the root": ([("h", "hardlink", "../x")], "climbs out of the root"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_engines_would_unpack_apart_is_refused_naming_layer_and_entry(case, tmp_path):
    members, said = REFUSED[case]
    with pytest.raises(IntegrityError) as refused:
        scan(layer(*members), tmp_path)
    message = str(refused.value)
    assert said in message and "no image builder writes it" in message, message
    assert Descriptor.of("x", layer(*members)).digest.hex in message and "\n" not in message


def test_what_image_builders_write_is_read_as_one_state(tmp_path):
    """Docker's and BuildKit's diffs: './' names, parents after their children, an opaque folder with
    what the layer puts back, a whiteout of a lower file, hard links to files given before."""
    (index, found, _), _ = scan(layer(("./", "dir", ""), ("./usr/lib/x", "file", b"x"), ("./usr", "dir", ""),
                                      ("./usr/lib", "dir", ""), ("etc", "dir", ""), ("etc/.wh..wh..opq", "file", b""),
                                      ("etc/hosts", "file", b"h"), ("var/.wh.old", "file", b""),
                                      ("bin/a", "file", b"a"), ("bin/b", "hardlink", "bin/a"),
                                      ("bin/c", "hardlink", "./bin/b"), ("opt/l", "symlink", "/nowhere")), tmp_path)
    assert set(index["entries"]) == {"usr", "usr/lib", "usr/lib/x", "etc", "etc/hosts", "bin/a", "bin/b", "bin/c",
                                     "opt/l"}
    assert index["opaque"] == ["etc"] and index["whiteouts"] == ["var/old"]
    assert index["entries"]["bin/c"][3] == "bin/a"  # a link to a link: the same inode, named by its file


@pytest.mark.parametrize("name, cleaned", [("a", "a"), ("./a/", "a"), ("/a//b/./c", "a/b/c"), ("a/b/../c", "a/c"),
                                           ("./", ""), ("a/..", "")])
def test_names_are_cleaned_as_go_cleans_them(name, cleaned):
    assert clean(name) == cleaned


@pytest.mark.parametrize("members, said", [
    ([(".wh...", "file", b"")], "a whiteout of no name"),
    ([("a/.wh..", "file", b"")], "a whiteout of no name"),
    ([("a/" * 300 + "x", "file", b"")], "past what a Linux path may be"),
    ([("n" * 300, "file", b"")], "past what a Linux path may be"),
])
def test_names_no_engine_unpacks_are_refused_before_any_work(members, said, tmp_path):
    """A whiteout of '..' would remove the folder above the one being made; a name of thousands of
    parts would cost its square in the checks that follow."""
    with pytest.raises(IntegrityError, match=said):
        scan(layer(*members), tmp_path)


def test_a_chain_of_hard_links_names_the_file_itself(tmp_path):
    (index, _, _), _ = scan(layer(("f", "file", b"x"), ("a", "hardlink", "f"), ("b", "hardlink", "a"),
                                  ("c", "hardlink", "b")), tmp_path)
    assert [index["entries"][n][3] for n in "abc"] == ["f", "f", "f"]


@pytest.mark.parametrize("limit, value, members", [
    ("ENTRIES_LIMIT", 3, [("a", "file", b""), ("b", "file", b""), (".wh.c", "file", b""), ("d", "dir", "")]),
    ("NAMES_LIMIT", 100, [("n" * 60, "file", b""), ("l", "symlink", "t" * 60)]),
])
def test_a_layer_past_what_an_index_may_hold_is_refused(limit, value, members, tmp_path, monkeypatch):
    """Tens of millions of tiny entries compress to almost nothing and would exhaust memory: a layer
    is refused past its entry count or its names' size (small limits here; bench/bench_bounds.py
    measures the real ones)."""
    import bakery.base.scan as scan_mod

    monkeypatch.setattr(scan_mod, limit, value)
    with pytest.raises(IntegrityError, match="past what one layer's index may hold") as refused:
        scan(layer(*members), tmp_path)
    assert "\n" not in str(refused.value)
    monkeypatch.setattr(scan_mod, limit, value * 2)
    scan(layer(*members), tmp_path)  # the control: within the limit it is read


def test_a_layer_keeping_more_than_its_pass_may_stage_is_refused_before_reading_past_it(tmp_path, monkeypatch):
    """Thousands of 256 MiB copyright files of zeros compress to almost nothing and would fill the
    cache's disk to its reserve (third attacker review of issue 50 item 5): a layer whose kept files
    add up past KEPT_BYTES_LIMIT is refused as it reaches it (small here), none of them in the cache."""
    import bakery.base.scan as scan_mod

    members = [(f"usr/share/doc/p{i}/copyright", "file", bytes([i]) * 40) for i in range(4)]
    raw = layer(*members)
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar", raw)
    cache = LayerCache(tmp_path / "cache")
    monkeypatch.setattr(scan_mod, "KEPT_BYTES_LIMIT", 100, raising=False)  # without the limit: not refused
    with pytest.raises(IntegrityError, match="the files it keeps .* add up to more than 0 MiB, past what one layer's "
                                             "pass may stage; the base is refused"):
        scan_layer(Served(raw), "test/r", desc, set(), cache, keep=("usr/share/doc/*/copyright",))
    assert not [f for f in (tmp_path / "cache" / "files").iterdir() if not f.name.startswith(".")]
    monkeypatch.setattr(scan_mod, "KEPT_BYTES_LIMIT", 160)  # the control: within it, all four are kept
    scanned = scan_layer(Served(raw), "test/r", desc, set(), cache, keep=("usr/share/doc/*/copyright",))
    assert len(scanned.found) == 4


# -- kept files reach the cache only once the layer's digest holds (issue 50 item 5) --------------------

class Honest(Served):
    """Serves its bytes and checks them against the descriptor, as the registry client does."""

    def stream_blob(self, repo, desc, label=None):
        import hashlib

        from bakery.oci.registry import check_digest

        yield self.blob
        check_digest(desc, hashlib.sha256(self.blob).hexdigest(), len(self.blob), "test")


KEPT = "usr/lib/python3/dist-packages/x-1.dist-info/METADATA"


def test_a_kept_file_of_a_layer_whose_digest_fails_leaves_nothing(tmp_path):
    """Found by the attacker review: kept files (up to 256 MiB each) were written into the cache as
    the layer streamed, before its digest was checked: 0.25 MiB served left 256 MiB on disk."""
    import hashlib
    import os

    raw = layer((KEPT, "file", b"Name: x\n"))
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar", raw)
    cache = LayerCache(tmp_path / "cache")
    with pytest.raises(IntegrityError, match="does not match its descriptor"):
        scan_layer(Honest(raw.replace(b"Name: x", b"Name: y")), "test/r", desc, {KEPT}, cache)
    assert os.listdir(cache.root / "files") == []  # neither the file nor its staging folder
    scanned = scan_layer(Honest(raw), "test/r", desc, {KEPT}, cache)  # the control
    assert os.listdir(cache.root / "files") == [hashlib.sha256(b"Name: x\n").hexdigest()] == list(scanned.found.values())


def test_a_killed_scans_staged_files_are_removed_and_room_is_kept(tmp_path, monkeypatch):
    import os
    import time

    import bakery.base.layercache as layercache

    raw = layer((KEPT, "file", b"Name: x\n"))
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar", raw)
    cache = LayerCache(tmp_path / "cache")
    orphan = cache.root / "files" / ".kept.partial-killed"  # what a killed scan left: held by no process
    orphan.mkdir()
    (orphan / ("0" * 64)).write_bytes(b"x" * 4096)
    os.utime(orphan, (time.time() - 3600,) * 2)
    scan_layer(Honest(raw), "test/r", desc, {KEPT}, cache)
    assert not orphan.exists()
    monkeypatch.setattr(layercache, "RESERVE", 1 << 60)  # no disk has that much free
    with pytest.raises(layercache.EnvironmentProblem, match="must stay free"):
        scan_layer(Honest(layer((KEPT, "file", b"Name: z\n"))), "test/r",
                   Descriptor.of("application/vnd.oci.image.layer.v1.tar", layer((KEPT, "file", b"Name: z\n"))),
                   {KEPT}, cache)
    assert sorted(os.listdir(cache.root / "files")) == [__import__("hashlib").sha256(b"Name: x\n").hexdigest()]
