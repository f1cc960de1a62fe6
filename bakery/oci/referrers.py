"""OCI 1.1 referrers: the manifests whose `subject` is an image, as the distribution spec lists them.

A registry with the referrers API answers `GET /v2/<name>/referrers/<digest>` with an index (it
must never answer 404 there). One without it (Debian's docker-registry 2.8) answers 404; the spec's
fallback is then an index kept by the writers under the tag `sha256-<hex>`. An OCI layout has only
the fallback. Every listing comes from whoever runs the registry: it is only where to look, and each
manifest it names is read through its digest and judged by what it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError, IntegrityError, NotFound, RegistryError, malformed
from ..files import canonical_json, go_document
from .refs import MANIFEST_FIELDS, Descriptor, Digest
from .registry import OCI_INDEX, OCI_MANIFEST

REFERRERS_LIMIT = 256  # an image has a few: a signature and one bundle per statement
API = "the referrers API"


def fallback_tag(digest: Digest) -> str:
    return f"{digest.algorithm}-{digest.hex}"


@dataclass(frozen=True)
class Referrer:
    descriptor: Descriptor
    artifact_type: str


@dataclass(frozen=True)
class Listing:
    referrers: tuple[Referrer, ...]
    via: str  # "the referrers API" or "the fallback tag sha256-<hex>"

    def manifests(self) -> tuple[Descriptor, ...]:
        """Every referrer listed, whatever type the listing says: registries derive it differently
        (go-containerregistry's from the config's media type), so the manifest is read too."""
        return tuple(r.descriptor for r in self.referrers)


def _parse(body: bytes, what: str) -> tuple[Referrer, ...]:
    """The entries of a referrers index; each must name a manifest by a sha256 digest (the only
    kind read through a digest check), or the whole listing is refused."""
    with malformed(what, IntegrityError):
        doc = go_document(body, "the referrers index", MANIFEST_FIELDS)
        entries = doc["manifests"]
        if not isinstance(entries, list):
            raise TypeError("manifests is not a list")
        if len(entries) > REFERRERS_LIMIT:
            raise ValueError(f"it lists {len(entries)} referrers, past the {REFERRERS_LIMIT} an image may have")
        try:
            found = tuple(Referrer(Descriptor.from_json(e), str(e.get("artifactType") or "")) for e in entries)
        except (InputError, AttributeError):
            raise ValueError("an entry without a digest, size or media type") from None
        if any(r.descriptor.digest.algorithm != "sha256" for r in found):
            raise ValueError("an entry not named by a sha256 digest")
        return found


def api_listing(registry, repo: str, digest: Digest) -> bytes | None:
    """The referrers API's index for digest, or None where the registry has no such API (a 404)."""
    from .registry import pull

    try:
        resp = registry.transport.request("GET", f"/v2/{repo}/referrers/{digest}", scopes=pull(repo),
                                          headers={"Accept": OCI_INDEX}, ok=(200,))
    except NotFound:
        return None
    return resp.content


def listing(store, digest: Digest) -> Listing:
    """The referrers of digest in store (a RegistryStore or LayoutStore): by the API where the
    registry has it, else by the fallback tag (absent: none)."""
    registry = getattr(store, "registry", None)
    if registry is not None:
        body = api_listing(registry, store.repo, digest)
        if body is not None:
            return Listing(_parse(body, f"referrers of {digest} (API)"), API)
    tag = fallback_tag(digest)
    body = store.manifest(tag)
    return Listing(_parse(body, f"referrers index {tag}") if body else (), f"the fallback tag {tag}")


def attach(store, subject: Digest, body: bytes, artifact_type: str, annotations: dict,
           superseded: tuple[Digest, ...] = ()) -> tuple[Digest, str]:
    """Store a manifest whose `subject` is `subject` and make it listed as a referrer: the API lists
    it by itself; without one, the fallback index gains it. `superseded` referrers (an older bundle
    of the same statement) are then dropped from the listing, and deleted where the registry lets
    us. Returns the manifest's digest and how it is listed."""
    digest = store.put_manifest(None, body)
    registry = getattr(store, "registry", None)
    if registry is not None and api_listing(registry, store.repo, subject) is not None:
        for old in superseded:
            if old != digest:
                _delete(registry, store.repo, old)
        return digest, API
    tag = fallback_tag(subject)
    existing = store.manifest(tag)
    kept = [r for r in (_parse(existing, f"referrers index {tag}") if existing else ())
            if r.descriptor.digest != digest and r.descriptor.digest not in superseded]
    entry = Descriptor(OCI_MANIFEST, digest, len(body), annotations)
    entries = [_entry(r.descriptor, r.artifact_type) for r in kept] + [_entry(entry, artifact_type)]
    index = canonical_json({"schemaVersion": 2, "mediaType": OCI_INDEX,
                            "manifests": sorted(entries, key=lambda e: e["digest"])})
    store.put_index(tag, index)
    for old in superseded:
        if old != digest and registry is not None:
            _delete(registry, store.repo, old)
    return digest, f"the fallback tag {tag}"


def _entry(desc: Descriptor, artifact_type: str) -> dict:
    return {**desc.to_json(), "artifactType": artifact_type}


def _delete(registry, repo: str, digest: Digest) -> None:
    """Delete a superseded referrer. A registry that refuses: one line saying what to do (with the
    API the old one stays listed beside the new, and verify refuses two statements of one type)."""
    try:
        registry.delete_manifest(repo, digest)
    except RegistryError as e:
        raise RegistryError(f"{registry.name}/{repo} refused to delete superseded referrer {digest} ({e}): "
                            f"delete it by hand, or allow deletes on the registry") from None
