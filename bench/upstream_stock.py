"""Are the stock bytes we keep (overlays/stock/) the upstream file at each overlay's registered ref?

Usage: python bench/upstream_stock.py URL=GITDIR [URL=GITDIR ...]
  e.g. https://github.com/ROCm/aiter=/path/to/aiter.git (a clone, or a bare git directory)

For each overlay whose upstream repository is given: the registered stock (overlays.lock's
base_sha256) against `REF:PATH` of that repository, and every port's stock against the commits
that hold those exact bytes (git's own blob id, found with `log --find-object`). Prints a Markdown
table for overlays/README.md: same, or how they differ (the lines changed), or where else the bytes
are found. Reads git only; no network (bring the repository here first). Overlays whose repository
is not given are listed as not checked. Exits 1 where a registered stock differs from upstream, or a
kept stock is missing or not the bytes its name says.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.inputs import overlays as overlays_mod  # noqa: E402


def git(gitdir: str, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], input=data, capture_output=True)


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def where(gitdir: str, data: bytes, path: str) -> str:
    """The tags whose tree holds these bytes at path; else the commit that brought them."""
    wanted = blob_id(data)
    tags = git(gitdir, "for-each-ref", "--format=%(refname:short)", "refs/tags").stdout.decode().split()
    asked = "".join(f"{t}:{path}\n" for t in tags).encode()
    listed = git(gitdir, "cat-file", "--batch-check=%(objectname)", data=asked).stdout.decode().splitlines()
    holding = [t for t, line in zip(tags, listed, strict=True) if line.split()[0] == wanted]
    if holding:
        return "the bytes of " + ", ".join(holding)
    found = git(gitdir, "log", "--all", "--reverse", "--format=%H", f"--find-object={wanted}", "--", path)
    commits = found.stdout.decode().split()
    return f"brought by commit {commits[0][:12]}, in no tag" if commits else "in no commit of the repository"


def compare(gitdir: str, ref: str, path: str, data: bytes) -> str:
    shown = git(gitdir, "show", f"{ref}:{path}")
    if shown.returncode != 0:
        return f"{path} is not at {ref}"
    if shown.stdout == data:
        commit = git(gitdir, "rev-parse", f"{ref}^{{commit}}").stdout.decode().strip()
        return f"same as {ref} ({commit[:12]})"
    import difflib

    a, b = shown.stdout.decode(errors="replace").splitlines(), data.decode(errors="replace").splitlines()
    changed = sum(1 for line in difflib.unified_diff(a, b, n=0, lineterm="")
                  if line[:1] in "+-" and not line.startswith(("+++", "---")))
    return f"DIFFERS from {ref}: {changed} lines added or removed; these bytes are {where(gitdir, data, path)}"


def main(pairs: list[str]) -> int:
    repos = dict(p.split("=", 1) for p in pairs)
    failed = 0
    lock = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    locked = {e["id"]: e["base_sha256"] for e in lock["overlays"]}
    print("| overlay | registered | stock | upstream |\n|---|---|---|---|")
    for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml"):
        repo, ref, path = (str(o.upstream.get(k, "")) for k in ("repo", "ref", "path"))
        shas = ([locked[o.id]] if o.id in locked else []) + [sha for sha, _, _ in o.ports]
        if not shas:
            continue
        for sha in shas:
            stock = ROOT / "overlays" / "stock" / sha
            data = stock.read_bytes() if stock.is_file() else None
            if repo not in repos:
                said = f"not checked: {repo} is not here"
            elif data is None or hashlib.sha256(data).hexdigest() != sha:
                said = "MISSING: no stock bytes under that sha256" if data is None else "CORRUPT: not the bytes its name says"
            elif sha == locked.get(o.id):
                said = compare(repos[repo], ref, path, data)
            else:
                said = f"a port's stock: {where(repos[repo], data, path)}"
            failed += said.split(":")[0] in ("MISSING", "CORRUPT") or said.startswith(("DIFFERS", f"{path} is not"))
            print(f"| {o.id} | {ref} | {sha[:12]} | {said} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
