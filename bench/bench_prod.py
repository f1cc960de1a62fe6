"""Benchmark at production scale: a stand-in base of realistic shape, ours against Docker, one run.

The real ROCm base is many GB and cannot be pulled here. The stand-in: the fixture base (Debian,
vLLM and AITER sources), plus a layer with the real torch CPU wheel installed, plus one layer of
2 GiB of incompressible bytes, plus one layer of 200,000 small files (a ROCm install's shape). Printed, in one run and on the same registry:
  - the floor: fetching, hashing and decompressing every base layer once, in one thread;
  - cold, warm no-op and one-overlay-changed: `invoke build --push` against `docker pull` (cold
    only) + `docker build` (FROM the base, COPY the same files) + `docker push`;
  - our peak RSS and the base bytes each side moved.
Cold means our layer and file caches empty (proof verdicts and compiled kernels kept warm: they
are not what Docker would do) and Docker's image store pruned (`docker system prune -af`: run it
where that is fine). Run: .venv/bin/python bench/bench_prod.py
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery import base as base_mod, fixture, stack  # noqa: E402
from bakery.errors import NotFound  # noqa: E402
from bakery.refs import Reference  # noqa: E402
from bakery.registry import Registry  # noqa: E402

SPEC = ROOT / "tests" / "fixture" / "fixture.yaml"
SITE = "usr/local/lib/python3.12/dist-packages"
BIG = 2 << 30
# A ROCm install is many small files (kernel objects, tuning databases, headers) besides the big
# libraries; MANY is an assumed order of magnitude for the real base's entry count, not a count.
MANY = 200_000
MANY_FILES = ("import os; [open(f'/opt/rocm-standin/lib/k{d}/{f}.co', 'wb').write(os.urandom(64)) "
              "for d in range(400) if not os.makedirs(f'/opt/rocm-standin/lib/k{d}') for f in range(500)]")


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> tuple[float, str, int]:
    """(seconds, stdout, peak RSS in KiB of the command)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.monotonic()
    result = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, cwd=cwd)
    seconds = time.monotonic() - start
    if result.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    rss = int(result.stderr.strip().splitlines()[-1]) if result.stderr.strip() else before
    return seconds, result.stdout, rss


def stand_in_base(registry: str, work: Path) -> str:
    """fixture + torch installed + 2 GiB of random bytes, built by Docker; cached by tag."""
    import docker

    target = f"{registry}/bench/prod-base"
    tag = f"torch-2.13.0-2GiB-{MANY // 1000}k-files"
    try:  # kept in the registry: the cold Docker runs below prune every local image
        return f"{target}@{Registry(registry).get_manifest(Reference.parse(f'{target}:{tag}'))[2]}"
    except NotFound:
        pass
    fixture_ref = str(fixture.build(SPEC, registry, log=lambda m: None))
    client = docker.from_env()
    try:
        client.images.get(f"{target}:{tag}")
    except docker.errors.ImageNotFound:
        wheel = next((fixture.cache_dir() / "toolchain-wheels").glob("torch-2.13.0*.whl"))
        context = work / "base-context"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(context / "torch")
        (context / "Dockerfile").write_text(
            f"FROM {fixture_ref}\nCOPY torch/ /{SITE}/\n"
            f"RUN head -c {BIG} /dev/urandom > /opt/incompressible.bin\n"
            f"RUN python3 -c \"{MANY_FILES}\"\n")
        print("building the stand-in base (torch installed + 2 GiB): a few minutes, once", file=sys.stderr)
        client.images.build(path=str(context), tag=f"{target}:{tag}", rm=True)
        shutil.rmtree(context)
    digest = None
    for line in client.images.push(target, tag=tag, stream=True, decode=True):
        digest = (line.get("aux") or {}).get("Digest") or digest
    return f"{target}@{digest}"


def floor(base: str) -> tuple[float, int]:
    """Fetch, sha256 and decompress every base layer once, in one thread: the least any tool does."""
    ref = Reference.parse(base)
    reg = Registry(ref.registry)
    image = base_mod.resolve(reg, ref, "linux/amd64")
    start, moved = time.monotonic(), 0
    for desc in image.layers:
        inflate = zlib.decompressobj(wbits=31)
        for chunk in reg.stream_blob(ref.repository, desc):  # hashed and checked inside
            inflate.decompress(chunk)
            moved += len(chunk)
    return time.monotonic() - start, moved


def ours(base, target, cache, out, lock, tools) -> tuple[float, dict, int]:
    seconds, _, rss = run([sys.executable, "-m", "invoke", "build", "--base", base, "--push", target, "--out", str(out),
                           "--lock", str(lock), "--toolchain", tools], env={"BAKERY_CACHE": str(cache)}, cwd=ROOT)
    return seconds, json.loads((out / "build-record.json").read_text()), rss


def docker_way(base, target, context, cold: bool) -> float:
    if cold:
        subprocess.run(["docker", "system", "prune", "-af"], capture_output=True)
    total = run(["docker", "pull", "-q", base])[0] if cold else 0.0
    total += run(["docker", "build", "-q", "-t", target, str(context)])[0]
    return total + run(["docker", "push", "-q", target])[0]


def main() -> None:
    registry = stack.up()
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-prod-"))
    base = stand_in_base(registry, work)
    tools = fixture.toolchain(ROOT / "hip" / "toolchain", SPEC, log=lambda m: None)
    project = work / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns("out", ".venv", ".tools", "__pycache__"))
    lock = work / "overlays.lock"
    run([sys.executable, "-m", "invoke", "--search-root", str(project), "lock", "--base", base, "--lock", str(lock)],
        cwd=project)
    warm_caches = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    cache = work / "cache"
    for keep in ("proofs", "hip"):  # not what is compared: Docker neither proves nor compiles
        shutil.copytree(warm_caches / keep, cache / keep)
    stamp = str(int(time.time()))

    floor_s, floor_bytes = floor(base)
    cold_s, rec, cold_rss = ours(base, f"{registry}/bench/prod-ours-{stamp}:1", cache, work / "out", lock, tools)
    warm_s, rec_warm, warm_rss = ours(base, f"{registry}/bench/prod-ours-{stamp}:2", cache, work / "out", lock, tools)
    # one overlay changed: a comment added to the fence patch's new side, re-locked
    patch = project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch"
    patch.write_text(patch.read_text().replace("+        # vLLM issue #47282", "+        # (bench) vLLM issue #47282"))
    lock_s = run([sys.executable, "-m", "invoke", "--search-root", str(project), "lock", "--base", base, "--lock",
                  str(lock)], env={"BAKERY_CACHE": str(cache)}, cwd=project)[0]  # proves the changed overlay
    changed_s, _, changed_rss = run([sys.executable, "-m", "invoke", "--search-root", str(project), "build", "--base",
                                     base, "--push", f"{registry}/bench/prod-ours-{stamp}:3", "--out",
                                     str(work / "out-changed"), "--lock", str(lock), "--toolchain", tools],
                                    env={"BAKERY_CACHE": str(cache)}, cwd=project)

    context = work / "context"
    (context / "files").mkdir(parents=True)
    for layer in rec["layers"]:
        with tarfile.open(work / "out" / "blobs" / "sha256" / layer["digest"].split(":")[1]) as tar:
            tar.extractall(context / "files", filter=lambda m, path: None if Path(m.name).name.startswith(".wh.") else m)
    (context / "Dockerfile").write_text(f"FROM {base}\nCOPY files/ /\n")
    cold_d = docker_way(base, f"{registry}/bench/prod-docker-{stamp}:1", context, True)
    warm_d = docker_way(base, f"{registry}/bench/prod-docker-{stamp}:2", context, False)
    fence = next(context.glob(f"files/{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py"))
    fence.write_text(fence.read_text() + "# (bench) changed\n")
    changed_d = docker_way(base, f"{registry}/bench/prod-docker-{stamp}:3", context, False)

    sizes = [l["size"] for l in rec["base"]["layers"]]
    print(f"base: {len(sizes)} layers, {sum(sizes) / 2**30:.2f} GiB compressed (largest {max(sizes) / 2**30:.2f} GiB)")
    print(f"floor (fetch + sha256 + gunzip every base layer once, one thread): {floor_s:6.2f}s "
          f"({floor_bytes / 2**30:.2f} GiB)")
    for name, a, b in (("cold", cold_s, cold_d), ("warm no-op", warm_s, warm_d), ("one overlay changed", changed_s,
                                                                                   changed_d)):
        print(f"{name:20s} invoke build+push {a:7.2f}s   docker {'pull+' if name == 'cold' else ''}build+push "
              f"{b:7.2f}s   docker/ours {b / a:5.2f}x")
    print(f"one overlay changed: `invoke lock` before the build (applies, proves the changed overlay, pins) "
          f"{lock_s:.2f}s; the build then finds its verdict cached")
    rec_changed = json.loads((work / "out-changed" / "build-record.json").read_text())
    same_layers = sum(a["digest"] == b["digest"] for a, b in zip(rec["layers"], rec_changed["layers"]))
    print(f"one overlay changed: {len(rec['layers']) - same_layers} of our {len(rec['layers'])} layers changed; "
          f"uploaded {rec_changed['push']['new_bytes_uploaded']} bytes (layers + config), base layers "
          f"{rec_changed['push']['base_bytes_uploaded']}")
    print(f"cold / floor: {cold_s / floor_s:.2f}x")
    print(f"peak RSS of our build: cold {cold_rss / 1024:.0f} MiB, warm {warm_rss / 1024:.0f} MiB, "
          f"changed {changed_rss / 1024:.0f} MiB")
    print(f"base bytes moved: ours cold {sum(sizes) if rec['layer_downloads'] else 0} streamed once per layer "
          f"({rec['layer_downloads']} layer reads), uploaded {rec['push']['base_bytes_uploaded']}; warm "
          f"{rec_warm['layer_downloads']} layer reads; docker cold pulls {sum(sizes)}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
