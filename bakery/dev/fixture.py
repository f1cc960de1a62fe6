"""The fixture base: built by Docker from a debootstrap userland and real PyPI wheels.

Nothing here is written by bakery's own image writer: the point of the fixture is to be an
independent, real image for the build to consume.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from .. import project, schema
from ..engine import docker_client
from ..errors import EnvironmentProblem, IntegrityError
from ..files import one_at_a_time
from ..oci.refs import Reference

SPEC_KEYS = {"suite": str, "debian_mirror": str, "include": list, "site_packages": str,
             "wheels": list, "keep_suffixes": list, "repository": str, "files": list}
WHEEL_KEYS = {"name": str, "file": str, "sha256": str}
FILE_KEYS = {"path": str, "source": str, "sha256": str}  # an upstream file the wheels lack, vendored


def cache_dir() -> Path:
    path = project.cache_dir("fixture")
    path.mkdir(parents=True, exist_ok=True)
    return path


P = ParamSpec("P")
R = TypeVar("R")


def _one_build_at_a_time(make: Callable[P, R]) -> Callable[P, R]:
    """One fixture build, toolchain build, debootstrap or wheel download at a time on this machine:
    two test runs side by side share their folder names (a wrong wheel is deleted: never another
    run's half-written one). The lock lets its holder in again (build() calls rootfs_tar())."""
    @functools.wraps(make)
    def locked(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_at_a_time(cache_dir() / ".build.lock"):
            return make(*args, **kwargs)
    return locked


def load_spec(path: Path) -> dict:
    spec = schema.load_yaml(path, SPEC_KEYS, required=set(SPEC_KEYS) - {"files"})
    for i, wheel in enumerate(spec["wheels"]):
        schema.check_keys(wheel, WHEEL_KEYS, f"{path}: wheels[{i}]")
    for i, item in enumerate(spec.setdefault("files", [])):
        schema.check_keys(item, FILE_KEYS, f"{path}: files[{i}]")
        if not item["path"].strip() or ".." in Path(item["path"]).parts or Path(item["path"]).is_absolute():
            raise IntegrityError(f"{path}: files[{i}].path must name a file under site_packages: {item['path']!r}")
    return spec


def vendored(spec_path: Path, item: dict) -> bytes:
    """A vendored upstream file's bytes, checked against the sha256 the spec names."""
    data = (spec_path.parent / item["source"]).read_bytes()
    if hashlib.sha256(data).hexdigest() != item["sha256"]:
        raise IntegrityError(f"{spec_path}: {item['source']} is not the file whose sha256 the spec names")
    return data


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@_one_build_at_a_time
def rootfs_tar(spec: dict, log) -> Path:
    """debootstrap a minbase userland once; cached by suite and package list."""
    key = hashlib.sha256(f"{spec['suite']} {sorted(spec['include'])}".encode()).hexdigest()[:16]
    tar_path = cache_dir() / f"rootfs-{spec['suite']}-{key}.tar"
    if tar_path.exists():
        return tar_path
    if not shutil.which("debootstrap"):
        raise EnvironmentProblem("debootstrap is not installed: run scripts/bootstrap.sh")
    root = cache_dir() / f"rootfs-{key}.partial"
    shutil.rmtree(root, ignore_errors=True)
    log(f"debootstrap {spec['suite']} minbase with {', '.join(spec['include'])} (about a minute)")
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(spec['include'])}",
           spec["suite"], str(root), spec["debian_mirror"]]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise EnvironmentProblem(f"debootstrap failed: {result.stderr.strip()[-400:]}")
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (root / junk).glob("*"):
            if p.is_file():
                p.unlink()
    partial = tar_path.with_suffix(".partial")
    subprocess.run(["tar", "--numeric-owner", "--exclude=./dev/*", "--exclude=./proc/*", "--exclude=./sys/*",
                    "-C", str(root), "-cf", str(partial), "."], check=True)
    os.replace(partial, tar_path)
    shutil.rmtree(root, ignore_errors=True)
    return tar_path


@_one_build_at_a_time
def wheel(spec_wheel: dict, log) -> Path:
    """Download one pinned wheel from PyPI (once) and check its sha256."""
    dest = cache_dir() / "wheels" / spec_wheel["file"]
    if not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        version = spec_wheel["file"].split("-")[1]
        log(f"pip download {spec_wheel['name']}=={version}")
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary",
                                 ":all:", "-d", str(dest.parent), f"{spec_wheel['name']}=={version}"],
                                capture_output=True, text=True)
        if result.returncode != 0 or not dest.exists():
            raise EnvironmentProblem(f"pip download {spec_wheel['name']} failed: {result.stderr.strip()[-400:]}")
    found = _sha256(dest)
    if found != spec_wheel["sha256"]:
        dest.unlink()
        raise IntegrityError(f"wheel {dest.name}: sha256 {found}, fixture.yaml pins {spec_wheel['sha256']}")
    return dest


def unpack_wheel(path: Path, dest: Path, keep_suffixes: tuple[str, ...]) -> int:
    """Unpack sources, data and dist-info of a wheel the way pip lays them out."""
    count = 0
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            name = info.filename
            if info.is_dir() or ".." in name.split("/"):
                continue
            if ".dist-info/" not in name and not name.endswith(keep_suffixes):
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
            count += 1
    return count


@_one_build_at_a_time
def build(spec_path: Path, registry: str, log=print) -> Reference:
    """Build the fixture with Docker, push it to registry, return REF@digest."""
    import docker

    spec = load_spec(spec_path)
    rootfs = rootfs_tar(spec, log)
    wheels = [wheel(w, log) for w in spec["wheels"]]
    dockerfile = spec_path.parent / "Dockerfile"
    key = hashlib.sha256()
    for part in [dockerfile.read_bytes(), rootfs.name.encode(), spec_path.read_bytes(),
                 *(vendored(spec_path, item) for item in spec["files"])]:
        key.update(part)
    tag = key.hexdigest()[:16]
    target = f"{registry}/{spec['repository']}"
    client = docker_client()
    try:
        client.images.get(f"{target}:{tag}")
        log(f"fixture image {target}:{tag} is cached")
    except docker.errors.ImageNotFound:
        context = cache_dir() / f"context-{tag}"
        shutil.rmtree(context, ignore_errors=True)
        site = context / "dist-packages"
        site.mkdir(parents=True)
        for w in wheels:
            n = unpack_wheel(w, site, tuple(spec["keep_suffixes"]))
            log(f"unpacked {n} files from {w.name}")
        for item in spec["files"]:  # what the wheels lack: never in place of a file of theirs
            if (site / item["path"]).exists():
                raise IntegrityError(f"{spec_path}: {item['path']} is a wheel's file already; files: adds only") from None
            (site / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (site / item["path"]).write_bytes(vendored(spec_path, item))
        os.link(rootfs, context / "rootfs.tar") if rootfs.stat().st_dev == context.stat().st_dev \
            else shutil.copy(rootfs, context / "rootfs.tar")
        shutil.copy(dockerfile, context / "Dockerfile")
        log(f"docker build {target}:{tag}")
        try:
            client.images.build(path=str(context), tag=f"{target}:{tag}", rm=True, forcerm=True)
        except docker.errors.BuildError as e:
            raise EnvironmentProblem(f"docker build of the fixture failed: {e}") from None
        finally:
            shutil.rmtree(context, ignore_errors=True)
    log(f"docker push {target}:{tag}")
    digest = None
    for line in client.images.push(target, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise EnvironmentProblem(f"docker push {target}:{tag} failed: {line['error']}")
        digest = (line.get("aux") or {}).get("Digest") or digest
    if not digest:
        raise EnvironmentProblem(f"docker push {target}:{tag} reported no digest")
    return Reference.parse(f"{target}@{digest}")


@_one_build_at_a_time
def toolchain(dockerfile_dir: Path, spec_path: Path, registry: str, log=print) -> str:
    """The stand-in HIP toolchain image (Debian clang-19 + ROCm device libs + CPU torch) in
    `registry`, pinned (REF@sha256:...), as the ROCm base is in production: a compile takes its
    files from its layers. Built by Docker and pushed once; found in the registry after that."""
    from ..errors import NotFound
    from ..oci.registry import Registry

    spec = load_spec(spec_path)
    rootfs = rootfs_tar(spec, log)
    # torch and what it imports, downloaded here: build containers may not reach PyPI over TLS
    wheels = cache_dir() / "toolchain-wheels"
    if not list(wheels.glob("torch-2.13.0*.whl")):
        log("pip download torch==2.13.0 and its dependencies (for headers and libraries)")
        result = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:",
                                 "-d", str(wheels), "torch==2.13.0"], capture_output=True, text=True)
        if result.returncode != 0:
            raise EnvironmentProblem(f"pip download torch==2.13.0 failed: {result.stderr.strip()[-400:]}")
    torch_wheel = sorted(wheels.glob("torch-2.13.0*.whl"))[0]
    dockerfile = dockerfile_dir / "Dockerfile"
    key = hashlib.sha256(dockerfile.read_bytes() + rootfs.name.encode() + torch_wheel.name.encode()).hexdigest()[:16]
    target = Reference.parse(f"{registry}/bakery/toolchain:{key}")
    try:  # pushed before (the cold benches prune Docker's images; the registry keeps it)
        return str(target.with_digest(Registry(registry).get_manifest(target)[2]))
    except NotFound:
        pass
    tag = f"bakery-toolchain:{key}"
    _build_toolchain(tag, key, dockerfile, rootfs, wheels, log)
    client = docker_client()
    client.images.get(tag).tag(target.name, key)
    log(f"docker push {target}")
    digest = None
    for line in client.images.push(target.name, tag=key, stream=True, decode=True):
        if "error" in line:
            raise EnvironmentProblem(f"docker push {target} failed: {line['error']}")
        digest = (line.get("aux") or {}).get("Digest") or digest
    if not digest:
        raise EnvironmentProblem(f"docker push {target} reported no digest")
    return f"{target.name}@{digest}"


def _build_toolchain(tag: str, key: str, dockerfile: Path, rootfs: Path, wheels: Path, log) -> None:
    import docker

    client = docker_client()
    try:
        client.images.get(tag)
        return
    except docker.errors.ImageNotFound:
        pass
    context = cache_dir() / f"toolchain-{key}"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    (context / "wheels").mkdir()
    for src, name in [(rootfs, "rootfs.tar")] + [(w, f"wheels/{w.name}") for w in wheels.glob("*.whl")]:
        try:
            os.link(src, context / name)
        except OSError:
            shutil.copy(src, context / name)
    shutil.copy(dockerfile, context / "Dockerfile")
    log(f"docker build {tag} (clang-19, ROCm device libs, torch headers: a few minutes, once)")
    try:
        client.images.build(path=str(context), tag=tag, rm=True, forcerm=True)
    except docker.errors.BuildError as e:
        tail = "".join(chunk.get("stream", "") for chunk in e.build_log).strip().splitlines()[-15:]
        raise EnvironmentProblem(f"docker build of the toolchain failed: {e}\n" + "\n".join(tail)) from None
    finally:
        shutil.rmtree(context, ignore_errors=True)
