"""`invoke attest`: sign an image digest and attach its SBOM and provenance, the way cosign does.

Signature: tag sha256-<hex>.sig, one simple-signing layer with its signature as an annotation.
Attestations: tag sha256-<hex>.att, one DSSE envelope layer per predicate type. Every byte is
deterministic, so attesting the same build twice changes nothing.
"""

from __future__ import annotations

import base64
import json

from . import provenance, sbom, sign
from .errors import InputError
from .image import canonical_json
from .refs import Descriptor, Digest, Reference
from .registry import OCI_MANIFEST
from .store import signature_tag

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE = "application/vnd.dsse.envelope.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
ZERO_TIME = "0001-01-01T00:00:00Z"


def _config(layers: list[Descriptor]) -> bytes:
    """The minimal image config cosign writes for signature/attestation manifests."""
    return canonical_json({"architecture": "", "config": {}, "created": ZERO_TIME,
                           "history": [{"created": ZERO_TIME}], "os": "",
                           "rootfs": {"type": "layers", "diff_ids": [str(l.digest) for l in layers]}})


def _manifest(store, layers: list[Descriptor], subject: Reference, artifact_type: str) -> bytes:
    """An OCI manifest stored under cosign's tag; its `subject` also makes registries with the OCI
    1.1 referrers API list it as a referrer of the image (registries without one ignore it)."""
    config = store.put_blob(_config(layers), OCI_CONFIG)
    image = store.manifest(str(subject.digest))
    return canonical_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                           "config": config.to_json(), "layers": [l.to_json() for l in layers],
                           "subject": Descriptor(OCI_MANIFEST, subject.digest, len(image)).to_json()})


def sign_image(store, subject: Reference, signer: sign.Signer) -> Digest:
    payload = sign.simple_signing_payload(subject, subject.digest)
    desc = store.put_blob(payload, SIMPLE_SIGNING)
    signature = base64.b64encode(signer.sign(payload)).decode()
    layer = Descriptor(desc.media_type, desc.digest, desc.size, {SIGNATURE_ANNOTATION: signature})
    return store.put_manifest(signature_tag(subject.digest, "sig"), _manifest(store, [layer], subject, SIMPLE_SIGNING))


def attach(store, subject: Reference, statements: dict[str, bytes], signer: sign.Signer) -> Digest:
    """Put DSSE envelopes for `statements` ({predicateType: statement}) into the .att manifest,
    keeping attestations of other predicate types already there."""
    tag = signature_tag(subject.digest, "att")
    existing = store.manifest(tag)
    layers = {}
    if existing:
        for layer in json.loads(existing)["layers"]:
            desc = Descriptor.from_json(layer)
            layers[desc.annotations.get("predicateType")] = desc
    for predicate_type, statement in statements.items():
        desc = store.put_blob(sign.envelope(signer, statement), DSSE)
        layers[predicate_type] = Descriptor(DSSE, desc.digest, desc.size,
                                            {SIGNATURE_ANNOTATION: "", "predicateType": predicate_type})
    return store.put_manifest(tag, _manifest(store, [layers[k] for k in sorted(layers)], subject, DSSE))


def attest(store, subject: Reference, record: dict, signer: sign.Signer) -> dict:
    """Sign the digest, attach SBOM and provenance; return what was written."""
    if subject.digest is None:
        raise InputError(f"attest needs IMAGE@sha256:DIGEST, got {subject}")
    if record["manifest"]["digest"] != str(subject.digest):
        raise InputError(f"the build record describes {record['manifest']['digest']}, not {subject.digest}: "
                         f"pass the record of that build with --record")
    if store.manifest(str(subject.digest)) is None:
        raise InputError(f"{subject} is not in {getattr(store, 'path', subject.name)}: push it first")
    statements = {
        sbom.SPDX_PREDICATE: provenance.statement(subject, sbom.SPDX_PREDICATE,
                                                  json.loads(sbom.document(record, subject.name))),
        provenance.SLSA_PREDICATE: provenance.statement(subject, provenance.SLSA_PREDICATE,
                                                        provenance.predicate(record)),
    }
    return {"signature": sign_image(store, subject, signer), "attestations": attach(store, subject, statements, signer)}
