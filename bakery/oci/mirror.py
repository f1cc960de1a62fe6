"""`invoke mirror`: copy a pinned image into your own registry, by digest, byte for byte."""

from __future__ import annotations

import json

from .manifest import Manifest
from .refs import Descriptor, Reference
from .registry import INDEX_TYPES, Registry


def _registry(registries: dict, name: str) -> Registry:
    return registries.get(name) or registries.setdefault(name, Registry(name))


def copy(src: Reference, dest: Reference, registries: dict | None = None, log=print) -> Reference:
    """Copy manifest (or index and every child), config and layers; the digest does not change."""
    registries = registries if registries is not None else {}
    src_reg, dest_reg = _registry(registries, src.registry), _registry(registries, dest.registry)
    body, media_type, digest = src_reg.get_manifest(src)
    if media_type in INDEX_TYPES:
        for child in json.loads(body).get("manifests", []):
            desc = Descriptor.from_json(child)
            copy(src.with_digest(desc.digest), dest.with_tag(None), registries, log)
    else:
        blobs = Manifest.parse(body, f"manifest {src}").blobs
        for i, desc in enumerate(blobs):
            if dest_reg.blob_exists(dest.repository, desc.digest):
                continue
            if dest_reg is src_reg and dest_reg.mount_blob(dest.repository, desc.digest, src.repository):
                log(f"  mounted {desc.digest.hex[:12]} from {src.repository}")
                continue
            log(f"  copying blob {i + 1}/{len(blobs)} {desc.digest.hex[:12]} ({desc.size} bytes)")
            dest_reg.upload_blob(dest.repository, desc, lambda d=desc: src_reg.stream_blob(src.repository, d))
    dest_reg.put_manifest(dest.repository, str(digest), body, media_type)
    if dest.tag:
        dest_reg.put_manifest(dest.repository, dest.tag, body, media_type)
    return dest.with_digest(digest)


def copy_signed(src, ref: Reference, dest, tag: str | None = None, log=print) -> None:
    """Copy one of our images by digest with its cosign signature and attestations (sha256-<hex>.sig
    and .att) from one store to another (registry or OCI layout). Every blob is checked on the way;
    the tags are written last, so a failed copy leaves no tag behind. The signatures still name the
    repository the image was signed for: verify binds by digest and the policy's allowed list."""
    from ..errors import InputError
    from .store import signature_tag

    manifests = [(str(ref.digest), src.manifest(str(ref.digest)))]
    if manifests[0][1] is None:
        raise InputError(f"{ref} is not in the source: check the digest")
    for suffix in ("sig", "att"):
        name = signature_tag(ref.digest, suffix)
        body = src.manifest(name)
        if body is None:
            raise InputError(f"{ref} has no {name}: sign and attest it (`invoke attest`) before mirroring")
        manifests.append((name, body))
    for name, body in manifests:
        blobs = Manifest.parse(body, f"manifest {name} of {ref.name}").blobs
        for desc in blobs:
            log(f"  {name}: blob {desc.digest.hex[:12]} ({desc.size} bytes)")
            dest.put_stream(desc, lambda d=desc: src.stream(d))
    for name, body in manifests[1:] + [(tag or manifests[0][0], manifests[0][1])]:
        dest.put_manifest(name, body)
