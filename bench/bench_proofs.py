"""The proofs of a cold build: how `invoke build` runs them, against running each proof script by
hand on each target (what the porting kit's prove.sh does), in the same run, on the fixture base.

bakery's way: one sandboxed process per proof (torch and Triton imported once, a fork per target:
stock and overlaid), the proofs in parallel on every core, an empty verdict cache. By hand: one
plain `python PROOF TARGET READS` per target, one after the other. Target: every proof of a cold
build within 15 s on this 2-core machine.

    .venv/bin/python bench/bench_proofs.py
"""

from __future__ import annotations

import os
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


def main() -> None:
    registry = stack.up()
    base = str(fixture.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None))
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-proofs-"))
    os.environ["BAKERY_CACHE"] = str(work / "cache")  # verdicts, layers and files: all cold
    opened = open_base(ROOT, base, log=lambda m: None)
    _, applied, _ = overlay_inputs(ROOT, opened)
    files = base_files(opened, [r for a in applied if a.overlay.proof for r in a.overlay.proof.reads])
    start = time.monotonic()
    proofs, _ = overlay_proofs(opened, applied, log=lambda m: None)
    ours = time.monotonic() - start
    plain, each = by_hand(applied, files, work)
    print(f"{'overlay':<30} {'stock':<8} {'overlaid':<9} {'by hand':>8}")
    for overlay_id, proof in proofs.items():
        if "hardware" in proof:
            print(f"{overlay_id:<30} {'(hardware-only: no proof runs here)'}")
            continue
        print(f"{overlay_id:<30} {proof['stock']:<8} {proof['overlaid']:<9} {each[overlay_id]:>7.2f}s")
    print(f"all proofs of a cold build: invoke build {ours:.2f}s (target 15 s), by hand {plain:.2f}s, "
          f"by hand / ours {plain / ours:.2f}x, on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
