"""Helpers the tests share: run invoke as a user does, copy the checkout, write a dev policy.
Fixtures live in conftest.py; tests import these from here, never from conftest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_project(dest: Path, lock: bytes | None = None) -> Path:
    """A copy of this checkout (with .git, without outputs) somewhere else, locked to `lock`."""
    ignore = shutil.ignore_patterns("out", ".venv", ".tools", "__pycache__", ".pytest_cache", "*.egg-info")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    if lock is not None:
        (dest / "overlays" / "overlays.lock").write_bytes(lock)
    return dest


def cold_compile_cache(where: Path) -> Path:
    """This machine's caches without the compile outputs (proof verdicts and base files stay warm)."""
    src = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    dest = where / "cache"
    for part in ("layers", "files", "proofs", "views"):
        if (src / part).exists():
            shutil.copytree(src / part, dest / part)
    return dest


def dev_policy(path: Path, base, **over) -> Path:
    """A verification policy for images built here: any local checkout, builder `local`, dirty
    allowed (test copies rewrite the lock), signatures naming this machine's registries."""
    import yaml

    doc = {"allowed_sources": ["*"], "allowed_builders": ["local"],
           "allowed_repositories": ["127.0.0.1:*/*", "ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x"],
           "allow_dirty": True, "base": str(base), **over}
    path.write_text(yaml.safe_dump(doc))
    return path


def invoke(project: Path, *args: str, env: dict | None = None, cwd: Path | None = None,
           umask: int | None = None) -> subprocess.CompletedProcess:
    """Run `invoke` the way a user does, in a fresh process."""
    full_env = {**os.environ, **(env or {})}
    preexec = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), *args],
                          cwd=cwd or project, env=full_env, capture_output=True, text=True,
                          preexec_fn=preexec, timeout=900)


def last_line(result: subprocess.CompletedProcess) -> str:
    lines = [l for l in result.stdout.splitlines() if l.strip()]
    assert lines, f"no stdout; stderr:\n{result.stderr}"
    return lines[-1]


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=600)


def push_image(registry: str, repo: str, layers: list[bytes], config: dict | None = None, tag: str = "latest"):
    """An image of these uncompressed tar layers (gzip'd here), pushed to the local registry as
    Docker would push it: its Reference by digest. For crafted layers an engine then judges."""
    import gzip
    import json

    from bakery.oci.refs import Descriptor, Reference
    from bakery.oci.registry import OCI_MANIFEST, Registry

    reg = Registry(registry)
    config = dict(config or {"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin:/bin"]}})
    config["rootfs"] = {"type": "layers", "diff_ids": [str(Descriptor.of("", raw).digest) for raw in layers]}
    descs = []
    for raw in layers:
        blob = gzip.compress(raw, mtime=0)
        desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
        reg.upload_blob(repo, desc, lambda b=blob: iter([b]))
        descs.append(desc)
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of("application/vnd.oci.image.config.v1+json", cfg)
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg_desc.to_json(),
                           "layers": [d.to_json() for d in descs]}).encode()
    return Reference(registry, repo, None, reg.put_manifest(repo, tag, manifest, OCI_MANIFEST))


def docker_export(ref) -> dict[str, tuple]:
    """What Docker's container of `ref` holds, as `docker export` writes it: {path: (kind, sha256 or
    link target, executable)} for folders, regular files and links (hard links as the files they
    are: an export writes each name's bytes or a link to an earlier name)."""
    import hashlib
    import tarfile

    docker("pull", "-q", str(ref))
    made = docker("create", str(ref), "/bin/true").stdout.strip()
    try:
        proc = subprocess.Popen(["docker", "export", made], stdout=subprocess.PIPE)
        found, data_of = {}, {}
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for m in tar:
                path = m.name.strip("/")
                if path.startswith("./"):
                    path = path[2:]
                if not path or path.split("/")[0] in ("dev", "proc", "sys", "etc/hostname"):
                    continue
                if m.isdir():
                    found[path] = ("dir", None, True)
                elif m.issym():
                    found[path] = ("symlink", m.linkname, False)
                elif m.isfile():
                    digest = hashlib.sha256(tar.extractfile(m).read()).hexdigest()
                    data_of[path] = digest
                    found[path] = ("file", digest, bool(m.mode & 0o111))
                elif m.islnk():
                    target = m.linkname.strip("/")
                    found[path] = ("file", data_of.get(target), found.get(target, (0, 0, False))[2])
        proc.wait()
    finally:
        docker("rm", made)
    # the engine's own: /etc/hostname, hosts and resolv.conf are mount points it makes in every container
    for own in ("etc/hostname", "etc/hosts", "etc/resolv.conf", ".dockerenv"):
        found.pop(own, None)
    return found


def tree_of(root: Path) -> dict[str, tuple]:
    """The same view of a folder of ours (base/extract.py's root)."""
    import hashlib
    import stat

    found = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            full = Path(folder) / name
            path = full.relative_to(root).as_posix()
            info = full.lstat()
            if stat.S_ISDIR(info.st_mode):
                found[path] = ("dir", None, True)
            elif stat.S_ISLNK(info.st_mode):
                found[path] = ("symlink", os.readlink(full), False)
            elif stat.S_ISREG(info.st_mode):
                found[path] = ("file", hashlib.sha256(full.read_bytes()).hexdigest(), bool(info.st_mode & 0o111))
    return found

