"""invoke policy and deploy: what nodes enforce, and running one verified digest behind the proxy."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import BakeryError, InputError
from ..project import Project
from .trust_flags import load_policy


@dataclass(frozen=True)
class NodePolicy:
    path: Path  # policy.json
    files: tuple[str, ...]
    unenforced: str  # what nodes cannot check (smoke, rebuilds), or ""


def policy(project: Path, containers: str | None = None, policy=None, key=None, mirror=None, accept=None,
           k8s: str | None = None, smoke_key=None, rebuilder_key=None) -> NodePolicy:
    """--containers DIR: the node policy (podman, CRI-O); --k8s DIR: the admission policies
    (policy-controller, Kyverno). One of them."""
    from ..files import write_tree
    from ..release.deploy import admission, node_policy

    if bool(containers) == bool(k8s):
        raise InputError("say which policy: --containers DIR (a podman or CRI-O node) or --k8s DIR (admission "
                         "policies for policy-controller and Kyverno), one of them")
    if k8s and (mirror or accept):
        raise InputError("--mirror and --accept are for --containers: an admission policy checks only our "
                         "repositories and leaves other images to the cluster's own policies")
    if containers and (smoke_key or rebuilder_key):
        raise InputError("--smoke-key and --rebuilder-key are for --k8s: a node checks the release signature only")
    rules = load_policy(project, policy, {"release": [Path(k) for k in key or []],
                                          "smoke": [Path(k) for k in smoke_key or []],
                                          "rebuilder": [Path(k) for k in rebuilder_key or []]})
    if k8s:
        files = admission.admission_files(rules)
        write_tree(Path(k8s), files)
        return NodePolicy(Path(k8s), tuple(sorted(files)), "")
    assert containers is not None  # one of the two, checked above
    files = node_policy.containers_policy(rules, node_policy.parse_mirrors(mirror or []), accept=tuple(accept or ()))
    write_tree(Path(containers), files)
    return NodePolicy(Path(containers) / "policy.json", tuple(sorted(files)), node_policy.unenforced(rules))


@dataclass(frozen=True)
class Plan:
    """A deploy, checked before anything is verified or written: one digest, one proxy, one target."""
    image: str  # REPO@sha256:DIGEST
    proxy: str
    caddyfile: bytes
    spec: dict  # the compose file, read
    compose_file: Path
    compose: Path | None
    k8s: Path | None
    snapshot: str
    hostname: str
    email: str | None
    allow: tuple[str, ...]
    internal_tls: bool
    replicas: int


def plan(project: Path, image: str, proxy_image: str, hostname: str, allow=None, email=None, internal_tls=False,
         compose=None, snapshot=None, compose_file=None, k8s=None, replicas=1) -> Plan:
    """Every input checked (bad input first, before a registry is asked anything)."""
    import yaml

    from ..oci.refs import Reference
    from ..release.deploy import caddy as caddy_mod

    if bool(compose) == bool(k8s):
        raise InputError("say where: --compose DIR (this host) or --k8s DIR (manifests), one of them")
    if not snapshot:
        raise InputError("--snapshot DIR: the model snapshot's path on the nodes (mounted read-only)")
    image_ref = Reference.parse_pinned(image, "--image")  # one digest runs, never what a tag points to
    proxy_ref = Reference.parse_pinned(proxy_image, "--proxy-image")
    path = Path(compose_file) if compose_file else Project(project).compose_yaml
    spec = yaml.safe_load(path.read_text())
    caddy = caddy_mod.caddyfile(hostname, email, allow or [], "inference:8000", internal_tls)
    return Plan(str(image_ref), str(proxy_ref), caddy, spec, path, Path(compose) if compose else None,
                Path(k8s) if k8s else None, snapshot, hostname, email, tuple(allow or ()), internal_tls, int(replicas))


def deploy(project: Path, p: Plan) -> Path:
    """Write the manifests (--k8s), or the compose folder and `docker compose up -d`: the digest is
    verified before this is called."""
    from ..files import write_tree
    from ..release.deploy import k8s

    if p.k8s:
        files = k8s.k8s_manifests(p.image, p.proxy, p.replicas, p.spec, p.snapshot, p.hostname, p.email,
                                  list(p.allow), p.internal_tls)
        write_tree(p.k8s, files)
        return p.k8s
    assert p.compose is not None  # plan() takes exactly one of --compose and --k8s
    out = p.compose.resolve()
    settings = {"BAKERY_IMAGE": p.image, "BAKERY_PROXY_IMAGE": p.proxy, "MODEL_SNAPSHOT": p.snapshot,
                "BAKERY_DEPLOY_DIR": str(out)}
    write_tree(out, {".env": "".join(f"{k}={v}\n" for k, v in settings.items()).encode(),
                     "Caddyfile": p.caddyfile})
    # the verified values, also in the environment: compose lets an exported variable beat the env file
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")} | settings
    up = subprocess.run([*compose_command(project), "--project-directory", str(out), "--env-file", str(out / ".env"),
                         "-f", str(p.compose_file.resolve()), "up", "-d"], env=env)
    if up.returncode != 0:
        raise BakeryError(f"docker compose up failed (exit {up.returncode}); {out} holds what it was given")
    return out


def compose_command(project: Path) -> list[str]:
    """Docker's compose plugin, else a docker-compose binary (the checkout's .tools/ one last)."""
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return [shutil.which("docker-compose") or str(project / ".tools" / "bin" / "docker-compose")]
