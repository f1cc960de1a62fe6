"""Issue 40, parts 3 and 4: a full disk under the cache and out/ (a size-limited tmpfs, root only),
and two commands at once on one cache and one registry repository."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bakery.errors import foreign
from bakery.files import atomic_dir, atomic_file
from bakery.oci.refs import Reference
from bakery.oci.registry import Registry

from support import copy_project, invoke, last_line

CACHE = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
TEMPORARY = (".partial-", ".part-")  # what atomic_file/atomic_dir and the toolchain store write before the rename

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk needs root")


def one_clear_line(result) -> str:
    """The failure as the user sees it: one `error:` line, nothing after it, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0]), result.stderr  # not followed by a log's lines
    return errors[0]


# -- the small disk ---------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path, request):
    """mount(size_mib) -> a fresh tmpfs of that size; each is unmounted when the test ends."""
    mounted = []

    def mount(size_mib: int, name: str = "disk") -> Path:
        where = tmp_path / name
        where.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}M", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    def unmount():
        for where in reversed(mounted):
            subprocess.run(["umount", "-R", str(where)], check=True)

    request.addfinalizer(unmount)
    return mount


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of the disk's free space but `leave` bytes."""
    filler = disk / "filler"
    left = shutil.disk_usage(disk).free - leave
    with open(filler, "wb") as f:
        while left > 0:
            n = min(left, 1 << 20)
            f.write(b"\0" * n)
            left -= n
    return filler


# -- the clean build every failed one is compared with ---------------------------------------------

@dataclass(frozen=True)
class Clean:
    project: Path
    seed: Path  # the starting cache: this machine's kernels and proof verdicts
    cache: Path  # the seed after a clean build
    digest: str  # sha256:HEX of the image it built


def digest_of(result) -> str:
    return last_line(result).rpartition("@")[2]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, registry, fixture_base, fixture_lock) -> Clean:
    where = tmp_path_factory.mktemp("disk-clean")
    project = copy_project(where / "project", fixture_lock)
    # the machine's cache gets the kernels compiled and the overlays proven, once (warm: seconds)
    warm = invoke(project, "build", "--base", str(fixture_base))
    assert warm.returncode == 0, warm.stderr
    seed = where / "seed"
    for part in ("hip", "proofs"):
        shutil.copytree(CACHE / part, seed / part)
    cache = where / "cache"
    shutil.copytree(seed, cache)
    done = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/disk-full/clean:1",
                  "--out", str(where / "out"), env={"BAKERY_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    return Clean(project, seed, cache, digest_of(done))


def build(clean: Clean, base, cache: Path, out: Path, target: str) -> subprocess.CompletedProcess:
    return invoke(clean.project, "build", "--base", str(base), "--push", target, "--out", str(out),
                  env={"BAKERY_CACHE": str(cache)})



@pytest.fixture
def toolchain_files(toolchain):
    """The toolchain's files in this machine's cache (taken out once; a compile reads them)."""
    from bakery.inputs import hip

    from support import ROOT

    root = hip.toolchain_files(toolchain, hip.load(ROOT / "hip").toolchain, CACHE / "toolchains", log=lambda m: None)
    return root.path.parent.parent


def test_a_compile_on_a_full_disk_says_where_in_one_line(small_disk, clean, toolchain_files):
    """The compile's /out lies in the cache (hip/), watched to keep 1 GiB free: on a disk with less,
    one line naming the cache's folder, not the compiler's log about the sandbox's /out."""
    disk = small_disk(64)
    cache = disk / "cache"
    (cache / "toolchains").mkdir(parents=True)
    # the toolchain's files stay on the big disk, read-only: only the compile's outputs land here
    subprocess.run(["mount", "--bind", "-o", "ro", str(toolchain_files), str(cache / "toolchains")], check=True)
    result = invoke(clean.project, "compile", env={"BAKERY_CACHE": str(cache)})
    line = one_clear_line(result)
    assert result.returncode == 6 and f"{cache / 'hip'}" in line and "/out" not in line, line
    assert not (cache / "hip").exists() or not any((cache / "hip").iterdir())


def test_the_toolchain_store_on_a_full_disk_names_the_cache_not_its_work_folder(small_disk, clean, toolchain,
                                                                                tmp_path):
    """The toolchain's files need 1 GiB free besides themselves: refused before its layers are
    streamed, naming the store (toolchains/ on a small disk of its own here, the compile's outputs
    on the big one), not the work folder made and removed inside it."""
    cache = tmp_path / "cache"
    store = small_disk(64, "cache/toolchains")
    result = invoke(clean.project, "compile", env={"BAKERY_CACHE": str(cache)})
    line = one_clear_line(result)
    assert result.returncode == 6 and f"{cache / 'toolchains'}:" in line and ".partial" not in line, line
    assert "layer " not in result.stderr  # nothing streamed
    assert not list(store.iterdir())


@pytest.mark.parametrize("writer", ["atomic_file", "atomic_dir"])
def test_a_write_that_fills_the_disk_names_its_folder(small_disk, writer):
    """write() sets no file name on ENOSPC: the error the edge shows must still say which folder's
    disk is full (and, being no cache's, to write elsewhere)."""
    disk = small_disk(1)
    folder = disk / "out" / "blobs"
    with pytest.raises(OSError) as caught:
        if writer == "atomic_file":
            with atomic_file(folder / "big") as f:
                f.write(b"\0" * (2 << 20))
        else:
            with atomic_dir(folder / "tree") as staging:
                (staging / "big").write_bytes(b"\0" * (2 << 20))
    said = str(foreign(caught.value))
    assert f"the disk is full at {folder} " in said and "--out" in said, said
    assert [p.name for p in folder.iterdir()] == []  # nothing half-written stays


