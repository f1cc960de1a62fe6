"""`invoke prune`: the registry kept to what releases need, by the retention policy in the repository
(provenance/retention.yaml).

Kept: every promoted release (a `v*` tag) with what verifies and rebuilds it (its signatures,
attestations and bundles, the kernel and proof-verdict artifacts and the base its signed provenance
names), the newest candidates and those of v* git tags made in the last TAG_GRACE_DAYS, the newest
mirrored nightlies, and the nightlies the ledger has in flight. Deleted: every other manifest bakery
wrote, and only those. What bakery wrote is known by its tags (candidate-<sha>, kernels-<key>,
proof-<key>, kept-sha256-<hex>, and cosign's and the referrers fallback's sha256-<hex> tags); a
manifest under any other tag, or under none that our signatures name (a copy pulled by digest), is
never touched, and a
signature, attestation or bundle goes with its subject, after it, so a kill at any point leaves every
kept image with all of its signatures (a rerun deletes what a kill left behind).

The plan is a pure function of what the registry lists, the verified provenances, the ledger and the
commit dates (decide); the registry is read and written at the edges (inventory, apply). On GHCR the
deletes go through GitHub's package-versions API (release/github.PackageVersions), once its versions
say what the registry's listing said.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError, IntegrityError, NotFound, RegistryError
from ..oci.refs import Digest, Reference
from ..trust.provenance import Provenance

RELEASE = re.compile(r"v[0-9][A-Za-z0-9._-]*")
CANDIDATE = re.compile(r"candidate-([0-9a-f]{40})")
KERNELS = re.compile(r"kernels-[0-9a-f]{16,64}")
VERDICT = re.compile(r"proof-[0-9A-Za-z._-]{1,64}")
NIGHTLY = re.compile(r"kept-sha256-([0-9a-f]{64})")
SIGNATURE = re.compile(r"sha256-([0-9a-f]{64})\.(sig|att)")
FALLBACK = re.compile(r"sha256-([0-9a-f]{64})")
TAG_GRACE_DAYS = 14  # a v* git tag's candidate is kept this long: its release may still be running
# what goes with its subject, after it; the rest are subjects, deleted first
DEPENDENT = ("referrer", "referrers", "attestation", "signature")
ORDER = ("candidate", "kernels", "verdict", "nightly", *DEPENDENT)


@dataclass(frozen=True)
class Retention:
    """How many of the unreleased to keep: the newest candidates and the newest mirrored nightlies."""
    candidates: int
    nightlies: int

    @classmethod
    def load(cls, path: Path) -> Retention:
        doc = schema.load_yaml(path, {"candidates": int, "nightlies": int})
        for key in ("candidates", "nightlies"):
            if not isinstance(doc.get(key), int) or isinstance(doc[key], bool) or doc[key] < 1:
                raise InputError(f"{path}: {key} must be a whole number of at least 1 (the newest is always kept)")
        return cls(doc["candidates"], doc["nightlies"])


@dataclass(frozen=True)
class Stored:
    """One manifest of a repository, as listed: its tags, what it is, and what it belongs to."""
    repo: str
    digest: Digest
    tags: tuple[str, ...]
    kind: str  # release, candidate, kernels, verdict, nightly, signature, attestation, referrers, referrer, foreign
    subject: Digest | None = None  # a dependent's subject
    also_foreign: bool = False  # it has a tag bakery does not write too: never deleted
    blobs: tuple[tuple[Digest, int], ...] = ()  # its config and layers, with their sizes
    size: int = 0  # the manifest's own bytes

    @property
    def bytes(self) -> int:
        return self.size + sum(size for _, size in self.blobs)

    def label(self) -> str:
        if self.tags:
            return ", ".join(self.tags)
        if self.subject is None:  # a subject our signatures name that no tag of ours does (a mirror's copy)
            return "(untagged, signed)"
        return f"(untagged, of {self.subject.hex[:12]})"


@dataclass(frozen=True)
class Decision:
    stored: Stored
    keep: bool
    why: str


def kind_of(tags: tuple[str, ...], mirror: bool) -> tuple[str, Digest | None, bool]:
    """(what a manifest is by the tags bakery writes, its subject, whether it is also something else).
    A release tag makes it a release whatever else names it (what its provenance names is kept), the
    rest flagged. One with none of ours is foreign; so is one whose tags name two subjects, or say two
    things at once (a subject's and a signature's): not ours to judge."""
    kinds, subjects, other = set(), set(), False
    for tag in tags:
        for kind, pattern in ((("nightly", NIGHTLY),) if mirror else
                              (("release", RELEASE), ("candidate", CANDIDATE), ("kernels", KERNELS),
                               ("verdict", VERDICT), ("signature", SIGNATURE), ("referrers", FALLBACK))):
            m = pattern.fullmatch(tag)
            if m:
                if kind == "signature":
                    kind = "attestation" if m.group(2) == "att" else "signature"
                    subjects.add(Digest.parse("sha256:" + m.group(1)))
                elif kind == "referrers":
                    subjects.add(Digest.parse("sha256:" + m.group(1)))
                kinds.add(kind)
                break
        else:
            other = True
    if "release" in kinds:
        return "release", None, other or len(kinds) > 1
    if not kinds or len(subjects) > 1 or (len(kinds) > 1 and kinds & set(DEPENDENT)):
        return "foreign", None, other
    kind = next(k for k in ("release", "candidate", "kernels", "verdict", "nightly", "attestation", "signature",
                            "referrers") if k in kinds)
    return kind, next(iter(subjects), None), other


def decide(stored: list[Stored], roots: dict[tuple[str, Digest], str]) -> list[Decision]:
    """Keep each root (why), each foreign manifest, and each dependent whose subject is kept; delete
    the rest, subjects first and their signatures after them, in a fixed order."""
    kept_subjects = {(s.repo, s.digest) for s in stored
                     if (s.repo, s.digest) in roots or s.kind == "foreign" or s.also_foreign}
    decisions = []
    for s in stored:
        if s.kind == "foreign" and not s.tags and s.subject is None:
            decisions.append(Decision(s, True, "our signatures name it, no tag of ours does (a copy pulled by "
                                               "digest): never touched"))
        elif s.kind == "foreign" or (s.also_foreign and (s.repo, s.digest) not in roots):
            decisions.append(Decision(s, True, "a tag bakery does not write names it: never touched"))
        elif (s.repo, s.digest) in roots:
            decisions.append(Decision(s, True, roots[(s.repo, s.digest)]))
        elif s.kind in DEPENDENT and (s.repo, s.subject) in kept_subjects:
            decisions.append(Decision(s, True, f"{s.kind} of a kept {s.subject.hex[:12] if s.subject else ''}"))
        elif s.kind in DEPENDENT:
            decisions.append(Decision(s, False, f"its subject {s.subject.hex[:12] if s.subject else ''} is not kept"))
        else:
            decisions.append(Decision(s, False, f"{s.kind}: past what the retention policy keeps"))
    return sorted(decisions, key=lambda d: (d.keep, ORDER.index(d.stored.kind) if d.stored.kind in ORDER else 0,
                                            d.stored.repo, str(d.stored.digest)))


def reclaimable(decisions: list[Decision]) -> int:
    """Bytes the registry's garbage collection can free: blobs only deleted manifests name (in the
    repositories listed; a blob another repository names stays)."""
    kept = {digest for d in decisions if d.keep for digest, _ in d.stored.blobs}
    freed = {digest: size for d in decisions if not d.keep for digest, size in d.stored.blobs if digest not in kept}
    return sum(freed.values()) + sum(d.stored.size for d in decisions if not d.keep)


# -- what the registry holds (I/O) ---------------------------------------------------------------

def inventory(registry, repo: str, mirror: bool = False) -> list[Stored]:
    """Every tagged manifest of REPO, and the Sigstore bundles that refer to a subject (holdings)."""
    from ..oci.store import RegistryStore
    from .track.upstream import list_tags

    try:
        tags = list_tags(registry, repo)
    except NotFound:
        return []
    return holdings(RegistryStore(Reference(registry.name, repo, None, None), registry), repo,
                    dict.fromkeys(tags), mirror, f"{registry.name}/{repo}")


def layout_inventory(layout) -> list[Stored]:
    """Every named manifest of an OCI layout (a LayoutStore), as a registry's tags; an entry with
    no name is someone else's: what it is kept as is never ours to judge."""
    named, unnamed = layout.names()
    found = holdings(layout, str(layout.path), dict(named), False, str(layout.path))
    return [dataclasses.replace(s, also_foreign=True) if s.digest in unnamed else s for s in found]


def holdings(store, repo: str, tags: dict[str, Digest | None], mirror: bool, where: str) -> list[Stored]:
    """Every manifest the tags name (each read by its tag, or by the digest a layout's name gives),
    and the Sigstore bundles that refer to a subject: those listed for each subject
    bakery wrote, and for each subject a signature tag or fallback index still names (after a kill,
    the subject may be gone and its bundles not yet). A referrer counts as a subject's only if its
    own manifest says so; one that says otherwise, or is listed for two subjects, is foreign. A tag
    listed that then answers nothing stops the prune: a plan without it could delete what it needs."""
    from ..oci import referrers

    by_digest: dict[Digest, tuple[list[str], bytes]] = {}
    for tag, expected in tags.items():
        body = store.manifest(str(expected) if expected else tag)  # a layout's names say their digest
        if body is None and expected is not None:
            raise IntegrityError(f"{where}: {tag} names {expected}, which is not there: the layout is broken; "
                                 f"nothing deleted")
        if body is None:
            raise RegistryError(f"{where}:{tag} was listed and then not found: it changed while prune read it, or "
                                f"answers inconsistently; nothing deleted (run it again)")
        by_digest.setdefault(Digest.of(body), ([], body))[0].append(tag)
    found = []
    for digest, (named, body) in sorted(by_digest.items(), key=lambda item: str(item[0])):
        kind, subject, other = kind_of(tuple(sorted(named)), mirror)
        found.append(Stored(repo, digest, tuple(sorted(named)), kind, subject, other, _blobs(body), len(body)))
    # a subject our signatures name, there but under no tag (an image `invoke mirror` copied by digest,
    # pulled by digest): not ours to judge, so it and its signatures stay; one gone (a kill between
    # a subject and its signatures) lets them go
    for subject in sorted({s.subject for s in found if s.kind in DEPENDENT and s.subject} -
                          {s.digest for s in found}, key=str):
        body = store.manifest(str(subject))
        if body is None:
            continue
        found.append(Stored(repo, subject, (), "foreign", None, False, _blobs(body), len(body)))
    tagged = {s.digest for s in found}
    subjects = sorted({s.digest for s in found if s.kind not in DEPENDENT and s.kind != "foreign"} |
                      {s.subject for s in found if s.kind in DEPENDENT and s.subject}, key=str)
    claims: dict[Digest, list[Digest]] = {}
    listed: dict[Digest, tuple[int, bytes]] = {}
    for subject in subjects:
        for r in referrers.listing(store, subject).referrers:
            if r.descriptor.digest in tagged:
                continue
            claims.setdefault(r.descriptor.digest, []).append(subject)
            if r.descriptor.digest not in listed:
                body = store.manifest(str(r.descriptor.digest)) or b"{}"
                listed[r.descriptor.digest] = (r.descriptor.size, body)
    for digest, claimants in sorted(claims.items(), key=lambda item: str(item[0])):
        size, body = listed[digest]
        ours = len(claimants) == 1 and _bundle_of(body) == claimants[0]
        found.append(Stored(repo, digest, (), "referrer" if ours else "foreign", claimants[0], False, _blobs(body),
                            size))
    return found


def _bundle_of(body: bytes) -> Digest | None:
    """The subject a Sigstore bundle referrer's own manifest names; None for anything else."""
    from ..oci.manifest import Manifest

    try:
        manifest = Manifest.parse(body, "a referrer")
    except IntegrityError:
        return None
    if not str(manifest.artifact_type or "").startswith("application/vnd.dev.sigstore.bundle") or not manifest.subject:
        return None
    return manifest.subject.digest


def _blobs(body: bytes) -> tuple[tuple[Digest, int], ...]:
    from ..oci.manifest import Manifest

    try:
        return tuple((d.digest, d.size) for d in Manifest.parse(body, "a manifest").blobs)
    except IntegrityError:
        return ()  # an index, or no image: its own bytes only


def named_by(provenance: Provenance) -> set[Digest]:
    """The manifests a signed provenance says its image needs: the base (and its platform image),
    the kernel artifact and the proof verdicts (docker://NAME@sha256:... in its dependencies)."""
    return {Digest.parse(u.rsplit("@", 1)[1]) for u in provenance.uris
            if u.startswith("docker://") and re.search(r"@sha256:[0-9a-f]{64}$", u)}


def roots(image: list[Stored], mirror: list[Stored], mirror_repo: str | None, retention: Retention, provenance,
          commit_time, ledger, pinned: Digest | None,
          tagged: dict[str, str] | None = None) -> dict[tuple[str, Digest], str]:
    """What the policy keeps and why. provenance(digest, required) -> the verified provenance (or
    raises, for a release); commit_time(sha) -> its commit's epoch seconds, None where unknown;
    ledger: the nightly ledger or None; pinned: image/base.yaml's digest; tagged: {commit: its v*
    git tag} (a release's candidate, built on a tag that may not be on HEAD's line: a hotfix)."""
    keep: dict[tuple[str, Digest], str] = {}

    def needs(s: Stored, why: str, prov: Provenance | None) -> None:
        keep.setdefault((s.repo, s.digest), why)
        for digest in named_by(prov) if prov else ():
            for other in image:
                if other.digest == digest:
                    keep.setdefault((other.repo, digest), f"named by {why}")
            if mirror_repo:
                keep.setdefault((mirror_repo, digest), f"base of {why}")

    for s in image:
        if s.kind == "release":
            needs(s, f"release {', '.join(t for t in s.tags if RELEASE.fullmatch(t))}", provenance(s.digest, True))
    candidates = [s for s in image if s.kind == "candidate"]

    def newest(s: Stored) -> tuple:  # its newest commit's time (unknown: oldest), then the digest
        times = [commit_time(m.group(1)) for t in s.tags if (m := CANDIDATE.fullmatch(t))]
        return (max((t for t in times if t is not None), default=-1), str(s.digest))

    unsigned = False
    ranked = sorted(candidates, key=newest, reverse=True)
    released = [(s, tag) for s in ranked[retention.candidates:] for t in s.tags
                if (m := CANDIDATE.fullmatch(t)) and (tag := (tagged or {}).get(m.group(1)))]
    for i, s in enumerate(ranked[:retention.candidates]):
        prov = provenance(s.digest, False)
        needs(s, f"candidate {i + 1} of the {retention.candidates} newest", prov)
        unsigned = unsigned or prov is None
    for s, tag in released:  # its release may be waiting for reviewers or the MI300X: never from under it
        prov = provenance(s.digest, False)
        needs(s, f"the build of git tag {tag} (its release may still be running)", prov)
        unsigned = unsigned or prov is None
    if unsigned:  # a release between its build and its sign job: what it pushed is signed once approved
        signed = {d.subject for d in image if d.kind in DEPENDENT}
        for s in image:
            if s.kind in ("kernels", "verdict") and s.digest not in signed:
                keep.setdefault((s.repo, s.digest), "unsigned, while a kept candidate is too: its release may "
                                                    "still sign it")
    if ledger is not None and mirror_repo:
        from .track.ledger import CARRIED, newest_first

        ordered = newest_first(ledger)
        pin_order = next((n.order for n in ordered if pinned and pinned in (n.digest, n.index)), None)
        for i, n in enumerate(ordered):
            why = None
            if i < retention.nightlies:
                why = f"nightly {i + 1} of the {retention.nightlies} newest"
            if pinned and pinned in (n.digest, n.index):
                why = "the pinned base (image/base.yaml)"
            elif n.tried and n.tried.pinning:
                why = "in flight: a bump is pinning it"
            elif n.tried and n.tried.outcome == CARRIED and pin_order is not None and n.order > pin_order:
                why = "in flight: carried, newer than the pin (a bump's pull request proposes it)"
            if why:
                keep.setdefault((mirror_repo, n.digest), why)
    return keep


def unchanged(registry, repo: str, stored: list[Stored]) -> None:
    """RegistryError unless REPO lists exactly the tags the plan was made from (listed again now)."""
    from .track.upstream import list_tags

    try:
        now = set(list_tags(registry, repo))
    except NotFound:
        now = set()
    planned = {tag for s in stored for tag in s.tags}
    if now != planned:
        raise RegistryError(f"the tags of {registry.name}/{repo} changed since prune read them ({len(now - planned)} "
                            f"added, {len(planned - now)} gone): nothing deleted; run it again")


def disagreements(stored: list[Stored], versions: dict[Digest, tuple[str, ...]]) -> list[str]:
    """Where GitHub's package versions ({digest: tags}) and the registry's listing of the same
    repository disagree: a manifest the plan holds that is no version, other tags on either side, a
    tagged version the registry did not list. Untagged versions the plan does not hold stay as they
    are (not ours to judge)."""
    found = []
    for s in stored:
        if s.digest not in versions:
            found.append(f"{s.repo}@{s.digest} ({s.label()}) is listed by the registry, and no package version")
        elif set(versions[s.digest]) != set(s.tags):
            found.append(f"{s.repo}@{s.digest} is tagged {sorted(s.tags)} by the registry, "
                         f"{sorted(versions[s.digest])} by GitHub")
    held = {s.digest for s in stored}
    found += [f"{digest} is tagged {sorted(tags)} by GitHub, and not listed by the registry"
              for digest, tags in sorted(versions.items(), key=lambda item: str(item[0])) if tags and digest not in held]
    return found


def apply(registries: dict, decisions: list[Decision], log) -> int:
    """Delete what the plan deletes, in its order (subjects, then what signs them); the count.
    registries: {repo: what deletes there}, a Registry or GHCR's release.github.PackageVersions."""
    gone = [d for d in decisions if not d.keep]
    for i, d in enumerate(gone, 1):
        registry = registries[d.stored.repo]
        registry.delete_manifest(d.stored.repo, d.stored.digest)  # the transport's crash point follows it
        log(f"deleted {i}/{len(gone)}: {registry.name}/{d.stored.repo}@{d.stored.digest} ({d.stored.kind})")
    return len(gone)


def verified_provenance(store_of, policy):
    """provenance(digest, required): the SLSA provenance the release role signed for a digest the
    release role signed; what it says is not judged against today's policy (an older release was
    built from an older base). A release whose provenance does not verify stops the prune (what it
    needs cannot be known); a candidate's keeps nothing more."""
    from ..trust import provenance as provenance_mod, verify

    def provenance(digest: Digest, required: bool) -> Provenance | None:
        store, ref = store_of(digest)
        report = verify.Report()
        verify._signature(store, ref, policy, report)
        found = verify._attestations(store, ref, policy, report)
        failure = report.failures[0] if report.failures else \
            None if provenance_mod.SLSA_PREDICATE in found else "no SLSA provenance signed by the release role"
        if failure and required:
            raise IntegrityError(f"{ref}: {failure}: prune deletes nothing while a release cannot show what it needs")
        return None if failure else found[provenance_mod.SLSA_PREDICATE]

    return provenance
