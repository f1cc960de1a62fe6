"""Benchmark: `invoke build --push` against `docker pull` + `docker build` + `docker push`.

Cold means: our layer cache empty / Docker's image store pruned (`docker system prune -af`:
this removes every local image, so run it on a machine where that is fine).

Same base (the fixture), same added files, same registry, one run; prints ratios and base-layer
bytes uploaded by each. Run: .venv/bin/python bench/bench_build.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.dev import fixture, stack  # noqa: E402 (after sys.path names the project)


def timed(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, str]:
    start = time.monotonic()
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd)
    if result.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr}")
    return time.monotonic() - start, result.stdout


def ours(base: str, target: str, cache: Path, out: Path, lock: Path, toolchain: str) -> tuple[float, dict]:
    seconds, _ = timed([sys.executable, "-m", "invoke", "build", "--base", base, "--push", target, "--out", str(out),
                        "--lock", str(lock), "--toolchain", toolchain], env={"BAKERY_CACHE": str(cache)}, cwd=ROOT)
    return seconds, json.loads((out / "build-record.json").read_text())


def docker_way(base: str, target: str, context: Path, base_sizes: dict, cold: bool) -> tuple[float, int]:
    """docker pull (cold only) + docker build + docker push; returns (seconds, base bytes pushed)."""
    if cold:  # every image goes: other images sharing the base layers would make the pull warm
        subprocess.run(["docker", "system", "prune", "-af"], capture_output=True)
        assert subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode != 0
    total = 0.0
    if cold:
        total += timed(["docker", "pull", "-q", base])[0]
    total += timed(["docker", "build", "-q", "-t", target, str(context)])[0]
    seconds, out = timed(["docker", "push", target])
    total += seconds
    pushed = [line.split(":")[0] for line in out.splitlines() if line.endswith(": Pushed")]
    return total, sum(size for short, size in base_sizes.items() if short in pushed)


def main() -> None:
    registry = stack.up()
    base = str(fixture.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None))
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-"))
    stamp = str(int(time.time()))
    cache, out, lock = work / "cache", work / "out", work / "overlays.lock"
    tools = fixture.toolchain(ROOT / "hip" / "toolchain", ROOT / "tests" / "fixture" / "fixture.yaml", registry,
                              log=lambda m: None)
    # lock proves the overlays into this cache; the kernels' compile is cached apart from the layer
    # cache. Neither is what is compared here (Docker neither proves nor compiles): the layer, file
    # and view caches are emptied before the cold run
    timed([sys.executable, "-m", "invoke", "lock", "--base", base, "--lock", str(lock)],
          env={"BAKERY_CACHE": str(cache)}, cwd=ROOT)
    timed([sys.executable, "-m", "invoke", "compile", "--toolchain", tools], env={"BAKERY_CACHE": str(cache)}, cwd=ROOT)
    for emptied in ("layers", "files", "views", "blobs"):
        shutil.rmtree(cache / emptied, ignore_errors=True)

    cold_ours, rec = ours(base, f"{registry}/bench/ours-{stamp}:1", cache, out, lock, tools)
    warm_ours, rec_warm = ours(base, f"{registry}/bench/ours-{stamp}:2", cache, out, lock, tools)

    # the docker way bakes the same files with COPY: unpacked from the layers our build wrote
    context = work / "context"
    (context / "files").mkdir(parents=True)
    for layer in rec["layers"]:
        with tarfile.open(out / "blobs" / "sha256" / layer["digest"].split(":")[1]) as tar:
            tar.extractall(context / "files", filter=lambda m, path: m if not Path(m.name).name.startswith(".wh.")
                           else None)
    (context / "Dockerfile").write_text(f"FROM {base}\nCOPY files/ /\n")
    base_sizes = {layer["digest"].split(":")[1][:12]: layer["size"] for layer in rec["base"]["layers"]}
    cold_docker, base_bytes_docker = docker_way(base, f"{registry}/bench/docker-{stamp}:1", context, base_sizes, True)
    warm_docker, _ = docker_way(base, f"{registry}/bench/docker-{stamp}:2", context, base_sizes, False)
    # reproducibility: the same Dockerfile built again without cache, versus our rebuild (after the
    # prune; the kernels are compiled anew in a fresh cache)
    ids = {timed(["docker", "build", "-q", "--no-cache", str(context)])[1].strip() for _ in range(2)}
    fixture.build(ROOT / "tests" / "fixture" / "fixture.yaml", registry, log=lambda m: None)  # re-tag
    tools = fixture.toolchain(ROOT / "hip" / "toolchain", ROOT / "tests" / "fixture" / "fixture.yaml", registry,
                              log=lambda m: None)
    _, rec_again = ours(base, f"{registry}/bench/ours-{stamp}:3", cache, work / "out-again", lock, tools)

    base_total = sum(base_sizes.values())
    print(f"base: {len(base_sizes)} layers, {base_total / 2**20:.1f} MiB compressed; "
          f"added: {len(rec['files'])} files in {len(rec['layers'])} layers")
    print(f"cold: invoke build+push {cold_ours:6.2f}s   docker pull+build+push {cold_docker:6.2f}s   "
          f"ratio {cold_docker / cold_ours:5.2f}x")
    print(f"warm: invoke build+push {warm_ours:6.2f}s   docker build+push      {warm_docker:6.2f}s   "
          f"ratio {warm_docker / warm_ours:5.2f}x")
    print(f"base-layer bytes uploaded by our push: {rec['push']['base_bytes_uploaded']} (target 0); "
          f"by docker push: {base_bytes_docker}")
    print(f"layers streamed by our warm build: {rec_warm['layer_downloads']} (target 0)")
    same = rec_again["manifest"]["digest"] == rec["manifest"]["digest"]
    print(f"rebuild gives the same digest: invoke build {'yes' if same else 'NO'}; "
          f"docker build --no-cache {'yes' if len(ids) == 1 else 'no'} ({len(ids)} distinct image IDs from 2 builds)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
