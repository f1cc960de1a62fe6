"""`invoke track`: resolve upstream's tags, keep every new digest in the mirror, record it in the ledger."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from ... import untrusted
from ...base import spec as base_mod
from ...errors import InputError, IntegrityError, NotFound, RegistryError
from ...oci.refs import Digest, Reference
from ...oci.registry import Registry
from .ledger import Ledger, Nightly, Version, load_ledger, parse_time, write_ledger
from .upstream import VERSION_FILES, list_tags, read_versions

MAX_NEW = 30  # new digests one run copies: more is refused (narrow --tags), never a flood into the mirror
FUTURE = timedelta(days=1)  # a config created later than this from now is not believed
KEEP_TAG = "kept-sha256-{hex}"  # one mirror tag per kept digest, so a registry's GC never takes it


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
            log(f"  {tag}: not kept ({untrusted.safe(e)})")  # the registry chose its platform and text
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
    from ...oci import mirror

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
    from ...bake.opened import needed_files
    from ...base.filesystem import BaseFilesystem
    from ...base.layercache import LayerCache

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
    now = datetime.now(UTC)
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
    naming: dict[Digest, list[str]] = {}  # digest -> the tags naming it now
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
