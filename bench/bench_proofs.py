"""The proofs of a cold build, in one run on the fixture base (issue 54): bakery's way now (the
proofs of one base in one sandbox: torch and Triton imported there once, each proof forked from it,
all at once) against the way until now (one sandbox per proof, each importing torch and Triton,
all at once: each proof's run_batch in a thread of its own), against a bare `import torch, triton`,
a cold `invoke prove` (empty cache: the base opened and every proof run), and running each proof
script by hand on each target, one after the other (what the porting kit's prove.sh does).
Medians of ROUNDS, interleaved. Targets: a cold `invoke prove` at most 8 times the bare import.

    .venv/bin/python bench/bench_proofs.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.bake.opened import base_files, open_base  # noqa: E402 (after sys.path names the project)
from bakery.bake.pipeline import overlay_inputs, overlay_proofs  # noqa: E402
from bakery.dev import fixture, stack  # noqa: E402 (after sys.path names the project)
from bakery.proofs import runner  # noqa: E402 (after sys.path names the project)

ROUNDS = 3


def by_hand(applied, files, work: Path) -> tuple[float, dict]:
    """Each proof on each target, one plain process after the other."""
    seconds = {}
    start = time.monotonic()
    for a in applied:
        spec = a.overlay.proof
        if not spec or not spec.script:
            continue
        reads = []
        for i, path in enumerate(spec.reads):
            reads.append(work / f"{a.overlay.id}.read{i}.py")
            reads[-1].write_bytes(files[path])
        began = time.monotonic()
        for which, data in (("stock", a.original), ("overlaid", a.result)):
            target = work / f"{a.overlay.id}.{which}.py"
            target.write_bytes(data)
            subprocess.run([sys.executable, str(spec.script), str(target), *map(str, reads)], check=True,
                           capture_output=True)
        seconds[a.overlay.id] = time.monotonic() - began
    return time.monotonic() - start, seconds


def seconds(cmd: list[str], env: dict | None = None) -> float:
    start = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, **(env or {})}, cwd=ROOT)
    return time.monotonic() - start


def proof_jobs(applied, files) -> dict:
    return {(a.overlay.id, which): (a.overlay.proof, data, files) for a in applied
            if a.overlay.proof and a.overlay.proof.script for which, data in (("stock", a.original), ("overlaid", a.result))}


def one_sandbox_each(jobs: dict) -> dict:
    """The way until now: each proof in a sandbox of its own, every proof at once."""
    from concurrent.futures import ThreadPoolExecutor

    specs = {spec: files for spec, _, files in jobs.values()}
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {spec: pool.submit(runner.run_batch, spec, [t for s, t, _ in jobs.values() if s == spec], files,
                                     "cpu", None, True) for spec, files in specs.items()}
    verdicts: dict = {}
    for spec, future in futures.items():
        keys = [k for k, (s, _, _) in jobs.items() if s == spec]
        verdicts.update(zip(keys, future.result(), strict=True))
    return verdicts


def timed(f, *args):
    start = time.monotonic()
    result = f(*args)
    return time.monotonic() - start, result


def main() -> None:
    registry = stack.up()
    base = str(fixture.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None))
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-proofs-"))
    os.environ["BAKERY_CACHE"] = str(work / "cache")
    opened = open_base(ROOT, base, log=lambda m: None)
    _, applied, _ = overlay_inputs(ROOT, opened)
    files = base_files(opened, [r for a in applied if a.overlay.proof for r in a.overlay.proof.reads])
    jobs = proof_jobs(applied, files)
    bare, before, now, prove = [], [], [], []
    for r in range(ROUNDS):
        bare.append(seconds([sys.executable, "-c", "import torch, triton"]))
        t, was = timed(one_sandbox_each, jobs)
        before.append(t)
        t, got = timed(runner.run_many, jobs, "cpu", None, True)
        now.append(t)
        if {k: (v.verdict, v.reason) for k, v in got.items()} != {k: (v.verdict, v.reason) for k, v in was.items()}:
            sys.exit(f"the two ways disagree: {got} against {was}")
        prove.append(seconds([sys.executable, "-m", "invoke", "prove", "--base", base],
                             {"BAKERY_CACHE": str(work / f"cold-{r}")}))
    proofs, _ = overlay_proofs(opened, applied, log=lambda m: None)
    plain, each = by_hand(applied, files, work)
    print(f"{'overlay':<37} {'stock':<8} {'overlaid':<9} {'by hand':>8}")
    for overlay_id, proof in proofs.items():
        if "hardware" in proof:
            print(f"{overlay_id:<37} {'(hardware-only: no proof runs here)'}")
            continue
        print(f"{overlay_id:<37} {proof['stock']:<8} {proof['overlaid']:<9} {each[overlay_id]:>7.2f}s")
    med = statistics.median
    print(f"medians of {ROUNDS}, on {os.cpu_count()} cores: bare `import torch, triton` {med(bare):.2f}s")
    print(f"every proof, one sandbox per proof (until now) {med(before):.2f}s; one sandbox, forked (now) "
          f"{med(now):.2f}s; before / now {med(before) / med(now):.2f}x")
    print(f"cold `invoke prove` {med(prove):.2f}s = {med(prove) / med(bare):.1f}x the bare import (target 8x); "
          f"by hand {plain:.2f}s, by hand / now {plain / med(now):.2f}x")
    print("rounds: " + "; ".join(f"{a:.2f} {b:.2f} {c:.2f} {d:.2f}" for a, b, c, d in zip(bare, before, now, prove,
                                                                                        strict=True)))


if __name__ == "__main__":
    main()
