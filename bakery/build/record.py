"""The build record: every input and output by digest. SBOM and provenance are views of it."""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import zlib
from pathlib import Path

from .. import __version__
from ..oci.layer import write_blob

SCHEMA = "https://github.com/dsv4-mi300x/bakery/build-record/v1"


def tools() -> dict:
    """Versions that can change output bytes (zlib: gzip streams) or explain a build."""
    import requests
    import yaml

    return {"bakery": __version__, "python": platform.python_version(), "zlib": zlib.ZLIB_RUNTIME_VERSION,
            "requests": requests.__version__, "pyyaml": yaml.__version__, "platform": sys.platform}


def builder() -> dict:
    """Who ran the build: the GitHub workflow run when in Actions, else `local`."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true":
        server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get("GITHUB_REPOSITORY", "")
        workflow = env.get("GITHUB_WORKFLOW_REF", f"{repo}/.github/workflows/release.yml@{env.get('GITHUB_REF', '')}")
        return {"id": f"{server}/{workflow}",
                "invocation": f"{server}/{repo}/actions/runs/{env.get('GITHUB_RUN_ID')}/attempts/"
                              f"{env.get('GITHUB_RUN_ATTEMPT', '1')}"}
    return {"id": "local", "invocation": "local"}


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
    ssh = re.match(r"^(?:ssh://)?git@([^:/]+)[:/](.+)$", url)
    if ssh:
        url = f"https://{ssh.group(1)}/{ssh.group(2)}"
    elif "://" not in url:  # a clone of a local path: name it as a URI all the same
        url = (project / url).resolve().as_uri()
    return url.removesuffix(".git").rstrip("/")


def write(path: Path, record: dict) -> None:
    write_blob(path, json.dumps(record, indent=2, sort_keys=True).encode() + b"\n")


def read(path: Path) -> dict:
    from ..schema import load_json

    return load_json(path, SCHEMA, "build record", "run `invoke build` first (or pass --record)")
