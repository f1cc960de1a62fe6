"""What a build says of itself in its record: who ran it, from which source, with which tools.
The record's shape is bakery.trust.record."""

from __future__ import annotations

import os
import re
import sys
import zlib
from pathlib import Path

from .. import __version__
from ..trust.record import Builder


def tools() -> dict:
    """Versions that can change output bytes (zlib: gzip streams) or explain a build. (requests is
    no longer one: the registry client speaks HTTP through the standard library.)"""
    import yaml

    return {"bakery": __version__, "python": sys.version.split()[0], "zlib": zlib.ZLIB_RUNTIME_VERSION,
            "pyyaml": yaml.__version__, "platform": sys.platform}


def builder() -> Builder:
    """Who ran the build: the GitHub workflow run when in Actions, else `local`."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true":
        server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get("GITHUB_REPOSITORY", "")
        workflow = env.get("GITHUB_WORKFLOW_REF", f"{repo}/.github/workflows/release.yml@{env.get('GITHUB_REF', '')}")
        return Builder(f"{server}/{workflow}", f"{server}/{repo}/actions/runs/{env.get('GITHUB_RUN_ID')}/attempts/"
                                               f"{env.get('GITHUB_RUN_ATTEMPT', '1')}")
    return Builder("local", "local")


def source_repository(project: Path, git) -> str:
    """Where the source came from, as the builder can vouch for it: the Actions repository in CI,
    else the checkout's origin (in https form), else the checkout's own path."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_REPOSITORY"):
        return f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_REPOSITORY']}"
    try:
        url = git(project, "remote", "get-url", "origin")
    except Exception:
        return f"file://{project}"
    ssh = re.fullmatch(r"(?:ssh://)?git@([^:/]+)[:/](.+)", url)
    if ssh:
        url = f"https://{ssh.group(1)}/{ssh.group(2)}"
    elif "://" not in url:  # a clone of a local path: name it as a URI all the same
        url = (project / url).resolve().as_uri()
    return url.removesuffix(".git").rstrip("/")
