"""Benchmark: `invoke rebase` from vLLM 0.26.0 onto 0.27.0 with proofs, as a user runs it.

Run from the repository root with the local stack up: .venv/bin/python bench/rebase.py
Builds (or reuses) both fixture bases, copies the checkout twice, and times the rebase twice:
with the committed ports, and without them (the 3-way-merge path a new nightly takes), each with
a cold proof cache and again warm. Prints seconds and how each overlay was carried. The
alternative a user has is reading six files by hand: no ratio to print for that.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def invoke(project: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), *args], cwd=project,
                          env={**os.environ, **env}, capture_output=True, text=True)


def statuses(stdout: str) -> Counter:
    counts: Counter[str] = Counter()
    for line in stdout.splitlines()[1:]:
        words = line.split()
        if "yes" in words:
            status = " ".join(words[1:words.index("yes")])
            counts[status.split(",")[0].replace("ported (", "").rstrip(")")] += 1
    return counts


def main() -> None:
    base26 = invoke(ROOT, {}, "fixture").stdout.split()[-1]
    base27 = invoke(ROOT, {}, "fixture", "--vllm", "0.27.0").stdout.split()[-1]
    with tempfile.TemporaryDirectory() as tmp:
        for ports in (True, False):
            project = Path(tmp) / f"ports-{ports}"
            shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns("out", ".venv", ".tools", "__pycache__"))
            if not ports:
                shutil.rmtree(project / "overlays" / "patches" / "ports")
            env = {"BAKERY_CACHE": str(Path(tmp) / f"cache-{ports}")}
            locked = invoke(project, env, "lock", "--base", base26)
            assert locked.returncode == 0, locked.stderr
            shutil.copytree(project / "overlays", Path(tmp) / f"overlays-{ports}")
            for run in ("cold", "warm"):
                shutil.rmtree(project / "overlays")
                shutil.copytree(Path(tmp) / f"overlays-{ports}", project / "overlays")
                started = time.monotonic()
                result = invoke(project, env, "rebase", "--base", base27)
                seconds = time.monotonic() - started
                assert result.returncode == 0, result.stdout + result.stderr
                print(json.dumps({"ports": ports, "proof cache": run, "seconds": round(seconds, 1),
                                  "carried": dict(statuses(result.stdout))}))


if __name__ == "__main__":
    main()
