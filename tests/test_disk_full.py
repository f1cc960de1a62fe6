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


