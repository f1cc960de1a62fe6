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
