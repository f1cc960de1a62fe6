"""What the sandbox costs a proof: each proof that needs only its target (from overlays/stock) run
plainly and in the sandbox (bubblewrap, the seccomp filter, the limits, a pids cgroup as root), as
`invoke build` runs it, alternately, 3 times each; medians.

    .venv/bin/python bench/bench_sandbox.py
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery import sandbox  # noqa: E402 (after sys.path names the project)
from bakery.inputs import overlays, proof_spec  # noqa: E402 (after sys.path names the project)
from bakery.proofs import runner as prove  # noqa: E402 (after sys.path names the project)

RUNS = 3


def plain(spec, target: Path) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, str(spec.script), str(target)], capture_output=True, check=True)
    return time.monotonic() - start


def boxed(spec, target: Path) -> float:
    start = time.monotonic()
    done = sandbox.run([sys.executable, str(spec.script), f"{sandbox.INPUTS}/{target.name}"], prove.readable(spec),
                       target.parent, 900)
    assert done.returncode == 0, done.stderr
    return time.monotonic() - start


def main() -> None:
    lock = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    stock = {e["id"]: ROOT / "overlays" / "stock" / e["base_sha256"] for e in lock["overlays"] if e["base_sha256"]}
    importer = Path(tempfile.mkdtemp()) / "import_only.py"
    importer.write_text("import sys\nimport numpy, torch, triton\n")
    shutil.copy(ROOT / "overlays" / "proofs" / proof_spec.HELPER, importer.parent)  # every proof's code has it
    cases = [("python + import torch, triton", proof_spec.ProofSpec(importer), ROOT / "README.md")]
    cases += [(o.id, o.proof, stock[o.id]) for o in overlays.load(ROOT / "overlays" / "overlays.yaml")
              if o.proof and o.proof.script and not o.proof.reads and o.id in stock]
    print(f"{'run':<34} {'plain':>7} {'sandboxed':>9} {'ratio':>6}")
    totals = [0.0, 0.0]
    for name, spec, target in cases:
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / "input0.py"
            copy.write_bytes(target.read_bytes())
            Path(tmp).chmod(0o755)
            times: dict[str, list[float]] = {"plain": [], "boxed": []}
            for _ in range(RUNS):
                times["plain"].append(plain(spec, copy))
                times["boxed"].append(boxed(spec, copy))
        p, b = statistics.median(times["plain"]), statistics.median(times["boxed"])
        totals[0] += p
        totals[1] += b
        print(f"{name:<34} {p:>6.2f}s {b:>8.2f}s {b / p:>5.2f}x")
    print(f"{'all':<34} {totals[0]:>6.2f}s {totals[1]:>8.2f}s {totals[1] / totals[0]:>5.2f}x")


if __name__ == "__main__":
    main()
