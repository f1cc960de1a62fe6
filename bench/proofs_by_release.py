"""Each required overlay's proof on the stock target of every vLLM release PyPI has from 0.26.0 on:
does upstream still have the bug (BROKEN), has it fixed it (FIXED), or does the proof not run on
those bytes (CANNOT-PROVE: the proof needs porting before a bump onto that release can be decided).

The targets come from the release's wheel (`pip download --no-deps`, into WHEELS), at the paths
the ROCm image installs them; proofs run as the build runs them (sandboxed, cached by their
inputs). Prints a Markdown table, one row per overlay, one column per release.

    .venv/bin/python bench/proofs_by_release.py [VERSION ...]   (default 0.26.0 .. 0.33.0)
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.inputs import overlays  # noqa: E402 (after sys.path names the project)
from bakery.proofs import runner as prove  # noqa: E402 (after sys.path names the project)

SITE = "/usr/local/lib/python3.12/dist-packages/"
WHEELS = Path(os.environ.get("WHEELS", Path.home() / ".cache" / "bakery" / "wheels"))
RELEASES = ["0.26.0", "0.27.0", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]


def wheel(version: str) -> zipfile.ZipFile:
    found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        f"vllm=={version}", "-d", str(WHEELS)], check=True)
        found = sorted(WHEELS.glob(f"vllm-{version}-*.whl"))
    return zipfile.ZipFile(found[0])


def verdicts(version: str, registered: list) -> dict[str, str]:
    archive = wheel(version)
    names = set(archive.namelist())

    def read(image_path: str) -> bytes | None:
        inside = image_path.removeprefix(SITE)
        return archive.read(inside) if inside in names else None

    out = {}
    for o in registered:
        target = read(o.target)
        if target is None:
            out[o.id] = "target moved or removed"
            continue
        # a read the wheel lacks is left out: the proof says so (CANNOT-PROVE), as rebase has it
        v = prove.run(o.proof, target, {r: data for r in o.proof.reads if (data := read(r)) is not None})
        out[o.id] = v.verdict if v.verdict != prove.CANNOT else f"CANNOT-PROVE ({v.reason[:90]})"
    return out


def main(versions: list[str]) -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    registered = [o for o in overlays.load(ROOT / "overlays" / "overlays.yaml")
                  if o.baked and o.proof and o.proof.script]
    table = {v: verdicts(v, registered) for v in versions}
    print("| overlay | " + " | ".join(versions) + " |")
    print("| --- |" + " --- |" * len(versions))
    for o in registered:
        print(f"| {o.id} | " + " | ".join(table[v][o.id] for v in versions) + " |")


if __name__ == "__main__":
    main(sys.argv[1:] or RELEASES)
