"""Copying between stores, by digest, byte for byte: one blob (what a push of a derived image does
with the base's layers), an image (`invoke mirror`), or one of ours with its signatures."""

from __future__ import annotations

from ..errors import InputError, IntegrityError, malformed
from ..files import go_document
from .manifest import Manifest
from .refs import MANIFEST_FIELDS, Descriptor, Digest, Reference
from .registry import INDEX_TYPES, Registry


def _registry(registries: dict, name: str) -> Registry:
    return registries.get(name) or registries.setdefault(name, Registry(name))


def copy_blob(src: Registry, src_repo: str, dest: Registry, dest_repo: str, desc: Descriptor,
              copying=lambda: None) -> str:
    """desc into dest_repo, the cheapest way: already there ("present"), mounted from src_repo within
    one registry ("mounted"), else streamed once from src, checked on the way ("copied"; `copying` is
    called first, for a progress line)."""
    if dest.blob_exists(dest_repo, desc.digest):
        return "present"
    if dest is src and dest.mount_blob(dest_repo, desc.digest, src_repo):
        return "mounted"
    copying()
    dest.upload_blob(dest_repo, desc, lambda: src.stream_blob(src_repo, desc))
    return "copied"


INDEX_DEPTH = 4  # indexes within indexes a copy follows (a multi-platform image is one level)


def copy(src: Reference, dest: Reference, registries: dict | None = None, log=print, _depth: int = 0) -> Reference:
    """Copy manifest (or index and every child), config and layers; the digest does not change."""
    registries = registries if registries is not None else {}
    src_reg, dest_reg = _registry(registries, src.registry), _registry(registries, dest.registry)
    body, media_type, digest = src_reg.get_manifest(src)
    if media_type in INDEX_TYPES:
        if _depth >= INDEX_DEPTH:
            raise IntegrityError(f"index {src} is nested past {INDEX_DEPTH} indexes: refused")
        with malformed(f"index {src}"):
            children = go_document(body, "the index", MANIFEST_FIELDS)["manifests"]
            if not isinstance(children, list):
                raise TypeError("its manifests is not a list")
            try:
                descs = [Descriptor.from_json(child) for child in children]
            except InputError as e:
                raise ValueError(str(e)) from None
        for digest in dict.fromkeys(d.digest for d in descs):  # each child once
            copy(src.with_digest(digest), dest.with_tag(None), registries, log, _depth + 1)
    else:
        blobs = Manifest.parse(body, f"manifest {src}").blobs
        for i, desc in enumerate(blobs):
            progress = f"  copying blob {i + 1}/{len(blobs)} {desc.digest.hex[:12]} ({desc.size} bytes)"
            if copy_blob(src_reg, src.repository, dest_reg, dest.repository, desc,
                         copying=lambda line=progress: log(line)) == "mounted":
                log(f"  mounted {desc.digest.hex[:12]} from {src.repository}")
    dest_reg.put_manifest(dest.repository, str(digest), body, media_type)
    if dest.tag:
        dest_reg.put_manifest(dest.repository, dest.tag, body, media_type)
    return dest.with_digest(digest)


def copy_signed(src, ref: Reference, dest, tag: str | None = None, log=print) -> None:
    """Copy one of our images by digest with its signatures and attestations, in each format it has:
    cosign's tags (sha256-<hex>.sig and .att) and the referrers listed for it (Sigstore bundles),
    from one store to another (registry or OCI layout). Every blob is checked on the way; the image's
    tag is written last, so a failed copy leaves no tag behind. The signatures still name the
    repository the image was signed for: verify binds by digest and the policy's allowed list."""
    from . import referrers
    from .store import signature_tag

    manifests = [(str(ref.digest), src.manifest(str(ref.digest)))]
    if manifests[0][1] is None:
        raise InputError(f"{ref} is not in the source: check the digest")
    for suffix in ("sig", "att"):
        name = signature_tag(ref.pin, suffix)
        body = src.manifest(name)
        if body is not None:
            manifests.append((name, body))
    tagged = {Digest.of(b) for _, b in manifests}
    attached = [body for body in (_referrer(src, desc, ref) for desc in referrers.listing(src, ref.pin).manifests()
                                  if desc.digest not in tagged) if body is not None]
    if len(manifests) == 1 and not attached:
        raise InputError(f"{ref} has no signature ({signature_tag(ref.pin, 'sig')} or a bundle): sign and attest it "
                         f"(`invoke attest`) before mirroring")
    for name, body in manifests + [(f"referrer {Digest.of(b)}", b) for b in attached]:
        blobs = Manifest.parse(body, f"manifest {name} of {ref.name}").blobs
        for desc in blobs:
            log(f"  {name}: blob {desc.digest.hex[:12]} ({desc.size} bytes)")
            dest.put_stream(desc, lambda d=desc: src.stream(d))
    dest.put_manifest(None, manifests[0][1])
    copied = {Digest.of(body) for body in attached} | tagged
    kinds = {Manifest.parse(body, "referrer").artifact_type for body in attached}
    stale = tuple(d.digest for d in referrers.listing(dest, ref.pin).manifests()
                  if d.digest not in copied and _referrer(dest, d, ref, kinds) is not None)
    for i, body in enumerate(attached):  # the copy's referrers become the source's: an older copy's go
        parsed = Manifest.parse(body, f"referrer of {ref.name}")
        referrers.attach(dest, ref.pin, body, parsed.artifact_type or parsed.config.media_type, parsed.annotations,
                         stale if i == len(attached) - 1 else ())
    for name, body in manifests[1:] + [(tag or manifests[0][0], manifests[0][1])]:
        dest.put_manifest(name, body)


def _referrer(store, desc: Descriptor, ref: Reference, kinds: set | None = None) -> bytes | None:
    """A listed referrer's manifest, only if it is one: its `subject` is ref's digest, each blob it
    names is small (a signature or bundle, never an image's layers) and, with `kinds`, its
    artifactType is one of them (what a copy may replace). A listing is the registry's word: what
    it names otherwise is neither copied nor deleted."""
    from .registry import check_document_size
    from .transport import DOCUMENT_LIMIT

    body = store.manifest(str(desc.digest))
    if body is None or len(body) > DOCUMENT_LIMIT:
        return None
    try:
        manifest = Manifest.parse(body, f"referrer {desc.digest}", 16)
        for blob in manifest.blobs:
            check_document_size(blob, f"blob of referrer {desc.digest}")
        if manifest.subject is None or str(manifest.subject.digest) != str(ref.pin):
            return None
    except (ValueError, TypeError, AttributeError, IntegrityError, InputError):
        return None
    return body if kinds is None or manifest.artifact_type in kinds else None
