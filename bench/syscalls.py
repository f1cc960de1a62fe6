"""Which system calls the sandboxed code makes: the measurement behind bakery/sandbox.py's ALLOWED.

Runs the given pytest selection (honest proofs, compiles and rebuilds: not the hostile tests,
whose refused calls are the point) under `strace -f`, and counts the calls of every process that
runs under the sandbox's seccomp filter: the one that installs it (bubblewrap's child, just before
it runs the code) and all it starts after. Prints each call's name and count, and the ones the
filter would refuse.

    .venv/bin/python bench/syscalls.py tests/test_overlay_proofs.py tests/test_hip.py

As root (strace follows the sandbox's uid change). Caches that would skip the work (verdicts,
compile outputs) are left out: the run is cold for them.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LINE = re.compile(r"^(\d+) +(?:<\.\.\. (\w+) resumed>|(\w+)\()(.*)$")
FORKS = {"clone", "clone3", "fork", "vfork"}
SKIPPED_CACHES = {"proofs", "hip"}  # what makes a warm run skip the work measured


def filtered_calls(trace: Path) -> collections.Counter:
    """{name: count} of the calls made by processes under a seccomp filter, from `strace -f` output
    (a call another process interrupts is written in two lines: its start, then its resumption)."""
    filtered: set[int] = set()
    pending: dict[int, str] = {}  # pid: the start of its unfinished call
    counts: collections.Counter[str] = collections.Counter()
    with open(trace, errors="replace") as lines:
        for line in lines:
            m = LINE.match(line.rstrip())
            if not m:
                continue
            pid, resumed, called, rest = int(m[1]), m[2], m[3], m[4]
            if called and pid in filtered:  # counted once, where it starts
                counts[called] += 1
            if rest.endswith("<unfinished ...>"):
                pending[pid] = rest
                continue
            name, whole = resumed or called, (pending.pop(pid, "") if resumed else "") + rest
            if name in ("seccomp", "prctl") and ("SECCOMP_SET_MODE_FILTER" in whole or "PR_SET_SECCOMP" in whole) \
                    and whole.endswith("= 0"):
                filtered.add(pid)
            elif name in FORKS and pid in filtered:
                child = re.search(r"= (\d+)$", whole)
                if child:
                    filtered.add(int(child[1]))
    return counts


def cold_cache(where: Path) -> Path:
    src = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    where.mkdir()
    for part in src.iterdir() if src.is_dir() else []:
        if part.name not in SKIPPED_CACHES:
            (where / part.name).symlink_to(part)
    return where


def main(selection: list[str]) -> None:
    from bakery import sandbox

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace"
        env = {**os.environ, "BAKERY_CACHE": str(cold_cache(Path(tmp) / "cache"))}
        done = subprocess.run(["strace", "-f", "-qq", "-s", "0", "-o", str(trace), sys.executable, "-m", "pytest",
                               "-q", "-p", "no:cacheprovider", *selection], env=env, cwd=ROOT)
        counts = filtered_calls(trace)
    allowed = set(sandbox.ALLOWED) | {"clone", "socket", "socketpair"}  # the last three checked by their arguments
    for name, n in sorted(counts.items()):
        print(f"{name:24} {n:>10,}{'' if name in allowed else '   NOT ALLOWED'}")
    print(f"{len(counts)} calls; pytest exit {done.returncode}")


if __name__ == "__main__":
    if not shutil.which("strace"):
        sys.exit("strace is not installed (apt-get install strace)")
    main(sys.argv[1:])
