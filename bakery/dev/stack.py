"""The local stack: a Docker engine and CNCF distribution registries on 127.0.0.1.

Started on demand by `invoke demo`, `invoke test`, the tests and .ci/run; never by a build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import requests

from ..errors import EnvironmentProblem
from ..files import one_at_a_time
from ..project import cache_dir

REGISTRY_PORT = 5000
PROJECT = Path(__file__).resolve().parents[2]  # the checkout: its .tools/ and scripts/


def state_dir() -> Path:
    path = Path(os.environ.get("BAKERY_STATE", cache_dir("stack")))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _docker_ok() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_dockerd(timeout: float = 60) -> None:
    """Start dockerd (detached) unless an engine already answers."""
    if _docker_ok():
        return
    with one_at_a_time(state_dir() / ".dockerd.lock"):  # another run may have started it meanwhile
        if not _docker_ok():
            _start_dockerd(timeout)


def _start_dockerd(timeout: float) -> None:
    if not shutil.which("dockerd"):
        raise EnvironmentProblem("no Docker engine answers and dockerd is not installed: "
                                 "run scripts/bootstrap.sh (apt-get install docker.io)")
    log = open(state_dir() / "dockerd.log", "ab")
    subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _docker_ok():
            return
        time.sleep(1)
    raise EnvironmentProblem(f"dockerd did not answer within {timeout:.0f}s: see {state_dir() / 'dockerd.log'}")


def registry_up(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/v2/", timeout=2).status_code in (200, 401)
    except requests.RequestException:
        return False


def registry_config(port: int, root: Path, auth: dict | None = None, collected: bool = False,
                    deletes: bool = True) -> str:
    """distribution's YAML config: filesystem storage, deletes allowed, listening on loopback only.
    collected: for a registry whose garbage is collected while it serves (garbage_collect): no blob
    descriptor cache, which would still answer for the blobs collected."""
    import yaml

    storage: dict = {"filesystem": {"rootdirectory": str(root)}, "delete": {"enabled": deletes}}
    if not collected:
        storage["cache"] = {"blobdescriptor": "inmemory"}
    config = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": storage,
        "http": {"addr": f"127.0.0.1:{port}", "secret": f"bakery-local-{port}"},
    }
    if auth:
        config["auth"] = auth
    return yaml.safe_dump(config, sort_keys=True)


def ensure_registry(port: int = REGISTRY_PORT, auth: dict | None = None, name: str | None = None,
                    timeout: float = 30, collected: bool = False, deletes: bool = True) -> str:
    """Start `docker-registry serve` on 127.0.0.1:port unless one answers; return host:port."""
    host = f"127.0.0.1:{port}"
    if registry_up(port):
        return host
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if not binary:
        raise EnvironmentProblem("docker-registry is not installed: run scripts/bootstrap.sh "
                                 "(apt-get install docker-registry)")
    with one_at_a_time(state_dir() / f".registry-{port}.lock"):
        if registry_up(port):  # started by another run meanwhile
            return host
        base = registry_dir(port, name)
        base.mkdir(parents=True, exist_ok=True)
        config = base / "config.yml"
        config.write_text(registry_config(port, base / "data", auth, collected, deletes))
        _start([binary, "serve", str(config)], base / "registry.log", lambda: registry_up(port),
               f"registry on {host}", timeout)
    return host


def registry_dir(port: int, name: str | None = None) -> Path:
    """Where a registry this stack starts keeps its config, log and storage (data/)."""
    return state_dir() / (name or f"registry-{port}")


def garbage_collect(port: int, name: str | None = None) -> str:
    """distribution's own `garbage-collect` over a registry this stack started (with collected=True):
    the blobs no manifest names are removed from its disk. What prune deletes is freed only then."""
    binary = shutil.which("docker-registry") or shutil.which("registry")
    config = registry_dir(port, name) / "config.yml"
    if not binary or not config.exists():
        raise EnvironmentProblem(f"no registry of this stack at {config}")
    done = subprocess.run([binary, "garbage-collect", str(config)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise EnvironmentProblem(f"garbage-collect {config}: {(done.stderr or done.stdout).strip()[-300:]}")
    return done.stdout


def _start(argv: list[str], log_path: Path, ready, what: str, timeout: float, env: dict | None = None) -> None:
    """Start a server detached, its output to log_path, and wait until ready() says it answers."""
    log = open(log_path, "ab")
    subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise EnvironmentProblem(f"{what} did not start: see {log_path}")


REFERRERS_PORT = 5012  # 5001-5004 are the tests' registries and token service


def ensure_referrers_registry(port: int = REFERRERS_PORT, timeout: float = 30) -> str:
    """Start go-containerregistry's registry (the OCI 1.1 referrers API on, blobs in memory, so a
    restart empties it) on 127.0.0.1:port unless one answers; return host:port. Built into .tools/
    by scripts/fetch-tools.sh: Debian's docker-registry 2.8 has no referrers API."""
    host = f"127.0.0.1:{port}"
    if registry_up(port):
        return host
    binary = PROJECT / ".tools" / "bin" / "referrers-registry"
    if not binary.exists():
        raise EnvironmentProblem(f"{binary} is missing: run scripts/fetch-tools.sh")
    with one_at_a_time(state_dir() / f".registry-{port}.lock"):
        if not registry_up(port):
            _start([str(binary), host], state_dir() / f"referrers-registry-{port}.log", lambda: registry_up(port),
                   f"the referrers registry on {host}", timeout)
    return host


SIGSTORE_PORT = 5013


def ensure_sigstore_stand_in(port: int = SIGSTORE_PORT, timeout: float = 30) -> Path:
    """Start the Sigstore stand-in (scripts/sigstore-stand-in: @sigstore/mock's Fulcio and Rekor on
    127.0.0.1:port) unless it answers; return the folder holding its trusted_root.json,
    signing_config.json and trust_config.json. Its keys are made at each start: a restart makes
    every bundle signed before it unverifiable against the new root, as a new trust root would."""
    folder = state_dir() / f"sigstore-{port}"
    ready = lambda: _answers(port) and (folder / "trust_config.json").exists()  # noqa: E731
    if ready():
        return folder
    modules = PROJECT / ".tools" / "sigstore" / "node_modules"
    if not (modules / ".bin" / "node").exists():
        raise EnvironmentProblem(f"{modules / '.bin' / 'node'} is missing: run scripts/fetch-tools.sh")
    # its folder is emptied before a start: never under a stand-in another run just started
    with one_at_a_time(state_dir() / f".sigstore-{port}.lock"):
        if ready():
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        _start([str(modules / ".bin" / "node"), str(PROJECT / "scripts" / "sigstore-stand-in" / "server.js"),
                str(port), str(folder)], state_dir() / f"sigstore-{port}.log", ready,
               f"the Sigstore stand-in on 127.0.0.1:{port}", timeout, env={**os.environ, "NODE_PATH": str(modules)})
    return folder


def _answers(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/", timeout=2)
        return True
    except requests.RequestException:
        return False


def up() -> str:
    """Engine and the default registry; returns the registry's host:port."""
    ensure_dockerd()
    return ensure_registry()
