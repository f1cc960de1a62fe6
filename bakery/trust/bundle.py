"""Sigstore bundles (v0.3), stored as cosign 3 stores them: one bundle per referrer.

A key-mode bundle (made here) holds a DSSE envelope and a hint naming the public key (base64 of the
sha256 of its DER SubjectPublicKeyInfo, which is our keyid's hex in another spelling); a keyless
one (keyless.py) a Fulcio certificate and its log entry instead. The image signature is an
in-toto statement of type https://sigstore.dev/cosign/sign/v1 about the digest; each attestation
is its own statement. The referrer manifest: artifactType the bundle's media type, the empty
config, the bundle as its one layer, and two annotations naming the content and predicate type.
Nothing here is trusted on read: verify opens each with the role's keys or identity.
"""

from __future__ import annotations

import base64
import json

from ..errors import PARSE_ERRORS, IntegrityError, malformed
from ..files import canonical_json, one_each
from ..oci.manifest import Manifest
from ..oci.refs import Descriptor, Digest, Reference
from ..oci.registry import OCI_MANIFEST

BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
COSIGN_SIGN = "https://sigstore.dev/cosign/sign/v1"  # cosign 3's image-signature statement type
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
CONTENT = "dev.sigstore.bundle.content"
PREDICATE_TYPE = "dev.sigstore.bundle.predicateType"


def signature_statement(subject: Reference) -> bytes:
    """The image signature as cosign 3 writes it, plus the repository as the subject's name (what
    the tag scheme's docker-reference says; the policy's allowed_repositories judge it)."""
    from .statement import Statement

    return Statement.about(subject, COSIGN_SIGN, {}).raw


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
        # every key once: parsed plainly, a second `payload` would be dropped before read_envelope looks
        doc = json.loads(data, object_pairs_hook=one_each)
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


def is_keyless(data: bytes) -> bool:
    """Whether a bundle carries a certificate (keyless) rather than a public key's hint."""
    try:
        material = json.loads(data)["verificationMaterial"]
        return isinstance(material, dict) and bool({"certificate", "x509CertificateChain"} & set(material))
    except PARSE_ERRORS:  # RecursionError too: then envelope_of refuses it, as one unreadable bundle
        return False


def read_referrer(store, referrer, subject: Digest, what: str) -> tuple[str, bytes, str] | None:
    """(the annotated predicate type, the bundle's bytes, the key hint) of a bundle referrer of
    `subject`, None for a referrer that is no bundle (cosign's .sig and .att manifests name the
    image as subject too). A referrer is a bundle if anything says so (the listing's artifactType,
    the manifest's, its config's or a layer's media type: cosign 3 reads the listing's, we must not
    skip what it reads), and then it must be whole: one bundle layer, about this subject.
    Annotation and hint are unsigned and only say which older bundle a new one supersedes."""
    from .verify import SIGNATURE_LAYERS

    desc = referrer.descriptor
    body = store.manifest(str(desc.digest))
    if body is None:
        raise IntegrityError(f"{what} is listed but not in the repository: refused")
    manifest = Manifest.parse(body, what, SIGNATURE_LAYERS)
    marks = {referrer.artifact_type, manifest.artifact_type, manifest.config.media_type} | \
        {layer.media_type for layer in manifest.layers}
    if BUNDLE not in marks:
        return None
    about = str(manifest.subject.digest) if manifest.subject else None
    if manifest.artifact_type != BUNDLE or len(manifest.layers) != 1 or manifest.layers[0].media_type != BUNDLE:
        raise IntegrityError(f"{what}: marked a bundle, but not one {BUNDLE} layer under that artifactType: refused")
    if about != str(subject):
        raise IntegrityError(f"{what}: a bundle about {str(about)[:80]}, listed as a referrer of {subject}: refused")
    data = store.document(manifest.layers[0], what)
    with malformed(what, IntegrityError):
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("mediaType") != BUNDLE:
            raise ValueError(f"not a {BUNDLE} document")
    material = doc.get("verificationMaterial")
    key = material.get("publicKey") if isinstance(material, dict) else None
    hint = key.get("hint", "") if isinstance(key, dict) else ""
    return str(manifest.annotations.get(PREDICATE_TYPE, "")), data, str(hint)
