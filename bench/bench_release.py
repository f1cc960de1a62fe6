"""The release at production size, on the hosted runner's model: build and rebuild of a base that is
its own toolchain, as the real ROCm nightly is, measured against what an ubuntu-24.04 hosted runner
gives each job (14 GB on /, 66 GB on /mnt, the job's timeout), and against what the design before
it needed (the base pulled into Docker to compile in it).

The base: the stand-in toolchain image (Debian clang-19, ROCm device libraries, CPU torch), the
fixture's vLLM and AITER sources where the ROCm image keeps them, and --gib GiB of incompressible
bytes (default 10): 60% of them where a ROCm install keeps its kernel libraries
(opt/rocm-7.0.0/lib/rocblas/library, which hip/extensions.yaml leaves out of the toolchain's files),
40% as a library the toolchain's torch would load (opt/rocm-7.0.0/lib, taken), plus 200,000 small
files of a kernel database (opt/rocm-7.0.0/lib/hipblaslt/library, left out). That split is an
assumption about the real base, which cannot be pulled here; the "taken" share is what decides the
disk a job needs.

Printed: the rehearsal's job table (who each job ran as, its peak on / and /mnt, its seconds, each
against the budget), and `docker pull` of the same base: its seconds and what it added to Docker's
data root. Run as root: .venv/bin/python bench/bench_release.py [--gib=10]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.dev import fixture, rehearse, stack  # noqa: E402 (after sys.path names the project)
from bakery.errors import NotFound  # noqa: E402 (after sys.path names the project)
from bakery.oci.refs import Reference  # noqa: E402 (after sys.path names the project)
from bakery.oci.registry import Registry  # noqa: E402 (after sys.path names the project)

SPEC = ROOT / "tests" / "fixture" / "fixture.yaml"
GIB = int(next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--gib=")), "10"))
ROCM = "/opt/rocm-7.0.0"
MANY = ("import os; [open(f'" + ROCM + "/lib/hipblaslt/library/k{d}/{f}.co', 'wb').write(os.urandom(64)) "
        "for d in range(400) if not os.makedirs(f'" + ROCM + "/lib/hipblaslt/library/k{d}') for f in range(500)]")


def own_toolchain_base(registry: str, work: Path) -> Reference:
    """The production-shaped base, built by Docker once and kept in the registry by its tag."""
    target = f"{registry}/bench/release-base"
    tag = f"own-toolchain-{GIB}GiB"
    try:
        return Reference.parse(f"{target}@{Registry(registry).get_manifest(Reference.parse(f'{target}:{tag}'))[2]}")
    except NotFound:
        pass
    toolchain = fixture.toolchain(ROOT / "hip" / "toolchain", SPEC, registry, log=print)
    base = fixture.build(SPEC, registry, log=print)
    context = work / "base-context"
    context.mkdir(parents=True)
    left_out, taken = (GIB << 30) * 6 // 10, (GIB << 30) * 4 // 10
    (context / "Dockerfile").write_text(
        f"FROM {toolchain}\n"
        f"COPY --from={base} /usr/local/lib/python3.12 /usr/local/lib/python3.12\n"
        f"RUN mkdir -p {ROCM}/lib/rocblas/library && ln -s {ROCM} /opt/rocm\n"
        f"RUN head -c {left_out} /dev/urandom > {ROCM}/lib/rocblas/library/TensileLibrary_gfx942.dat\n"
        f"RUN head -c {taken} /dev/urandom > {ROCM}/lib/librocblas.so.4.standin\n"
        f"RUN python3 -c \"{MANY}\"\n")
    print(f"building the base ({GIB} GiB of bytes, 200,000 small files): minutes, once", file=sys.stderr)
    subprocess.run(["docker", "build", "-q", "-t", f"{target}:{tag}", str(context)], check=True)
    out = subprocess.run(["docker", "push", f"{target}:{tag}"], check=True, capture_output=True, text=True).stdout
    digest = [w for w in out.split() if w.startswith("sha256:")][0]
    subprocess.run(["docker", "rmi", f"{target}:{tag}"], capture_output=True)
    return Reference.parse(f"{target}@{digest}")


def docker_pull(base: Reference) -> tuple[float, int]:
    """(seconds, bytes added to Docker's data root) of pulling the base into Docker, from nothing."""
    root = subprocess.run(["docker", "info", "-f", "{{.DockerRootDir}}"], capture_output=True, text=True).stdout.strip()
    subprocess.run(["docker", "rmi", "-f", str(base)], capture_output=True)
    before = shutil.disk_usage(root).used
    start = time.monotonic()
    subprocess.run(["docker", "pull", "-q", str(base)], check=True, capture_output=True)
    seconds = time.monotonic() - start
    added = shutil.disk_usage(root).used - before
    subprocess.run(["docker", "rmi", "-f", str(base)], capture_output=True)
    return seconds, added


def main() -> None:
    registry = stack.up()
    work = Path(tempfile.mkdtemp(prefix="bakery-bench-release-"))
    try:
        base = own_toolchain_base(registry, work)
        started = time.monotonic()
        outcome = rehearse.release(ROOT, work / "rehearsals" / "release", log=lambda m: print(m, file=sys.stderr),
                                   base=base)
        total = time.monotonic() - started
        compressed = sum(d["size"] for d in __import__("json").loads(
            Registry(registry).get_manifest(base)[0])["layers"])
        print(f"base {base} ({compressed / 2**30:.2f} GiB compressed), its own toolchain; {GIB} GiB of bytes, "
              f"40% of them taken with the toolchain's files")
        print(outcome.table())
        print(f"rehearsal: {total:.0f} s in all; over budget: {outcome.over_budget() or 'nothing'}")
        seconds, added = docker_pull(base)
        build = outcome.jobs["build"]
        assert build.usage is not None, "the build job's disks were not sampled"
        print(f"docker pull of the base (the compile's way before): {seconds:.1f} s, {added / 1e9:.2f} GB added "
              f"under Docker's data root; the build job's peak on /mnt: {build.usage.peak['/mnt'] / 1e9:.2f} GB "
              f"({added / max(build.usage.peak['/mnt'], 1):.2f}x less)")
    except BaseException:
        print(f"kept for a look: {work}", file=sys.stderr)
        raise
    else:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
