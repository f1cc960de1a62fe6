"""Benchmark: the warm no-op, `invoke build --push` when nothing changed (issue 54: under 0.25 s).

One fixture base, its lock, the stand-in toolchain; one build first (it proves and compiles into
this run's cache, untimed), then ROUNDS of each case below, interleaved (A B C A B C ...), so a
drift of the machine's speed falls on all of them alike:
  - the no-op as an engineer runs it (no key: the project's policy is read at once);
  - the no-op as the release's build job runs it (--key, --policy);
  - with --before=REV, the same two at git revision REV (a checkout of its own, the same caches);
  - `invoke --list` (Python, invoke and tasks.py starting, no build) and a bare `python -c pass`:
    the floor under any task.
The interpreter writes .pyc here, as a user's does (this machine sets PYTHONDONTWRITEBYTECODE: it
is unset for every run, and each case runs once untimed first). Prints min, median and max, and
the last no-op's own `stage times` line. Run: .venv/bin/python bench/bench_noop.py [--before=REV]
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

SPEC = ROOT / "tests" / "fixture" / "fixture.yaml"
ROUNDS = 15
BEFORE = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--before=")), None)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, str]:
    """(seconds, stderr) of one run; the bench stops on a failed one."""
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env={**ENV, **(env or {})})
    seconds = time.monotonic() - start
    if result.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return seconds, result.stderr


def main() -> None:
    registry = stack.up()
    base = str(fixture.build(SPEC, registry, log=lambda m: None))
    tools = fixture.toolchain(ROOT / "hip" / "toolchain", SPEC, registry, log=lambda m: None)
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-noop-"))
    cache, lock = work / "cache", work / "overlays.lock"
    env = {"BAKERY_CACHE": str(cache), "BAKERY_KEY_PASSWORD": "bench"}
    invoke = [sys.executable, "-m", "invoke"]
    timed([*invoke, "lock", "--base", base, "--lock", str(lock)], ROOT, env)
    timed([*invoke, "keygen", "--out", str(work / "keys")], ROOT, env)
    policy = work / "policy.yaml"
    policy.write_text(f"allowed_sources: ['*']\nallowed_builders: [local]\nallowed_repositories: ['127.0.0.1:*/*']\n"
                      f"allow_dirty: true\nbase: {base}\n")
    keyed = ["--key", str(work / "keys" / "release.pub"), "--policy", str(policy)]

    def build(project: Path, name: str, *extra: str) -> list[str]:
        return [*invoke, "--search-root", str(project), "build", "--base", base, "--push",
                f"{registry}/bench/noop-{name}:latest", "--out", str(work / f"out-{name}"), "--lock", str(lock),
                "--toolchain", tools, *extra]

    cases: dict[str, tuple[list[str], Path]] = {
        "no-op, no key": (build(ROOT, "now"), ROOT),
        "no-op, --key --policy": (build(ROOT, "now-keyed", *keyed), ROOT),
    }
    if BEFORE:
        earlier = work / "project-before"  # a checkout of its own: the build records its revision
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(earlier)], check=True)
        subprocess.run(["git", "-C", str(earlier), "checkout", "-q", BEFORE], check=True)
        cases[f"no-op, no key, at {BEFORE}"] = (build(earlier, "before"), earlier)
        cases[f"no-op, --key --policy, at {BEFORE}"] = (build(earlier, "before-keyed", *keyed), earlier)
    cases["invoke --list"] = ([*invoke, "--search-root", str(ROOT), "--list"], ROOT)
    cases["python -c pass"] = ([sys.executable, "-c", "pass"], ROOT)

    said = {name: timed(cmd, cwd, env)[1] for name, (cmd, cwd) in cases.items()}  # builds, .pyc written
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(ROUNDS):
        for name, (cmd, cwd) in cases.items():
            seconds, said[name] = timed(cmd, cwd, env)
            times[name].append(seconds)

    print(f"{ROUNDS} rounds, interleaved; seconds (min / median / max)")
    for name, runs in times.items():
        print(f"  {name:40s} {min(runs):5.3f} / {statistics.median(runs):5.3f} / {max(runs):5.3f}")
    for name in cases:
        if name.startswith("no-op"):
            split = next((line for line in said[name].splitlines() if line.startswith("stage times: ")), "?")
            print(f"  {name:40s} {split}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
