"""The toolchain's files, taken out of its image's layers (base/extract.py), are what Docker's own
container of that image holds, for the stand-in toolchain (crafted layers against three engines are
tests/test_engines.py's); the folder is made
below open folders, never through a link; the disk it needs is said before and guarded while it is
written; and the compile over it needs no engine.

The reference is `docker export` of a container of the same image (Debian's Docker 20.10), read file
by file."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from bakery.base import extract, spec as base_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.base.layercache import LayerCache
from bakery.errors import EnvironmentProblem, IntegrityError
from bakery.inputs import hip
from bakery.oci.refs import Reference
from bakery.oci.registry import Registry
from support import ROOT, docker_export, invoke, push_image, tree_of

ENGINES_OWN = {"dev", "proc", "sys", ".dockerenv", "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/mtab"}


def tar(*members) -> bytes:
    """A layer: (name, kind, data or link target, mode) each; kind file, dir, symlink or hardlink."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, kind, what, mode in members:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                info.size = len(what)
                t.addfile(info, io.BytesIO(what))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}[kind]
            info.linkname = what if kind in ("symlink", "hardlink") else ""
            t.addfile(info)
    return out.getvalue()


EVERYTHING = extract.Selection()  # no path left out


def root_of(ref, tmp_path, selection=EVERYTHING) -> extract.Root:
    registry = Registry(ref.registry)
    fs = BaseFilesystem(registry, base_mod.resolve(registry, ref, "linux/amd64"), LayerCache(tmp_path / "cache"))
    return extract.toolchain_root(fs, selection, tmp_path / "toolchains", log=lambda m: None)


@pytest.fixture(scope="module")
def compiled_without_engine(toolchain, tmp_path_factory):
    """`invoke compile` from an empty cache, with no Docker engine to ask: the toolchain's files taken
    out of its image, then hip/ compiled over them; (the run, its cache). The folder it took out is
    the one the container is compared with and the one the disk's exact figure is checked against
    (each test took out its own, the same files of the same image: a minute and 1.6 GiB each)."""
    where = tmp_path_factory.mktemp("no-engine")
    result = invoke(ROOT, "compile", "--toolchain", toolchain,
                    env={"BAKERY_CACHE": str(where / "cache"), "DOCKER_HOST": f"unix://{where}/no-engine.sock"})
    yield result, where / "cache"
    shutil.rmtree(where, ignore_errors=True)


def taken_out(ref, cache: Path, selection) -> extract.Root:
    """The folder `invoke compile` made in `cache` for this image and selection (taken out anew if absent)."""
    registry = Registry(ref.registry)
    fs = BaseFilesystem(registry, base_mod.resolve(registry, ref, "linux/amd64"), LayerCache(cache))
    return extract.toolchain_root(fs, selection, cache / "toolchains", log=lambda m: None)


def comparable(view: dict) -> dict:
    """A tree without what only one side makes: the engine's own files (and the /etc it makes for
    them in an image without one), our mount points."""
    drop = ENGINES_OWN | set(extract.MOUNT_POINTS)
    kept = {p: v for p, v in view.items() if p.split("/")[0] not in drop and p not in drop}
    if "etc" in kept and not any(p.startswith("etc/") for p in kept):
        del kept["etc"]
    return kept


def busybox_layer() -> bytes:
    """A layer with a shell (the fixture rootfs's /bin/sh and what it loads): `docker create` needs
    a command, and a container needs nothing more to be exported."""
    return tar(("bin", "dir", b"", 0o755), ("bin/true", "file", b"#!/bin/sh\n", 0o755))


def test_the_stand_in_toolchain_is_what_its_container_holds(toolchain, compiled_without_engine):
    """The whole stand-in (clang, the device libraries, torch): every file, link and folder the
    selection takes is in our folder (the one a compile took out) with the bytes Docker's container
    has, and nothing else is."""
    result, cache = compiled_without_engine
    assert result.returncode == 0, result.stderr
    selection = hip.load(ROOT / "hip").toolchain
    made = taken_out(Reference.parse(toolchain), cache, selection)
    takes = selection.matcher()
    theirs = {p: v for p, v in docker_export(toolchain).items() if takes(p)}
    assert comparable(tree_of(made.path)) == comparable(theirs)
    assert made.env["BAKERY_CXX"] == "clang++-19" and made.files > 10_000


def test_an_image_of_a_link_out_writes_nothing_outside_the_folder(tmp_path):
    """Were the layer checks ever to let a write through a link pass, the folder is still made below
    open folders (O_NOFOLLOW): the link is refused as a folder, and nothing is written where it
    points."""
    outside = tmp_path / "outside"
    outside.mkdir()
    index = {"entries": {"usr": ["symlink", 0, 0o777, str(outside)], "usr/evil": ["file", 4, 0o644, ""]},
             "whiteouts": [], "opaque": []}
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "b.r").write_bytes(b"evil")
    with pytest.raises(IntegrityError, match="a folder above it is not a folder"):
        extract.apply_layers([index], [{"usr/evil": "b.r"}], extract.Selection(), tmp_path / "root", blobs)
    assert list(outside.iterdir()) == []


def test_exclusions_leave_out_what_they_match_and_all_under_it():
    takes = extract.Selection(("opt/rocm*/lib/rocblas/library", "usr/share/doc")).matcher()
    assert not takes("opt/rocm-7.0.2/lib/rocblas/library/TensileLibrary.dat")
    assert not takes("opt/rocm/lib/rocblas/library") and not takes("usr/share/doc")
    assert takes("opt/rocm/lib/rocblas/librarian") and takes("opt/rocm/lib/librocblas.so.4")
    assert takes("usr/share/docs") and takes("usr/share/doc.txt")


def test_the_disk_it_needs_is_said_then_guarded(registry, toolchain, compiled_without_engine, tmp_path):
    """Before any layer is read: an estimate from the compressed size. Once the layers are indexed:
    exactly the selection's bytes, what a compile's taking out of the same image took. A disk too
    small: one error line (exit 6), and nothing half made left in the cache."""
    ref = Reference.parse(toolchain)
    reg = Registry(registry)
    cache = LayerCache(tmp_path / "cache")
    fs = BaseFilesystem(reg, base_mod.resolve(reg, ref, "linux/amd64"), cache)
    selection = hip.load(ROOT / "hip").toolchain
    needed, how = extract.space_needed(fs, selection, tmp_path / "toolchains")
    assert how.startswith("an estimate") and needed == extract.EXPANSION * sum(d.size for d in fs.image.layers)
    fs.prefetch()
    for desc in fs.image.layers:
        fs._index(desc, set())
    needed, how = extract.space_needed(fs, selection, tmp_path / "toolchains")
    result, compiled = compiled_without_engine
    assert result.returncode == 0, result.stderr
    made = extract.toolchain_root(fs, selection, compiled / "toolchains", log=lambda m: None)  # the compile's
    assert how.startswith("exact") and made.size <= needed < made.size * 1.05  # the same bytes twice: one inode
    assert extract.space_needed(fs, selection, compiled / "toolchains") == (0, "already taken out")
    # a filesystem of 1.5 GiB (1 GiB of it kept free): the 1.6 GiB stand-in does not fit
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536m", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(EnvironmentProblem, match=r"the toolchain's files do not fit in .*GiB free"):
            extract.toolchain_root(fs, selection, small / "toolchains", log=lambda m: None)
        assert [p.name for p in (small / "toolchains").iterdir()] == []  # the partial folder is gone
        result = invoke(ROOT, "disk", "--toolchain", toolchain, env={"BAKERY_CACHE": str(small)})
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert result.returncode == 6 and len(errors) == 1 and "GiB free" in errors[0], result.stderr
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_a_compile_needs_no_engine(compiled_without_engine):
    """Taking the files out and compiling over them: no Docker engine is asked anything."""
    result, _ = compiled_without_engine
    assert result.returncode == 0, result.stderr
    assert "toolchain's files:" in result.stderr and "kernels compiled" in result.stderr


@pytest.mark.parametrize("case, layers, said", [
    ("a write through a link a lower layer made", [tar(("a", "symlink", "b", 0o777), ("b", "dir", b"", 0o755)),
                                                   tar(("a/x", "file", b"x", 0o644))], "writes under /a"),
    ("a write into a lower file", [tar(("f", "file", b"f", 0o644)), tar(("f/x", "file", b"x", 0o644))],
     "writes under /f"),
    ("a whiteout under a link the layer replaces", [tar(("a", "symlink", "b", 0o777), ("b", "dir", b"", 0o755),
                                                        ("b/x", "file", b"x", 0o644)),
                                                    tar(("a", "dir", b"", 0o755), ("a/.wh.x", "file", b"", 0o644))],
     "writes under /a"),
])
def test_what_lower_layers_make_ambiguous_is_refused_naming_the_layer(case, layers, said, registry, tmp_path):
    """containerd follows a lower layer's link inside the root; Docker's overlay2 puts a folder over
    it (or fails on a file): refused, the layer and the path named, nothing made."""
    ref = push_image(registry, f"test/ambiguous-{hashlib.sha256(case.encode()).hexdigest()[:12]}", layers)
    with pytest.raises(IntegrityError, match=rf"layer 2 of 2 \(sha256:[0-9a-f]{{64}}\) {said}"):
        root_of(ref, tmp_path)
    assert [p.name for p in (tmp_path / "toolchains").iterdir()] == []


def test_an_image_env_no_process_could_be_given_is_refused():
    assert extract.image_env({"config": {"Env": ["A=1", "PATH=/x"]}}) == {"A": "1", "PATH": "/x"}
    assert extract.image_env({}) == {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for env in (["=x"], ["A"], ["A=\0"], "A=1", ["A=" + "x" * extract.ENV_LIMIT]):
        with pytest.raises(IntegrityError, match="Env"):
            extract.image_env({"config": {"Env": env}})
