"""What a rehearsal sets up before act starts: the local stack and fixture base, keys of its own,
a registry with basic auth standing in for GHCR, a bare origin standing in for GitHub's git hosting,
a clone of HEAD with the one commit a user makes once (the fixture base pinned, the local repository
allowed), and the runner's HOME whose git config sends the repository's GitHub URL to that origin."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvironmentProblem

REPOSITORY = "dsv4-mi300x/bakery"  # what the policy's allowed_sources names
IMAGE_NAME = "vllm-dsv4-flash-mi300x"
REGISTRY_PORT = 5010

KEYLESS_WORKFLOWS = {"release": "build-and-sign.yml", "rebuilder": "rebuild.yml", "smoke": "smoke.yml"}
COMMITTER = {"GIT_AUTHOR_NAME": "rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@localhost",
             "GIT_COMMITTER_NAME": "rehearsal", "GIT_COMMITTER_EMAIL": "rehearsal@localhost"}


@dataclass
class Stage:
    """What a release rehearsal sets up before act starts."""
    work: Path
    repo: Path
    origin: Path
    base: object
    toolchain: str | None  # None: the base is its own toolchain
    registry: tuple[str, str, str]
    keys: Path
    image_repo: str
    lock: bytes


def stage_release(project: Path, work: Path, log, base=None, trusted_root: Path | None = None) -> Stage:
    """Stack, fixture base and toolchain, keys, a bare origin, and a clone of HEAD with the
    rehearsal commit (the fixture pinned, the local repository allowed), for the rehearsal to tag.
    With `base` (a pinned Reference of a base that is its own toolchain, as the ROCm nightly is),
    that base instead, and no BAKERY_TOOLCHAIN: the jobs compile over the base's own files. With
    `trusted_root` (a Sigstore's trusted_root.json), the policy names each role's workflow identity
    under keyless.roles, as a user who signs keyless writes it once."""
    import yaml

    from . import fixture, stack

    registry = stack.up()
    spec = project / "tests" / "fixture" / "fixture.yaml"
    toolchain = None
    if base is None:
        base = fixture.build(spec, registry, log=log)
        toolchain = fixture.toolchain(project / "hip" / "toolchain", spec, registry, log=log)
    host, user, password = auth_registry(work)
    keys_dir = _keys(work, "rehearsal-" + password[:8])
    origin, repo = work / "origin.git", work / "repo"
    git("init", "-q", "--bare", str(origin), cwd=work)
    git("clone", "-q", "--no-hardlinks", str(project), str(repo), cwd=work)
    lock = _fixture_lock(repo, base, work.parent, log)  # HEAD's overlays, as the clone has them
    git("remote", "set-url", "origin", f"https://github.com/{REPOSITORY}.git", cwd=repo)
    # a repository of its own: another rehearsal's kernel artifact, signed by its keys, is not this one's
    image_repo = f"{host}/rehearsal-{work.name}-{secrets.token_hex(3)}/{IMAGE_NAME}"
    base_yaml = repo / "image" / "base.yaml"
    doc = yaml.safe_load(base_yaml.read_text())
    doc["image"] = str(base)
    base_yaml.write_text("# rehearsal: the local fixture base stands in for the pinned nightly\n"
                         + yaml.safe_dump(doc, sort_keys=False))
    (repo / "overlays" / "overlays.lock").write_bytes(lock)
    policy_path = repo / "provenance" / "policy.yaml"
    policy = yaml.safe_load(policy_path.read_text())
    policy["allowed_repositories"] = [*policy["allowed_repositories"], image_repo]
    if trusted_root is not None:
        shutil.copy(trusted_root, repo / "provenance" / "sigstore-trusted-root.json")
        policy["keyless"] = {"trusted_root": "sigstore-trusted-root.json", "roles": {
            role: {"issuer": "https://token.actions.githubusercontent.com", "repository": REPOSITORY,
                   "workflow": f".github/workflows/{workflow}", "ref": "refs/tags/v*"}
            for role, workflow in KEYLESS_WORKFLOWS.items()}}
    policy_path.write_text("# rehearsal: the local registry stands in for GHCR\n" + yaml.safe_dump(policy, sort_keys=False))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "rehearsal: pin the local fixture base, allow the local registry", cwd=repo, env=COMMITTER)
    return Stage(work, repo, origin, base, toolchain, (host, user, password), keys_dir, image_repo, lock)


def fresh(work: Path) -> Path:
    """An empty folder for one rehearsal (the shared caches, keys and wheels sit beside it)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


def runner_home(work: Path, origin: Path, repository: str) -> Path:
    """The runner's HOME: a git config sending the repository's GitHub URL to the bare origin."""
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text(
        f'[url "{origin.as_uri()}"]\n\tinsteadOf = https://github.com/{repository}\n'
        "[safe]\n\tdirectory = *\n[protocol \"file\"]\n\tallow = always\n")
    return home


def auth_registry(work: Path) -> tuple[str, str, str]:
    """(host, user, password) of a registry demanding basic auth: GHCR's stand-in."""
    from . import stack

    state = stack.state_dir() / "registry-rehearsal"
    state.mkdir(parents=True, exist_ok=True)
    secret = state / "password"
    if not secret.exists():
        with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(16))
    password = secret.read_text().strip()
    htpasswd = state / "htpasswd"
    made = shutil.which("htpasswd") and subprocess.run(["htpasswd", "-Bbn", "rehearsal", password],
                                                       capture_output=True, text=True)
    if not made or made.returncode != 0:
        raise EnvironmentProblem("htpasswd failed (apache2-utils; scripts/bootstrap.sh installs it)")
    htpasswd.write_text(made.stdout)
    host = stack.ensure_registry(REGISTRY_PORT, auth={"htpasswd": {"realm": "rehearsal", "path": str(htpasswd)}},
                                 name="registry-rehearsal")
    return host, "rehearsal", password


def _keys(work: Path, password: str) -> Path:
    from ..trust import keys

    where = work / "keys"
    with scoped_environ(BAKERY_KEY_PASSWORD=password):
        for role in ("release", "smoke", "rebuilder"):
            if not (where / f"{role}.key").exists():
                keys.generate(where, role)
    return where


def _fixture_lock(project: Path, base, work: Path, log) -> bytes:
    """overlays.lock for this machine's fixture base, computed with proofs by `invoke lock`, kept by
    the base's digest and the overlays' bytes."""
    inputs = hashlib.sha256(str(base).encode())
    for path in sorted(p for p in (project / "overlays").rglob("*") if p.is_file() and p.name != "overlays.lock"):
        inputs.update(path.relative_to(project).as_posix().encode() + b"\0" + path.read_bytes())
    lock = work / f"fixture-overlays-{inputs.hexdigest()[:16]}.lock"
    if not lock.exists():
        log(f"locking the overlays against the base {base} (proofs run)")
        done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), "lock", "--base",
                               str(base), "--lock", str(lock)], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "BAKERY_TOOLCHAIN"})
        if done.returncode != 0:
            raise EnvironmentProblem(f"invoke lock on the base: {done.stderr.strip().splitlines()[-1:]}")
    return lock.read_bytes()


def git(*args: str, cwd: Path, env: dict | None = None) -> str:
    """git in a repository of the rehearsal's own (the runner's user owns some once act has run)."""
    done = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise EnvironmentProblem(f"git {' '.join(args[:2])}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return done.stdout.strip()


@contextmanager
def scoped_environ(**values):
    """os.environ with these values for the block (bakery reads keys and credentials from it), as it
    was after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
