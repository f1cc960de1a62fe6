"""What travels beside the image in the build's push target: a kernel artifact, a proof verdict.

Each is an OCI artifact under a tag of its own, with deterministic bytes (the same outputs give the
same digest, so the build record can name it before it is pushed). A build takes one by its tag
only once `trust` accepts a signature on its digest, and pushes its own after everything that can
fail has run; the release workflow's sign job signs what the record names. What the config and the
layers hold is the owner's format (inputs/kernel_artifact.py, proofs/runner.py); this is how both
travel.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import NotFound
from .refs import Descriptor, Digest, Reference


@dataclass(frozen=True)
class Artifact:
    """An OCI artifact ready to push under its tag: its manifest and its blobs."""
    tag: str
    manifest: bytes
    blobs: tuple[tuple[Descriptor, bytes], ...]  # the layers, then the config: the order they are pushed in

    @classmethod
    def of(cls, tag: str, artifact_type: str, config: tuple[Descriptor, bytes],
           layers: list[tuple[Descriptor, bytes]]) -> Artifact:
        from .registry import OCI_MANIFEST  # here: a proof's process need not load the registry

        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                               "config": config[0].to_json(), "layers": [d.to_json() for d, _ in layers]},
                              sort_keys=True).encode()
        return cls(tag, manifest, (*layers, config))

    @property
    def digest(self) -> Digest:
        return Digest.of(self.manifest)

    def at(self, store) -> Reference:
        """Where it is (or will be) in `store`, by digest."""
        return store.ref.with_digest(self.digest)


def push(store, artifact: Artifact) -> Reference:
    """Its blobs, then its manifest under its tag, in `store` (a RegistryStore); nothing where the tag
    already names these bytes (one HEAD)."""
    from .registry import OCI_MANIFEST

    registry, repo = store.registry, store.repo
    if not registry.manifest_is(repo, artifact.tag, artifact.digest):
        for desc, data in artifact.blobs:
            registry.upload_blob(repo, desc, lambda d=data: iter([d]))
        registry.put_manifest(repo, artifact.tag, artifact.manifest, OCI_MANIFEST)
    return artifact.at(store)


def take(store, tag: str, trust: Callable[[Reference], object]) -> tuple[Reference, bytes] | None:
    """(REPO@DIGEST, its manifest) of what `tag` names in `store`, once `trust(REPO@DIGEST)` has not
    raised: a registry writer can put anything under a tag, so nothing of it is read before. None
    where the tag names nothing."""
    try:
        body, _, digest = store.registry.get_manifest(store.ref.with_tag(tag))
    except NotFound:
        return None
    pinned = store.ref.with_digest(digest)
    trust(pinned)
    return pinned, body
