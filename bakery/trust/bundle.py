"""Sigstore bundles (v0.3) in key mode, stored as cosign 3 stores them: one bundle per referrer.

A bundle holds a DSSE envelope and a hint naming the public key (base64 of the sha256 of its DER
SubjectPublicKeyInfo, which is our keyid's hex in another spelling). The image signature is an
in-toto statement of type https://sigstore.dev/cosign/sign/v1 about the digest; each attestation
is its own statement. The referrer manifest: artifactType the bundle's media type, the empty
config, the bundle as its one layer, and two annotations naming the content and predicate type.
Nothing here is trusted on read: the envelope inside is opened with the role's keys (verify).
"""

from __future__ import annotations

import base64
import json

from ..errors import IntegrityError, malformed
from ..files import canonical_json
from ..oci.manifest import Manifest
from ..oci.refs import Descriptor, Reference
from ..oci.registry import OCI_MANIFEST

BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
COSIGN_SIGN = "https://sigstore.dev/cosign/sign/v1"  # cosign 3's image-signature statement type
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
CONTENT = "dev.sigstore.bundle.content"
PREDICATE_TYPE = "dev.sigstore.bundle.predicateType"
IN_TOTO_V1 = "https://in-toto.io/Statement/v1"


def signature_statement(subject: Reference) -> bytes:
    """The image signature as cosign 3 writes it, plus the repository as the subject's name (what
    the tag scheme's docker-reference says; the policy's allowed_repositories judge it)."""
    return canonical_json({"_type": IN_TOTO_V1, "predicate": {}, "predicateType": COSIGN_SIGN,
                           "subject": [{"digest": {"sha256": subject.pin.hex}, "name": subject.name}]})


def of_envelope(envelope: bytes) -> bytes:
    """The bundle of a DSSE envelope (ours: its signatures name the key by keyid)."""
    from .sign import read_envelope

    payload_type, payload, sigs = read_envelope(envelope, "envelope to bundle")
    keyid = str(sigs[0].get("keyid") or "") if sigs else ""
    hint = base64.b64encode(bytes.fromhex(keyid)).decode() if len(keyid) == 64 else ""
    return canonical_json({"dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
                                            "signatures": [{"sig": s.get("sig", "")} for s in sigs]},
                           "mediaType": BUNDLE, "verificationMaterial": {"publicKey": {"hint": hint}}})


def envelope_of(data: bytes, what: str) -> bytes:
    """The DSSE envelope inside a key-mode bundle, as envelope JSON (unverified). A bundle of
    another version, one over a bare message signature, or one carrying a certificate is refused:
    key mode reads only what it writes."""
    with malformed(what, IntegrityError):
        doc = json.loads(data)
        media_type, material, envelope = doc["mediaType"], doc["verificationMaterial"], doc["dsseEnvelope"]
        if not isinstance(material, dict) or not isinstance(envelope, dict):
            raise TypeError("verificationMaterial or dsseEnvelope is not an object")
    if media_type != BUNDLE:
        raise IntegrityError(f"{what}: a bundle of media type {str(media_type)[:80]}, not {BUNDLE}: refused")
    if set(material) - {"publicKey", "tlogEntries", "timestampVerificationData"}:
        raise IntegrityError(f"{what}: its verification material is not a public key (a certificate: keyless "
                             f"signing, which this policy's key mode does not read): refused")
    return canonical_json(envelope)


def referrer_manifest(store, bundle_desc: Descriptor, subject: Reference, predicate_type: str) -> bytes:
    """The manifest that attaches one bundle to the image: cosign 3's layout, without its creation
    time (every byte is a function of what was signed, so attesting again changes nothing)."""
    empty = store.put_blob(b"{}", OCI_EMPTY)
    image = store.manifest(str(subject.pin))
    return canonical_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": BUNDLE,
                           "config": empty.to_json(), "layers": [bundle_desc.to_json()],
                           "annotations": {CONTENT: "dsse-envelope", PREDICATE_TYPE: predicate_type},
                           "subject": Descriptor(OCI_MANIFEST, subject.pin, len(image or b"")).to_json()})


def read_referrer(store, desc: Descriptor, what: str) -> tuple[str, bytes, str] | None:
    """(the annotated predicate type, the envelope, the key hint) of a bundle referrer, None for a
    referrer that is no bundle (cosign's .sig and .att manifests name the image as subject too);
    annotation and hint are unsigned and only say which older bundle a new one supersedes."""
    from .verify import SIGNATURE_LAYERS

    manifest = Manifest.parse(store.manifest(str(desc.digest)) or b"", what, SIGNATURE_LAYERS)
    if manifest.artifact_type != BUNDLE:
        return None
    if len(manifest.layers) != 1 or manifest.layers[0].media_type != BUNDLE:
        raise IntegrityError(f"{what}: a bundle referrer that is not one {BUNDLE} layer: refused")
    data = store.document(manifest.layers[0], what)
    envelope = envelope_of(data, what)
    key = json.loads(data)["verificationMaterial"].get("publicKey")  # envelope_of parsed it: an object
    hint = key.get("hint", "") if isinstance(key, dict) else ""
    return str(manifest.annotations.get(PREDICATE_TYPE, "")), envelope, str(hint)
