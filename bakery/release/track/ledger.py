"""The nightly ledger, image/nightlies.yaml: every upstream nightly seen, typed and checked on load,
written whole."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from ... import schema
from ...errors import InputError
from ...files import rewrite
from ...inputs.overlays import BY_HAND
from ...oci.refs import Digest

CARRIED, NEEDS_PORTING = "carried", "needs porting"
SAFE_VERSION = re.compile(r"[0-9A-Za-z.+_-]{1,100}")  # what a version may be, in the ledger and the report
HEADER = """\
# The nightly ledger, written by `invoke track` (do not edit by hand): every upstream nightly seen,
# newest first, by its linux/amd64 manifest digest, and where it was mirrored (tagged kept-sha256-<hex>
# there, so it outlives upstream's 14-tag window). `tags` are the upstream tags naming it at the last
# run, `moved` the tags that named it and now name another digest, `deleted` the tags upstream no
# longer lists. `tried` is what `invoke bump` found: carried (overlays proven, pin moved) or needs
# porting (with each overlay's rebase status); `pinning` while a carried one's pin is being moved.
"""


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
    pinning: bool = False  # carried, recorded before the checkout changed, the pin not yet moved


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
TRIED_KEYS = {"outcome": str, "overlays": dict, "pinning": bool}


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
        schema.check_keys(tried, TRIED_KEYS, f"{where}.tried", required={"outcome", "overlays"})
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
                   Tried(tried["outcome"], dict(tried["overlays"]), bool(tried.get("pinning"))) if tried else None)


def ledger_text(ledger: Ledger) -> str:
    def entry(n: Nightly) -> dict:
        return {"digest": str(n.digest), "index": str(n.index) if n.index else None, "created": n.created,
                "seen": n.seen,
                "tags": sorted(n.tags), "moved": dict(sorted(n.moved.items())), "deleted": sorted(n.deleted),
                "vllm": {"version": n.vllm.version, "commit": n.vllm.commit},
                "aiter": {"version": n.aiter.version, "commit": n.aiter.commit}, "mirrored": n.mirrored,
                "tried": {"outcome": n.tried.outcome, "overlays": dict(sorted(n.tried.overlays.items())),
                          **({"pinning": True} if n.tried.pinning else {})} if n.tried else None}
    doc = {"upstream": ledger.upstream, "mirror": ledger.mirror, "nightlies": [entry(n) for n in newest_first(ledger)]}
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=120)


def write_ledger(path: Path, ledger: Ledger) -> bool:
    """Write the ledger whole (temporary file, then rename); False when nothing changed."""
    text = ledger_text(ledger).encode()
    if path.exists() and path.read_bytes() == text:
        return False
    rewrite(path, text)
    return True


def newest_first(ledger: Ledger) -> list[Nightly]:
    return sorted(ledger.nightlies, key=lambda n: n.order, reverse=True)


def parse_time(text: str, where: str = "created") -> datetime:
    """RFC 3339 as image configs write it (nanoseconds included), as an aware UTC datetime."""
    m = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text or "")
    if m is None:
        raise InputError(f"{where}: {str(text)[:60]!r} is not an RFC 3339 time")
    stamp = m.group(1) + (f".{m.group(2)[:6]:0<6}" if m.group(2) else "") + m.group(3).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(stamp).astimezone(UTC)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"{where}: {str(text)[:60]!r} is not an RFC 3339 time") from None


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
                                                         if not s.startswith(("ported", "audit", BY_HAND))))
        else:
            state = "not tried" + (" (older than the pin)" if pin and n.order <= pin.order else "")
        upstream = " [tag gone upstream]" if not n.tags else ""
        rows.append(f"{n.created[:19]}  {n.label():<28} {str(n.digest)[:19]}  vLLM {n.vllm}  AITER {n.aiter}  "
                    f"{state}{upstream}  try: invoke bump --nightly {n.digest}")
    return rows
