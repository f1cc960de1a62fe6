"""The upstream registry as the tracker reads it: its tags (paginated) and what each base says it is."""

from __future__ import annotations

import json
import re
import urllib.parse

from ...errors import NotFound, RegistryError, malformed
from ...oci.registry import Registry, pull
from .ledger import Version

SITE = "usr/local/lib/python3.12/dist-packages"  # where the ROCm image installs vLLM and AITER
VERSION_FILES = {"vllm": f"{SITE}/vllm/_version.py", "aiter": f"{SITE}/aiter/_version.py"}
PAGE = 100  # tags asked for per page
MAX_PAGES = 1000


def list_tags(registry: Registry, repo: str, page: int = PAGE) -> list[str]:
    """Every tag of repo, following the `Link: <...>; rel="next"` pages; a page that breaks off, a
    link that leaves the listing, or a tag listed twice is an error, never a shorter list."""
    tags: list[str]
    path, tags = f"/v2/{repo}/tags/list?n={page}", []
    for n in range(1, MAX_PAGES + 1):
        try:
            resp = registry.transport.request("GET", path, scopes=pull(repo))
        except NotFound:
            if n == 1:
                raise NotFound(f"{registry.name}/{repo} lists no tags (404): check the repository name") from None
            raise RegistryError(f"the tag list of {registry.name}/{repo} broke off at page {n} ({path} answered "
                                f"404 after {len(tags)} tags); nothing recorded: retry later") from None
        with malformed(f"page {n} of the tag list of {registry.name}/{repo}", RegistryError):
            doc = json.loads(resp.content)
            listed = doc["tags"] or []
            if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
                raise TypeError("tags is not a list of strings")
        bad = next((t for t in listed if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}", t)), None)
        repeated = set(listed) & set(tags) or len(set(listed)) != len(listed)
        if bad is not None or repeated:
            raise RegistryError(f"the tag list of {registry.name}/{repo} is not a listing: page {n} "
                                + (f"holds {bad[:80]!r}, not a tag" if bad is not None else "repeats tags")
                                + "; nothing recorded (the registry is broken or hostile)")
        tags += listed
        next_path = _next_page(resp.headers.get("Link"), registry, repo)
        if next_path is None:
            return tags
        path = next_path
    raise RegistryError(f"the tag list of {registry.name}/{repo} goes on past {MAX_PAGES} pages: refused")


def _next_page(link: str | None, registry: Registry, repo: str) -> str | None:
    if not link:
        return None
    m = re.search(r'<([^>]*)>\s*;\s*rel="?next"?', link)
    if not m:
        return None
    url = urllib.parse.urlsplit(urllib.parse.urljoin(registry.transport.base + "/", m.group(1)))
    if (url.scheme and f"{url.scheme}://{url.netloc}" != registry.transport.base) or \
            url.path != f"/v2/{repo}/tags/list":
        raise RegistryError(f"the tag list of {registry.name}/{repo} links its next page to {m.group(1)[:120]!r}, "
                            f"outside the listing: refused (the registry is broken or hostile)")
    return f"{url.path}?{url.query}"


def read_versions(files: dict) -> dict[str, Version]:
    """vLLM's and AITER's version and commit from their _version.py, read as text (never run)."""
    out = {}
    for name, path in VERSION_FILES.items():
        text = files.get(path)
        text = text.decode("utf-8", "replace") if text else ""
        version = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([0-9A-Za-z.+_-]{1,100})['"]""", text, re.M)
        commit = re.search(r"""^__commit_id__\s*=\s*(?:commit_id\s*=\s*)?['"]g?([0-9a-f]{7,40})['"]""", text, re.M)
        local = re.search(r"\+g([0-9a-f]{7,40})", version.group(1)) if version else None
        out[name] = Version(version.group(1) if version else None,
                            commit.group(1) if commit else (local.group(1) if local else None))
    return out
