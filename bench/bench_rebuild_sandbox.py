"""What the sandbox costs a rebuild: `invoke reproduce`'s build of one revision, from nothing (an
empty cache, the proofs run, the kernels compiled), run the way it ran before issue 28 (a plain
child process of this user with Docker's socket and the network) and the way it runs now (in the
sandbox, the base and the compile through the broker), alternately, twice each; medians.

The revision is this checkout's HEAD committed with the fixture's lock, the base the local
fixture, the toolchain the local stand-in (`invoke fixture`, `invoke toolchain`).

    .venv/bin/python bench/bench_rebuild_sandbox.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.dev import fixture, stack  # noqa: E402 (after sys.path names the project)
from bakery.oci.refs import Reference  # noqa: E402 (after sys.path names the project)
from bakery.release import reproduce  # noqa: E402 (after sys.path names the project)

RUNS = 2
IDENTITY = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.com", "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.com"}


def revision(work: Path, base: str, toolchain: str) -> reproduce.Plan:
    """This checkout, locked to the fixture base, committed in a repository of its own."""
    repo = work / "revision"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
    lock = repo / "overlays" / "overlays.lock"
    done = subprocess.run([sys.executable, "-m", "invoke", "lock", "--base", base, "--lock", str(lock)], cwd=repo,
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"invoke lock failed:\n{done.stderr}")
    env = {**os.environ, **IDENTITY}
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "locked to the fixture"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return reproduce.Plan(str(repo), head, False, base, 1700000000, toolchain)


def plain(p: reproduce.Plan, work: Path) -> float:
    """As reproduce ran it before: clone, then the revision's build as a child with our socket."""
    start = time.monotonic()
    source = work / "source"
    subprocess.run(["git", "clone", "-q", "--no-checkout", p.repository, str(source)], check=True)
    subprocess.run(["git", "-C", str(source), "checkout", "-q", "--detach", p.revision], check=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "DOCKER_HOST")}
    env.update({"SOURCE_DATE_EPOCH": str(p.epoch), "BAKERY_CACHE": str(work / "cache")})
    done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(source), "build", "--base", p.base,
                           "--layout", str(work / "layout"), "--out", str(work / "out"), "--recompile",
                           *(["--toolchain", p.toolchain] if p.toolchain else [])], cwd=source, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the plain rebuild failed:\n{done.stderr[-2000:]}")
    return time.monotonic() - start


def boxed(p: reproduce.Plan, work: Path) -> float:
    start = time.monotonic()
    reproduce.rebuild(p, work, p.toolchain, log=lambda m: None)
    return time.monotonic() - start


def main() -> None:
    registry = stack.up()
    base = str(fixture.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None))
    toolchain = fixture.toolchain(ROOT / "hip" / "toolchain", ROOT / "tests" / "fixture" / "fixture.yaml",
                                  registry, log=lambda m: None)
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-rebuild-"))
    try:
        p = revision(work, base, toolchain)
        assert Reference.parse(p.base).digest
        times: dict[str, list[float]] = {"plain": [], "boxed": []}
        for i in range(RUNS):
            times["plain"].append(plain(p, work / f"plain-{i}"))
            times["boxed"].append(boxed(p, work / f"boxed-{i}"))
        a, b = statistics.median(times["plain"]), statistics.median(times["boxed"])
        print(f"{'rebuild from nothing':<28} {'plain':>8} {'sandboxed':>10} {'ratio':>6}")
        print(f"{'(proofs, compile, layers)':<28} {a:>7.1f}s {b:>9.1f}s {b / a:>5.2f}x")
        print("runs: plain " + ", ".join(f"{t:.1f}" for t in times["plain"]) + "; sandboxed "
              + ", ".join(f"{t:.1f}" for t in times["boxed"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
