"""Helpers the tests share: run invoke as a user does, copy the checkout, write a dev policy.
Fixtures live in conftest.py; tests import these from here, never from conftest."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_project(dest: Path, lock: bytes | None = None) -> Path:
    """A copy of this checkout (with .git, without outputs) somewhere else, locked to `lock`."""
    ignore = shutil.ignore_patterns("out", ".venv", ".tools", "__pycache__", ".pytest_cache", "*.egg-info", ".mypy_cache",
                                    ".ruff_cache")
    shutil.copytree(ROOT, dest, ignore=ignore, symlinks=True)
    if (dest / ".git").is_file():
        # a linked worktree's .git names the shared repository: a test's commit or `git remote` in
        # the copy would land on this checkout's branch and in the main checkout's config. The copy
        # gets a repository of its own instead, at the same commit, its files as copied
        (dest / ".git").unlink()
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dest / ".clone")], check=True)
        (dest / ".clone" / ".git").rename(dest / ".git")
        (dest / ".clone").rmdir()
        subprocess.run(["git", "-C", str(dest), "reset", "-q"], check=True)  # the index to HEAD; files untouched
    if lock is not None:
        (dest / "overlays" / "overlays.lock").write_bytes(lock)
    return dest


def cold_compile_cache(where: Path, with_toolchain: bool = False) -> Path:
    """This machine's caches without the compile outputs (proof verdicts and base files stay warm).
    with_toolchain, for a build that is to compile hip/ there: the toolchain's files taken out of its
    image come too, so the compile runs at once."""
    src = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    dest = where / "cache"
    for part in ("layers", "files", "proofs", "views"):
        if (src / part).exists():
            shutil.copytree(src / part, dest / part)
    if not with_toolchain:
        return dest
    # the toolchain's folder is 1.6 GiB: taking it out again (and deleting it after) cost each
    # cold compile a minute or more, and is no part of what these builds check. Hard links: seconds;
    # the compile reads it only (read-only to the sandbox's uid), so the machine's copy stays intact
    toolchain = os.environ.get("BAKERY_TOOLCHAIN", "")
    for made in sorted((src / "toolchains").glob("[!.]*/toolchain.json")):  # whole folders, no staging ones
        try:
            image = json.loads(made.read_text())["image"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if toolchain.endswith(image):  # the suite's toolchain (REF@sha256:...), not stale ones
            shutil.copytree(made.parent, dest / "toolchains" / made.parent.name, symlinks=True,
                            copy_function=os.link)
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
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"no stdout; stderr:\n{result.stderr}"
    return lines[-1]


def tags(registry: str, repo: str) -> dict[str, str]:
    """{tag: the digest it names} in registry/repo, asked of the plain-HTTP registry itself, not
    through bakery ({}: no such repository)."""
    import requests

    from bakery.oci.registry import ACCEPT

    listed = requests.get(f"http://{registry}/v2/{repo}/tags/list", timeout=30)
    if listed.status_code == 404:
        return {}
    listed.raise_for_status()
    found = {}
    for tag in listed.json().get("tags") or []:
        head = requests.head(f"http://{registry}/v2/{repo}/manifests/{tag}", headers={"Accept": ACCEPT}, timeout=30)
        head.raise_for_status()
        found[tag] = head.headers["Docker-Content-Digest"]
    return found


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
        reg.upload_blob(repo, desc, functools.partial(iter, [blob]))
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
    are), without what the engine makes in every container."""
    docker("pull", "-q", str(ref))
    made = docker("create", str(ref), "/bin/true").stdout.strip()
    try:
        proc = subprocess.Popen(["docker", "export", made], stdout=subprocess.PIPE)
        found = tar_view(proc.stdout)
        proc.wait()
    finally:
        docker("rm", made)
    # the engine's own: mount points it makes in every container
    for own in ("etc/hostname", "etc/hosts", "etc/resolv.conf", ".dockerenv"):
        found.pop(own, None)
    return {p: v for p, v in found.items() if p.split("/")[0] not in ("dev", "proc", "sys")}


CONTAINERD_SOCKETS = ("/run/containerd/containerd.sock", "/run/docker/containerd/containerd.sock")


def containerd_view(ref) -> dict[str, tuple]:
    """What containerd's own unpack of `ref` holds: `ctr` pulls it into a namespace of its own
    (the system's containerd, else the one dockerd starts) with containerd's applier and overlayfs
    snapshotter, then mounts the image's root read-only, the view a container of it starts from."""
    import tempfile

    socket = next((s for s in CONTAINERD_SOCKETS if Path(s).is_socket()), None)
    assert socket, f"no containerd socket at {' or '.join(CONTAINERD_SOCKETS)}"
    ctr = ["ctr", "--address", socket, "--namespace", "bakery-test"]
    subprocess.run([*ctr, "images", "pull", "--plain-http", "--platform", "linux/amd64", str(ref)],
                   check=True, capture_output=True, timeout=600)
    target = Path(tempfile.mkdtemp(prefix="bakery-ctr-"))
    subprocess.run([*ctr, "images", "mount", "--plain-http", str(ref), str(target)],
                   check=True, capture_output=True, timeout=600)
    try:
        return tree_of(target)
    finally:
        subprocess.run([*ctr, "images", "unmount", "--rm", str(target)], check=True, capture_output=True, timeout=120)
        target.rmdir()


def tar_view(stream) -> dict[str, tuple]:
    """A root filesystem written as a tar stream, in the view tree_of gives (hard links as the files
    they are: a tar writes each name's bytes once, then links to that earlier name)."""
    import hashlib
    import tarfile

    found: dict[str, tuple[str, str | None, bool]] = {}
    data_of: dict[str, str] = {}
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for m in tar:
            path = m.name.strip("/")
            if path.startswith("./"):
                path = path[2:]
            if not path or path == ".":
                continue
            if m.isdir():
                found[path] = ("dir", None, True)
            elif m.issym():
                found[path] = ("symlink", m.linkname, False)
            elif m.isfile():
                member = tar.extractfile(m)
                assert member is not None  # a regular file's
                digest = hashlib.sha256(member.read()).hexdigest()
                data_of[path] = digest
                found[path] = ("file", digest, bool(m.mode & 0o111))
            elif m.islnk():
                target = m.linkname.strip("/").removeprefix("./")
                found[path] = ("file", data_of.get(target), found.get(target, (0, 0, False))[2])
    return found


# the podman node: a debootstrapped Debian 13 minbase with podman 5, imported into Docker (Debian
# 12's podman is built without sigstore verification); podman runs in it on the vfs driver
NODE_SPEC = {"suite": "trixie", "debian_mirror": "http://deb.debian.org/debian",
             "include": ["podman", "ca-certificates", "fuse-overlayfs", "uidmap", "iptables"]}
PODMAN = "podman --storage-driver vfs --cgroup-manager cgroupfs --events-backend file"
NODE_FLAGS = ("--network", "host", "--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--security-opt",
              "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "-e", "PODMAN_IGNORE_CGROUPSV1_WARNING=1")


def podman_node() -> str:
    """The node's image tag in Docker, imported from its (cached) rootfs tar when not there yet."""
    from bakery.dev import fixture as fixture_mod

    tar = fixture_mod.rootfs_tar(NODE_SPEC, log=lambda m: None)
    tag = f"bakery-test-node:{tar.stem.rsplit('-', 1)[-1]}"
    if docker("image", "inspect", tag, check=False).returncode != 0:
        docker("import", str(tar), tag)
    return tag


def podman_views(registry: str, refs: dict, where: Path) -> dict[str, dict[str, tuple] | None]:
    """What podman (containers/storage) unpacks of each ref, {name: view, or None where podman
    refuses the image}: one node pulls them all from the plain-HTTP registry and writes each
    image's root, as its storage holds it, as a tar."""
    conf = where / "registries.conf"
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    out = where / "roots"
    out.mkdir()
    names = dict(enumerate(refs))
    script = "".join(
        f"{PODMAN} pull -q {refs[name]} >/dev/null 2>&1 && m=$({PODMAN} image mount {refs[name]}) && "
        f"tar -C \"$m\" --numeric-owner -cf /roots/{n}.part . && mv /roots/{n}.part /roots/{n}.tar; "
        for n, name in names.items())
    docker("run", "--rm", *NODE_FLAGS, "-v", f"{conf}:/etc/containers/registries.conf.d/50-test.conf:ro",
           "-v", f"{out}:/roots", podman_node(), "sh", "-c", script + "true")
    views: dict[str, dict[str, tuple] | None] = {}
    for n, name in names.items():
        if not (out / f"{n}.tar").exists():
            views[name] = None
            continue
        with open(out / f"{n}.tar", "rb") as stream:
            views[name] = tar_view(stream)
    return views


def tree_of(root: Path) -> dict[str, tuple]:
    """The same view of a folder of ours (base/extract.py's root)."""
    import hashlib
    import stat

    found: dict[str, tuple[str, str | None, bool]] = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            full = Path(folder) / name
            path = full.relative_to(root).as_posix()
            try:
                info = full.lstat()
            except FileNotFoundError:  # an overlay mount lists a whiteout in a folder only its upper has
                continue
            if stat.S_ISDIR(info.st_mode):
                found[path] = ("dir", None, True)
            elif stat.S_ISLNK(info.st_mode):
                found[path] = ("symlink", os.readlink(full), False)
            elif stat.S_ISREG(info.st_mode):
                found[path] = ("file", hashlib.sha256(full.read_bytes()).hexdigest(), bool(info.st_mode & 0o111))
    return found


BASE = "127.0.0.1:5000/fixture/vllm-openai-rocm@sha256:" + "b" * 64  # a base a hand-made smoke report names


def passing_report(ref: str, **over) -> dict:
    """The shape of a gate's PASSED, as signed: what verify reads of it."""
    return {"image": ref, "result": "PASSED", "reference": {"kind": "seed-stack", "image": BASE, "base": BASE.split("@")[1]},
            "ab": {"paths": [{"path": "dspark", "compared": 240, "differing": 0, "approved": 0},
                             {"path": "native", "compared": 240, "differing": 0, "approved": 0}],
                   "approvals_sha256": None},
            "checks": [{"name": "ab:dspark", "ok": True, "detail": "240 outputs compared, 0 differ (0 approved)"},
                       {"name": "speed:decode-1-stream", "ok": True, "detail": "172.4 tok/s against 151.74",
                        "figure": 172.4, "threshold": 151.74}],
            "passed": ["ab:dspark", "speed:decode-1-stream"], "failed": [], "same_base": True,
            "launched_container": True, "launched": {"candidate": True, "reference": True},
            "host": {"gfx_arch": "gfx942", "compute_units": 304}, **over}


def release_jobs() -> dict[str, dict]:
    """The release's jobs by id: release.yml's own, and in place of each job that calls a role
    workflow (build-and-sign.yml, rebuild.yml, smoke.yml), that workflow's jobs."""
    from bakery.dev.act_jobs import flat_jobs

    return {job_id: job for job_id, (_, job) in flat_jobs(ROOT / ".github" / "workflows" / "release.yml").items()}
