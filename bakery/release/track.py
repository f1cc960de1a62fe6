"""`invoke track` and `invoke bump`: keep every upstream nightly before it ages out; try the newest.

track: list the upstream tags (the distribution API, paginated by `Link`), resolve each matching
tag to its linux/amd64 manifest, copy every digest not yet kept into the mirror (by digest, blobs
mounted or streamed once), read what each base says it is from the mirror's verified copy, and
record it all in the ledger, image/nightlies.yaml. The ledger is written whole and only when every
step held: a registry that breaks off its tag list or lies about a digest changes nothing.
bump: the newest kept nightly newer than the pin and not yet tried goes through `invoke rebase`
(proofs included) read from the mirror. Carried: image/base.yaml, overlays/ and the ledger change,
nothing else. Not carried: only the ledger changes, and the porting kits are in out/rebase/.
Upstream's code runs only inside the rebase's proofs (sandboxed); tracking runs none of it.
"""

from __future__ import annotations

import fnmatch
import json
import re
import urllib.parse
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import yaml

from .. import schema, untrusted
from ..base import spec as base_mod
from ..errors import BUMPED, PORTING, InputError, IntegrityError, NotFound, RegistryError, malformed
from ..oci.layer import write_blob
from ..oci.refs import Digest, Reference
from ..oci.registry import Registry, pull
from ..project import Project

SITE = "usr/local/lib/python3.12/dist-packages"  # where the ROCm image installs vLLM and AITER
VERSION_FILES = {"vllm": f"{SITE}/vllm/_version.py", "aiter": f"{SITE}/aiter/_version.py"}
PAGE = 100  # tags asked for per page
MAX_PAGES = 1000
MAX_NEW = 30  # new digests one run copies: more is refused (narrow --tags), never a flood into the mirror
FUTURE = timedelta(days=1)  # a config created later than this from now is not believed
KEEP_TAG = "kept-sha256-{hex}"  # one mirror tag per kept digest, so a registry's GC never takes it
CARRIED, NEEDS_PORTING = "carried", "needs porting"
SAFE_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,100}")  # what a version may be, in the ledger and the report
HEADER = """\
# The nightly ledger, written by `invoke track` (do not edit by hand): every upstream nightly seen,
# newest first, by its linux/amd64 manifest digest, and where it was mirrored (tagged kept-sha256-<hex>
# there, so it outlives upstream's 14-tag window). `tags` are the upstream tags naming it at the last
# run, `moved` the tags that named it and now name another digest, `deleted` the tags upstream no
# longer lists. `tried` is what `invoke bump` found: carried (overlays proven, pin moved) or needs
# porting (with each overlay's rebase status).
"""


# -- the ledger: typed, checked on load ---------------------------------------------------------

@dataclass(frozen=True)
class Version:
    version: str | None
    commit: str | None

    def __str__(self) -> str:
        return f"{self.version or 'unknown'}" + (f" ({self.commit})" if self.commit else "")


@dataclass(frozen=True)
class Tried:
    outcome: str  # CARRIED | NEEDS_PORTING
    overlays: dict  # overlay id -> its rebase status


@dataclass(frozen=True)
class Nightly:
    digest: Digest  # the linux/amd64 manifest
    index: Digest | None  # the index the tag named, if it named one
    created: str
    vllm: Version
    aiter: Version
    mirrored: str  # MIRROR@digest
    seen: str = ""  # when `invoke track` first saw it (upstream cannot set it)
    tags: tuple[str, ...] = ()
    moved: dict = field(default_factory=dict)  # tag -> the digest it names now
    deleted: tuple[str, ...] = ()
    tried: Tried | None = None

    @property
    def when(self) -> datetime:
        return parse_time(self.created)

    @property
    def order(self) -> tuple:
        """Newer sorts higher: first seen by us, then the config's claim, then the digest."""
        return (self.seen, self.when, str(self.digest))

    def label(self) -> str:
        return ",".join(self.tags or self.deleted or tuple(self.moved)) or "(untagged)"


@dataclass(frozen=True)
class Ledger:
    upstream: str
    mirror: str
    nightlies: tuple[Nightly, ...]

    def find(self, digest: Digest | str | None) -> Nightly | None:
        return next((n for n in self.nightlies if digest and str(digest) in (str(n.digest), str(n.index))), None)


LEDGER_KEYS = {"upstream": str, "mirror": str, "nightlies": list}
NIGHTLY_KEYS = {"digest": str, "index": str, "created": str, "seen": str, "vllm": dict, "aiter": dict, "mirrored": str,
                "tags": list, "moved": dict, "deleted": list, "tried": dict}
TRIED_KEYS = {"outcome": str, "overlays": dict}


def load_ledger(path: Path, upstream: str | None = None, mirror: str | None = None) -> Ledger:
    """The ledger at path (an empty one when there is none yet); it must track upstream into mirror."""
    if not path.exists():
        if not (upstream and mirror):
            raise InputError(f"{path}: no ledger yet: run `invoke track --from UPSTREAM --mirror MIRROR` first")
        return Ledger(upstream, mirror, ())
    data = schema.load_yaml(path, LEDGER_KEYS)
    nightlies = tuple(_nightly(entry, f"{path}: nightlies[{i}]") for i, entry in enumerate(data["nightlies"] or []))
    ledger = Ledger(data["upstream"], data["mirror"], nightlies)
    for key, given in (("upstream", upstream), ("mirror", mirror)):
        if given and given != getattr(ledger, key):
            raise InputError(f"{path} tracks {ledger.upstream} into {ledger.mirror}, not {key} {given}: name the "
                             f"same repositories, or keep a separate ledger with --ledger")
    return ledger


def _nightly(entry, where: str) -> Nightly:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: expected a mapping")
    schema.check_keys(entry, NIGHTLY_KEYS, where, required={"digest", "created", "seen", "vllm", "aiter", "mirrored"})
    tried = entry.get("tried")
    if tried is not None:
        schema.check_keys(tried, TRIED_KEYS, f"{where}.tried")
        if tried["outcome"] not in (CARRIED, NEEDS_PORTING):
            raise InputError(f"{where}.tried.outcome must be {CARRIED!r} or {NEEDS_PORTING!r}")
    versions = {}
    for name in ("vllm", "aiter"):
        schema.check_keys(entry[name], {"version": str, "commit": str}, f"{where}.{name}")
        version, commit = entry[name]["version"], entry[name]["commit"]
        if (version is not None and not SAFE_VERSION.fullmatch(version)) or \
                (commit is not None and not re.fullmatch(r"[0-9a-f]{7,40}", commit)):
            raise InputError(f"{where}.{name}: not a version and commit: {str(version)[:40]!r} {str(commit)[:40]!r}")
        versions[name] = Version(version, commit)
    parse_time(entry["created"], where)
    parse_time(entry["seen"], f"{where}.seen")
    return Nightly(Digest.parse(entry["digest"]), Digest.parse(entry["index"]) if entry.get("index") else None,
                   entry["created"], versions["vllm"], versions["aiter"], entry["mirrored"], entry["seen"],
                   tuple(entry.get("tags") or ()), {str(k): str(Digest.parse(v)) for k, v in
                                                    (entry.get("moved") or {}).items()},
                   tuple(entry.get("deleted") or ()),
                   Tried(tried["outcome"], dict(tried["overlays"])) if tried else None)


def ledger_text(ledger: Ledger) -> str:
    def entry(n: Nightly) -> dict:
        return {"digest": str(n.digest), "index": str(n.index) if n.index else None, "created": n.created,
                "seen": n.seen,
                "tags": sorted(n.tags), "moved": dict(sorted(n.moved.items())), "deleted": sorted(n.deleted),
                "vllm": {"version": n.vllm.version, "commit": n.vllm.commit},
                "aiter": {"version": n.aiter.version, "commit": n.aiter.commit}, "mirrored": n.mirrored,
                "tried": {"outcome": n.tried.outcome, "overlays": dict(sorted(n.tried.overlays.items()))}
                if n.tried else None}
    doc = {"upstream": ledger.upstream, "mirror": ledger.mirror, "nightlies": [entry(n) for n in newest_first(ledger)]}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def write_ledger(path: Path, ledger: Ledger) -> bool:
    """Write the ledger whole (temporary file, then rename); False when nothing changed."""
    text = ledger_text(ledger).encode()
    if path.exists() and path.read_bytes() == text:
        return False
    write_blob(path, text)
    return True


def newest_first(ledger: Ledger) -> list[Nightly]:
    return sorted(ledger.nightlies, key=lambda n: n.order, reverse=True)


def parse_time(text: str, where: str = "created") -> datetime:
    """RFC 3339 as image configs write it (nanoseconds included), as an aware UTC datetime."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text or "")
    stamp = m and m.group(1) + (f".{m.group(2)[:6]:0<6}" if m.group(2) else "") + m.group(3).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(stamp).astimezone(timezone.utc)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}: {str(text)[:60]!r} is not an RFC 3339 time") from None


# -- the upstream: tags, digests, what each base says it is --------------------------------------

def list_tags(registry: Registry, repo: str, page: int = PAGE) -> list[str]:
    """Every tag of repo, following the `Link: <...>; rel="next"` pages; a page that breaks off, a
    link that leaves the listing, or a tag listed twice is an error, never a shorter list."""
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
        path = _next_page(resp.headers.get("Link"), registry, repo)
        if path is None:
            return tags
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


# -- track ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Seen:
    """One upstream tag as resolved now."""
    tag: str
    image: base_mod.Image

    @property
    def digest(self) -> Digest:
        return self.image.manifest_digest


def resolve_tags(registry: Registry, upstream: Reference, pattern: str, platform: str, now: datetime,
                 log) -> tuple[list[str], list[Seen]]:
    """(every matching tag, the ones kept): a tag that is no nightly of ours (another platform, no
    believable creation time) is skipped with a line, not fatal; a registry that lies is fatal."""
    tags = [t for t in list_tags(registry, upstream.repository) if fnmatch.fnmatchcase(t, pattern)]
    log(f"{upstream.name}: {len(tags)} tags match {pattern!r}")
    seen = []
    for tag in tags:
        try:
            image = base_mod.resolve(registry, upstream.with_tag(tag), platform)
            config = image.config
            if image.index_digest is None and f"{config.get('os')}/{config.get('architecture')}" != platform:
                raise InputError(f"an image for {config.get('os')}/{config.get('architecture')}, not {platform}")
            created = config.get("created")
            if not isinstance(created, str) or parse_time(created, "its config's created") > now + FUTURE:
                raise InputError(f"its config's created {str(created)[:40]!r} is missing or in the future")
        except InputError as e:
            log(f"  {tag}: not kept ({e})")
            continue
        seen.append(Seen(tag, image))
    return tags, seen


def check_deletions(registry: Registry, upstream: Reference, ledger: Ledger, listed: set[str], pattern: str) -> None:
    """A tag the ledger saw that the listing lacks must really be gone: if it still resolves, the
    registry cut its listing, and recording deletions would be a lie."""
    for n in ledger.nightlies:
        for tag in n.tags:
            if tag in listed or not fnmatch.fnmatchcase(tag, pattern):
                continue
            try:
                registry.get_manifest(upstream.with_tag(tag))
            except NotFound:
                continue
            raise RegistryError(f"the tag list of {upstream.name} omits {tag}, which still resolves: the registry "
                                f"cut its listing; nothing recorded (retry later)")


def keep(src_registry: Registry, dest: Reference, seen: Seen, registries: dict, log) -> str:
    """Copy the nightly into the mirror unless it is there; the mirror's copy, REF@digest."""
    from ..oci import mirror

    dest_registry = registries.setdefault(dest.registry, Registry(dest.registry)) \
        if dest.registry != src_registry.name else src_registry
    kept_tag = KEEP_TAG.format(hex=seen.digest.hex)
    if dest_registry.manifest_exists(dest.repository, seen.digest):
        if not _tag_exists(dest_registry, dest.repository, kept_tag):  # untagged copies may be collected
            dest_registry.put_manifest(dest.repository, kept_tag, seen.image.manifest_bytes,
                                       seen.image.manifest_media_type)
        return str(dest.with_digest(seen.digest))
    log(f"  mirroring {seen.tag} ({seen.digest}) to {dest.name}")
    src = seen.image.ref.with_digest(seen.digest)
    copied = mirror.copy(src, dest.with_tag(kept_tag), {src_registry.name: src_registry, dest.registry: dest_registry},
                         log=log)
    return str(copied)


def _tag_exists(registry: Registry, repo: str, tag: str) -> bool:
    try:
        return registry.get_manifest(Reference(registry.name, repo, tag, None)) is not None
    except NotFound:
        return False


def describe(project: Path, mirrored: str, platform: str) -> tuple[str, dict[str, Version]]:
    """What the mirror's copy says it is: its config's creation time, vLLM's and AITER's versions."""
    from ..build.pipeline import needed_files
    from ..base.filesystem import BaseFilesystem, LayerCache

    ref = Reference.parse(mirrored)
    registry = Registry(ref.registry)
    image = base_mod.resolve(registry, ref, platform)
    fs = BaseFilesystem(registry, image, LayerCache(), keep=needed_files(project) + tuple(VERSION_FILES.values()))
    found = fs.read(VERSION_FILES.values())
    files = {p: (f.data if f is not None and f.kind in ("file", "hardlink") else None) for p, f in found.items()}
    created = image.config.get("created")
    if not isinstance(created, str):
        raise IntegrityError(f"{mirrored}: its config has no creation time")
    parse_time(created, f"{mirrored}: created")
    return created, read_versions(files)


def track(project: Path, upstream: str, mirror: str, pattern: str, ledger_path: Path, platform: str,
          log=print) -> tuple[Ledger, bool]:
    """Mirror and record every matching nightly; (the ledger, whether it changed)."""
    up, dest = Reference.parse(upstream), Reference.parse(mirror)
    for what, ref in (("--from", up), ("--mirror", dest)):
        if ref.tag or ref.digest:
            raise InputError(f"{what} names a repository (REGISTRY/REPO), not a tag or digest: {ref}")
    ledger = load_ledger(ledger_path, up.name, dest.name)
    registry = Registry(up.registry)
    now = datetime.now(timezone.utc)
    listed, seen = resolve_tags(registry, up, pattern, platform, now, log)
    check_deletions(registry, up, ledger, set(listed), pattern)
    new = {s.digest for s in seen if ledger.find(s.digest) is None}
    if len(new) > MAX_NEW:
        raise InputError(f"{up.name} offers {len(new)} nightlies not yet kept under {pattern!r}, more than {MAX_NEW} "
                         f"in one run: narrow --tags (upstream keeps 14 nightly tags; is this the right repository?)")
    registries: dict = {}
    mirrored = {s.digest: keep(registry, dest, s, registries, log) for s in seen}
    described = {d: describe(project, mirrored[d], platform) for d in new}
    updated = merge(ledger, seen, set(listed), mirrored, pattern, described, now.strftime("%Y-%m-%dT%H:%M:%SZ"), log)
    return updated, write_ledger(ledger_path, updated)


def merge(ledger: Ledger, seen: list[Seen], listed: set[str], mirrored: dict, pattern: str, described: dict,
          now: str, log) -> Ledger:
    """The ledger after this run: new digests added, tags moved or deleted recorded, never replaced."""
    naming = {}  # digest -> the tags naming it now
    for s in seen:
        naming.setdefault(s.digest, []).append(s.tag)
    where = {s.tag: s.digest for s in seen}
    out = []
    for n in ledger.nightlies:
        tags, moved, deleted = [], dict(n.moved), list(n.deleted)
        for tag in n.tags:
            if not fnmatch.fnmatchcase(tag, pattern):
                tags.append(tag)  # outside this run's pattern: as it was
            elif tag not in where and tag in listed:
                tags.append(tag)  # still listed, but not a nightly we keep now: left as it was, said so
                log(f"  {tag}: now names an image this tracker does not keep; the ledger leaves it on {n.digest}")
            elif tag not in where:
                deleted.append(tag)
                log(f"  {tag}: deleted upstream; {n.digest} stays kept at {n.mirrored}")
            elif where[tag] != n.digest:
                moved[tag] = str(where[tag])
                log(f"  {tag}: moved from {n.digest} to {where[tag]}")
            else:
                tags.append(tag)
        tags += [t for t in naming.pop(n.digest, []) if t not in tags]
        out.append(replace(n, tags=tuple(sorted(tags)), moved=moved,
                           deleted=tuple(sorted(set(deleted) - set(tags)))))
    for digest, tags in naming.items():
        image = next(s.image for s in seen if s.digest == digest)
        created, versions = described[digest]
        log(f"  new: {','.join(tags)} {digest} vLLM {versions['vllm']}, AITER {versions['aiter']}, created {created}")
        out.append(Nightly(digest, image.index_digest, created, versions["vllm"], versions["aiter"],
                           mirrored[digest], now, tuple(sorted(tags))))
    return replace(ledger, nightlies=tuple(out))


# -- bump ----------------------------------------------------------------------------------------

def pending(ledger: Ledger, pinned: Digest) -> Nightly | None:
    """The newest kept nightly, newer than the pin, not yet tried (None: nothing new)."""
    pin = ledger.find(pinned)
    newer = [n for n in newest_first(ledger) if n.tried is None and n is not pin and (pin is None or n.order > pin.order)]
    return newer[0] if newer else None


@dataclass(frozen=True)
class Bump:
    nightly: Nightly
    upstream: str
    rows: list  # rebase.RebaseRow, overlays then audit records
    carried: bool
    proof_log: list[str]
    previous: str  # the pin before

    @property
    def code(self) -> int:
        return BUMPED if self.carried else PORTING


def bump(project: Path, ledger_path: Path, out: Path, nightly: str | None = None, log=print) -> Bump | None:
    """Try the newest untried nightly (or the one named) on the mirror's copy with `rebase`; carried:
    pin it in image/base.yaml. The ledger records the outcome either way."""
    from . import rebase as rebase_mod
    from ..build.pipeline import Options

    ledger = load_ledger(ledger_path)
    spec_path = Project(project).base_yaml
    spec = base_mod.load_spec(spec_path)
    if nightly:
        chosen = ledger.find(Digest.parse(nightly.rsplit("@", 1)[-1]))
        if chosen is None:
            raise InputError(f"{nightly} is not in {ledger_path}: `invoke track --list` shows the kept nightlies")
    else:
        chosen = pending(ledger, spec.image.digest)
        if chosen is None:
            return None
    target = f"{ledger.upstream}@{chosen.digest}"
    log(f"trying {chosen.label()} {chosen.digest} (vLLM {chosen.vllm}), read from {ledger.mirror}")
    proof_log: list[str] = []

    def both(line: str) -> None:  # proof reasons come from the base's code: no control characters
        line = plain(line, 400)
        proof_log.append(line)
        log(line)

    # retire=False: a base whose own code "proves" a fix runs inside that proof; retiring an overlay
    # takes a person (invoke rebase), never an unattended bump
    rows, carried = rebase_mod.rebase(Options(project, target, out=out, base_mirror=ledger.mirror), log=both,
                                      retire=False)
    if carried:
        pin(spec_path, target, ledger.mirror, chosen)
    statuses = {r.overlay.id: str(r.status) for r in rows}
    tried = replace(chosen, tried=Tried(CARRIED if carried else NEEDS_PORTING, statuses))
    write_ledger(ledger_path, replace(ledger, nightlies=tuple(tried if n is chosen else n for n in ledger.nightlies)))
    return Bump(tried, ledger.upstream, rows, carried, proof_log, str(spec.image))


def pin(spec_path: Path, image: str, mirror: str, nightly: Nightly | None = None) -> None:
    """Set image: and mirror: in base.yaml, its comments kept but the one naming the versions."""
    text = spec_path.read_text()
    if nightly is not None:
        text = re.sub(r"(?m)^# vLLM .*\n", f"# vLLM {nightly.vllm}, AITER {nightly.aiter}: nightly {nightly.label()}, "
                      f"pinned by invoke bump.\n", text, count=1)
    text = re.sub(r"(?m)^image: .*$", f"image: {image}", text, count=1)
    text = re.sub(r"(?m)^mirror: .*$", f"mirror: {mirror}", text, count=1) if re.search(r"(?m)^mirror:", text) \
        else text.rstrip("\n") + f"\nmirror: {mirror}\n"
    write_blob(spec_path, text.encode())


def report(result: Bump, kits: Path) -> str:
    """The pull request's (or issue's) body: what was tried, each overlay's verdict, what changed."""
    from .rebase import AUDIT_CHANGED, FIXED_UPSTREAM

    n = result.nightly
    required = [r for r in result.rows if r.overlay.baked]
    retired = [r.overlay.id for r in required if r.status == FIXED_UPSTREAM]
    head = (f"Nightly {n.label()}: overlays carried and proven" if result.carried
            else f"Nightly {n.label()}: overlays need porting" if any(not r.carried for r in required)
            else f"Nightly {n.label()}: an overlay may be fixed upstream, confirm by hand")
    lines = [f"# {head}", "", "| | |", "| --- | --- |",
             f"| upstream | `{result.upstream}@{n.digest}` |", f"| tags | {escaped(n.label())} |",
             f"| created | {n.created} |", f"| vLLM | {escaped(n.vllm)} |", f"| AITER | {escaped(n.aiter)} |",
             f"| mirrored | `{n.mirrored}` |", f"| previous pin | `{result.previous}` |", "",
             "## Overlays (`invoke rebase`, each proven on the new base)", "",
             "| overlay | required | status | verdict and reason |", "| --- | --- | --- | --- |"]
    audits = [r for r in result.rows if not r.overlay.baked]
    lines += [f"| {r.overlay.id} | yes | {r.status} | {escaped(r.detail)} |" for r in required]  # statuses are ours
    lines += [f"| {r.overlay.id} | no (audit) | {r.status} | {escaped(r.detail)} |" for r in audits]
    changed = [r for r in audits if r.status == AUDIT_CHANGED]
    lines += ["", "## Audit records that changed", ""]
    lines += [f"- **{r.overlay.id}**: {escaped(r.detail)}" for r in changed] or ["none"]
    porting = [r for r in required if not r.carried]
    lines += ["", "## Porting kits", ""]
    lines += [f"- `{kits / r.overlay.id}/`: edit `ours.py`, then run `prove.sh`" for r in porting
              if (kits / r.overlay.id).is_dir()] or ["none"]
    fence = "`" * max(3, 1 + max((len(run) for line in result.proof_log for run in re.findall(r"`+", line)), default=0))
    quiet = lambda line: re.sub(r"([@#])(?=\w)", "\\1\u200b", plain(line, 400))  # noqa: E731 (no mentions, no links)
    if retired and not result.carried:
        lines += ["", "## Fixed upstream? Confirm by hand", "",
                  f"The new base's own code proves {', '.join(retired)} fixed. An unattended bump never retires an "
                  f"overlay on that word (the base's code runs inside its own proof): check the upstream change, "
                  f"then run `invoke rebase --base {result.upstream}@{n.digest}`, which retires it."]
    lines += ["", "## Proofs as they ran", "", fence, *map(quiet, result.proof_log), fence, ""]
    if result.carried:
        lines += ["This change pins the nightly in `image/base.yaml` (read from the mirror), re-locks `overlays/` "
                  "and records the outcome in `image/nightlies.yaml`; nothing else. Merging it moves the pin; a "
                  "release (a `v*` tag) then builds, signs and smoke-tests it.", ""]
    text = "\n".join(lines)
    return text if len(text) <= REPORT_LIMIT else text[:REPORT_LIMIT] + "\n\n(report cut at its size limit)\n"


REPORT_LIMIT = 60000  # a pull request's body holds 65536 characters


def plain(text: str, limit: int) -> str:
    """One line of someone else's text, inert on a terminal, at most about limit long."""
    return untrusted.safe(text, "terminal", limit)


def escaped(text: str) -> str:
    """A Markdown table cell of someone else's text: no row breaks, no HTML, no code, no mentions or
    issue links, URL-shaped ones included (a `Closes #1` in a PR body would close an issue on merge)."""
    return untrusted.safe(text, "markdown", 600)


def listing(ledger: Ledger, pinned: Digest) -> list[str]:
    """`invoke track --list`: newest first, with what each nightly would need."""
    pin = ledger.find(pinned)
    rows = []
    for n in newest_first(ledger):
        if n is pin:
            state = "the current pin"
        elif n.tried and n.tried.outcome == CARRIED:
            state = "carried and proven (a later pin may have replaced it)"
        elif n.tried:
            state = "needs porting: " + ", ".join(sorted(f"{i}" + ("" if s == NEEDS_PORTING else f" ({s})")
                                                         for i, s in n.tried.overlays.items()
                                                         if not s.startswith(("ported", "audit", "by hand"))))
        else:
            state = "not tried" + (" (older than the pin)" if pin and n.order <= pin.order else "")
        upstream = " [tag gone upstream]" if not n.tags else ""
        rows.append(f"{n.created[:19]}  {n.label():<28} {str(n.digest)[:19]}  vLLM {n.vllm}  AITER {n.aiter}  "
                    f"{state}{upstream}  try: invoke bump --nightly {n.digest}")
    return rows
