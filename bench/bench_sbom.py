"""What the SBOM's inventory adds to the build's one pass over the base's layers, on bench_prod's
production-shaped stand-in base (the fixture, torch installed, N GiB of incompressible bytes and
200,000 small files; --gib=N, default 2).

Timed in one run, each pass from an empty layer cache, ROUNDS times (the median is printed):
  - the pass keeping what a build kept before the SBOM named the OS: dist-info METADATA, the
    overlay targets and what the proofs read;
  - the pass a build makes now: those plus os-release, dpkg's status, copyright files and RECORDs
    (bakery.base.inventory.PATTERNS);
  - reading the inventory from what that pass kept: the OS, each dpkg package with its licenses,
    which RECORD lists each overlay target.
Both passes must stream each layer exactly once (no second download). Printed: seconds, layer
streams, and the bytes each pass kept in the file cache.
Run: .venv/bin/python bench/bench_sbom.py [--gib=10]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_prod  # noqa: E402  (reads --gib)
from bakery.bake import opened  # noqa: E402 (after sys.path names the project)
from bakery.base import inventory, spec as base_mod  # noqa: E402 (after sys.path names the project)
from bakery.base.filesystem import BaseFilesystem  # noqa: E402 (after sys.path names the project)
from bakery.base.layercache import LayerCache  # noqa: E402 (after sys.path names the project)
from bakery.dev import stack  # noqa: E402 (after sys.path names the project)
from bakery.oci.refs import Reference  # noqa: E402 (after sys.path names the project)
from bakery.oci.registry import Registry  # noqa: E402 (after sys.path names the project)

ROUNDS = 3


def one_pass(base: str, keep: tuple[str, ...], cache: Path) -> tuple[float, int, int, BaseFilesystem]:
    """(seconds, layers streamed, layer count, the filesystem) of a cold open, as open_base does it."""
    shutil.rmtree(cache, ignore_errors=True)
    ref = Reference.parse(base)
    registry = Registry(ref.registry)
    image = base_mod.resolve(registry, ref, "linux/amd64")
    layers = LayerCache(cache)
    start = time.monotonic()
    fs = BaseFilesystem(registry, image, layers, keep=keep)
    fs.prefetch()
    fs.check_layers()
    fs.check_merge()
    return time.monotonic() - start, layers.downloads, len(image.layers), fs


def kept_bytes(cache: Path) -> int:
    return sum(f.stat().st_size for f in (cache / "files").rglob("*") if f.is_file())


def read_inventory(fs: BaseFilesystem, targets: list[str]) -> tuple[float, int, int, int]:
    """(seconds, Python distributions, dpkg packages, targets a RECORD lists), from the kept files."""
    start = time.monotonic()
    dists = opened.python_distributions(fs)
    inventory.operating_system(fs)
    debs = inventory.debian_packages(fs)
    owned = inventory.owners(fs, [d.metadata for d in dists], targets)
    return time.monotonic() - start, len(dists), len(debs), len(owned)


def main() -> None:
    registry = stack.up()
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-sbom-"))
    base = bench_prod.stand_in_base(registry, work)
    registered = opened.registered_overlays(ROOT)
    assert registered is not None, "overlays/overlays.yaml does not load: invoke build says why"
    now = opened.needed_files(ROOT, registered)
    before = tuple(p for p in now if p not in inventory.PATTERNS and p != opened.DIST_RECORD)
    targets = [o.target for o in registered]
    runs: dict[str, list] = {"before": [], "now": []}
    for _ in range(ROUNDS):  # interleaved: this machine's speed drifts from minute to minute
        for name, keep in (("before", before), ("now", now)):
            seconds, streamed, layers, fs = one_pass(base, keep, work / "cache")
            if streamed != layers:
                sys.exit(f"bench: the {name} pass streamed {streamed} layers of {layers}")
            read = read_inventory(fs, targets) if name == "now" else None
            runs[name].append((seconds, kept_bytes(work / "cache"), read))
    shutil.rmtree(work, ignore_errors=True)
    median = {name: statistics.median(r[0] for r in rs) for name, rs in runs.items()}
    read_s = statistics.median(r[2][0] for r in runs["now"])
    _, dists, debs, owned = runs["now"][0][2]
    print(f"stand-in base {base} ({bench_prod.BIG_GIB} GiB + {bench_prod.MANY} files), {ROUNDS} rounds, cold each")
    print(f"  one pass, as kept before the SBOM's inventory: {median['before']:.1f} s, "
          f"kept {runs['before'][0][1] / 2**20:.1f} MiB")
    print(f"  one pass, as kept now:                         {median['now']:.1f} s, "
          f"kept {runs['now'][0][1] / 2**20:.1f} MiB  (x{median['now'] / median['before']:.3f})")
    print(f"  reading the inventory from the kept files:     {read_s:.2f} s ({dists} Python distributions, "
          f"{debs} dpkg packages, {owned}/{len(targets)} overlay targets in a RECORD)")
    print("  each pass streamed every layer once: no second download")


if __name__ == "__main__":
    main()
