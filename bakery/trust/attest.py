"""`invoke attest`: sign an image digest and attach its SBOM and provenance, the way cosign does,
in each format the policy's signature_formats names:

- tags (cosign 2): sha256-<hex>.sig, one simple-signing layer with its signature as an annotation;
  sha256-<hex>.att, one DSSE envelope layer per predicate type;
- bundles (cosign 3): one Sigstore bundle per statement, each a referrer of the image (bundle.py).

Every byte is deterministic, so attesting the same build twice changes nothing.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from ..errors import InputError, IntegrityError, malformed
from ..files import canonical_json
from ..oci import referrers
from ..oci.manifest import Manifest
from ..oci.refs import Descriptor, Digest, Reference
from ..oci.registry import OCI_MANIFEST
from ..oci.store import signature_tag
from . import attestations, bundle, keyless, provenance, sign
from .policy import SIGNATURE_FORMATS
from .record import Artifact, BuildRecord, Verdict
from .statement import Statement

SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE = "application/vnd.dsse.envelope.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNER_ANNOTATION = "dev.bakery.rebuilder"  # unsigned: only keeps rebuilders' statements apart, never trusted
ZERO_TIME = "0001-01-01T00:00:00Z"


def _config(layers: list[Descriptor]) -> bytes:
    """The minimal image config cosign writes for signature/attestation manifests."""
    return canonical_json({"architecture": "", "config": {}, "created": ZERO_TIME,
                           "history": [{"created": ZERO_TIME}], "os": "",
                           "rootfs": {"type": "layers", "diff_ids": [str(layer.digest) for layer in layers]}})


def _manifest(store, layers: list[Descriptor], subject: Reference, artifact_type: str) -> bytes:
    """An OCI manifest stored under cosign's tag; its `subject` also makes registries with the OCI
    1.1 referrers API list it as a referrer of the image (registries without one ignore it)."""
    config = store.put_blob(_config(layers), OCI_CONFIG)
    image = store.manifest(str(subject.digest))
    return canonical_json({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
                           "config": config.to_json(), "layers": [layer.to_json() for layer in layers],
                           "subject": Descriptor(OCI_MANIFEST, subject.pin, len(image)).to_json()})


FORMATS = SIGNATURE_FORMATS


def _bundle_of(signer, statement: bytes) -> bytes:
    """A bundle over a statement: keyless (a certificate for the workflow identity) or by key."""
    if isinstance(signer, keyless.KeylessSigner):
        return signer.bundle(statement)
    return bundle.of_envelope(sign.envelope(signer, statement))


def _formats_of(signer, formats: tuple[str, ...]) -> tuple[str, ...]:
    """A keyless signer writes bundles only: cosign's tags hold no certificate here."""
    return ("bundle",) if isinstance(signer, keyless.KeylessSigner) else formats


def sign_image(store, subject: Reference, signer, formats: tuple[str, ...] = FORMATS) -> Digest:
    """Sign the digest: a bundle of cosign 3's signature statement, then cosign's .sig tag; returns
    the digest of the last written. `signer`: a sign.Signer (a key) or a keyless.KeylessSigner."""
    written = None
    formats = _formats_of(signer, formats)
    if "bundle" in formats:
        written = attach_bundle(store, subject, bundle.COSIGN_SIGN, _bundle_of(signer, bundle.signature_statement(subject)))
    if "tag" in formats:
        payload = sign.simple_signing_payload(subject, subject.pin)
        desc = store.put_blob(payload, SIMPLE_SIGNING)
        signature = base64.b64encode(signer.sign(payload)).decode()
        layer = Descriptor(desc.media_type, desc.digest, desc.size, {SIGNATURE_ANNOTATION: signature})
        written = store.put_manifest(signature_tag(subject.pin, "sig"),
                                     _manifest(store, [layer], subject, SIMPLE_SIGNING))
    if written is None:
        raise InputError(f"no signature format chosen (formats: {', '.join(FORMATS)})")
    return written


def attach(store, subject: Reference, statements: dict[str, bytes], signer,
           formats: tuple[str, ...] = FORMATS) -> Digest:
    """Sign `statements` ({predicateType: statement}) and attach them in each format."""
    if isinstance(signer, keyless.KeylessSigner):
        written = None
        for kind, statement in statements.items():
            written = attach_bundle(store, subject, kind, signer.bundle(statement))
        if written is None:
            raise InputError("nothing to attach")
        return written
    return attach_envelopes(store, subject, {kind: sign.envelope(signer, statement)
                                             for kind, statement in statements.items()}, formats)


def attach_bundle(store, subject: Reference, predicate_type: str, data: bytes) -> Digest:
    """One bundle referrer of `subject`, superseding the bundles of the same predicate type (for a
    rebuild: of the same rebuilder's key), as the .att tag's layers are replaced."""
    desc = store.put_blob(data, bundle.BUNDLE)
    key = json.loads(data)["verificationMaterial"].get("publicKey")
    signer = key.get("hint", "") if isinstance(key, dict) else ""
    superseded = []
    for old in referrers.listing(store, subject.pin).referrers:
        try:
            read = bundle.read_referrer(store, old, subject.pin, f"referrer {old.descriptor.digest}")
        except IntegrityError:
            continue  # not one of ours to replace; verify judges it
        if read is None:
            continue
        kind, _, hint = read
        if kind == predicate_type and (predicate_type != provenance.REBUILD_PREDICATE or hint == signer):
            superseded.append(old.descriptor.digest)
    body = bundle.referrer_manifest(store, desc, subject, predicate_type)
    digest, _ = referrers.attach(store, subject.pin, body, bundle.BUNDLE,
                                 {bundle.CONTENT: "dsse-envelope", bundle.PREDICATE_TYPE: predicate_type},
                                 tuple(superseded))
    return digest


def attach_envelopes(store, subject: Reference, envelopes: dict[str, bytes],
                     formats: tuple[str, ...] = FORMATS) -> Digest:
    """Attach signed DSSE envelopes ({predicateType: envelope}): each as a bundle referrer, and into
    the .att manifest, replacing one of the same type and keeping the others (one statement per
    type: verify refuses two). Returns the .att manifest's digest (the last bundle's without tags)."""
    written = None
    if "bundle" in formats:
        for predicate_type, envelope in envelopes.items():
            written = attach_bundle(store, subject, predicate_type, bundle.of_envelope(envelope))
    if "tag" not in formats:
        if written is None:
            raise InputError(f"no attestation format chosen (formats: {', '.join(FORMATS)})")
        return written
    tag = signature_tag(subject.pin, "att")
    existing = store.manifest(tag)
    layers = {}
    if existing:
        from .verify import _layers

        for desc in _layers(existing, f"attestation manifest {tag}"):
            layers[(desc.annotations.get("predicateType"), desc.annotations.get(SIGNER_ANNOTATION, ""))] = desc
    for predicate_type, envelope in envelopes.items():
        desc = store.put_blob(envelope, DSSE)
        annotations = {SIGNATURE_ANNOTATION: "", "predicateType": predicate_type}
        if predicate_type == provenance.REBUILD_PREDICATE:  # one per rebuilder: each replaces only its own
            annotations[SIGNER_ANNOTATION] = sign.read_envelope(envelope, "rebuild attestation")[2][0].get("keyid", "")
        layers[(predicate_type, annotations.get(SIGNER_ANNOTATION, ""))] = Descriptor(DSSE, desc.digest, desc.size,
                                                                                      annotations)
    return store.put_manifest(tag, _manifest(store, [layers[k] for k in sorted(layers, key=str)], subject, DSSE))


def statement_of(envelope: bytes, subject: Reference, what: str) -> Statement:
    """The statement of a signed envelope or keyless bundle about `subject`'s digest (signature
    unchecked)."""
    try:
        statement = keyless.bundle_statement(envelope, what) if bundle.is_keyless(envelope) else \
            Statement.read(sign.read_envelope(envelope, what)[1], what)
    except IntegrityError as e:
        raise InputError(str(e)) from None
    if not statement.names(subject.pin):
        raise InputError(f"{what} is about sha256:{', '.join(statement.digests)}, not {subject.digest}")
    return statement


def attest(store, subject: Reference, record: BuildRecord, signer, sign_kernels: bool = True,
           formats: tuple[str, ...] = FORMATS) -> dict:
    """Sign the digest, attach SBOM, provenance and VEX, and sign the kernel artifact the record names
    (so that a later build may bake it instead of compiling); return what was written."""
    if subject.digest is None:
        raise InputError(f"attest needs IMAGE@sha256:DIGEST, got {subject}")
    if record.manifest.digest != subject.digest:
        raise InputError(f"the build record describes {record.manifest.digest}, not {subject.digest}: "
                         f"pass the record of that build with --record")
    if store.manifest(str(subject.digest)) is None:
        raise InputError(f"{subject} is not in {getattr(store, 'path', subject.name)}: push it first")
    formats = _formats_of(signer, formats)
    written: dict[str, Any] = {"formats": formats}
    signed = attestations.statements(subject, record)
    for form in (f for f in ("bundle", "tag") if f in formats):  # the bundles whole first, then the tags
        written["signature"] = sign_image(store, subject, signer, (form,))
        written["attestations"] = attach(store, subject, signed, signer, (form,))
    if "bundle" in formats:
        written["bundles"] = referrers.listing(store, subject.pin).via
    if record.kernels.artifact and sign_kernels:
        written["kernels"] = sign_artifact(record.kernels.artifact, signer, record.artifacts)
    if sign_kernels:
        written["verdicts"] = [sign_verdict(v, signer) for v in record.verdicts if v.origin == "proven" and v.artifact]
    return written


def sign_verdict(entry: Verdict, signer: sign.Signer) -> dict:
    """A cosign signature on a proof verdict's artifact, only if it holds the verdict the build record
    says this build proved (its key and FIXED/BROKEN): later builds take it instead of proving."""
    from ..oci.store import RegistryStore
    from ..proofs.runner import VERDICT_CONFIG, read_verdict

    artifact = entry.artifact
    if artifact is None or artifact.digest is None:
        raise InputError(f"the build record names proof verdict {artifact} without a digest: build again")
    store = RegistryStore(artifact)
    manifest = store.manifest(str(artifact.digest))
    if manifest is None:
        raise InputError(f"proof verdict {artifact} is not in its registry: build again with --push")
    what = f"proof verdict {artifact}"
    config = Manifest.parse(manifest, what).config
    if config.media_type != VERDICT_CONFIG:
        raise IntegrityError(f"{what} is not a proof verdict: not signed")
    held = read_verdict(store.document(config, f"config of {what}"), entry.key, what)
    if held.verdict != entry.verdict:
        raise IntegrityError(f"{what} says {held.verdict}, the build record {entry.verdict}: not signed")
    subject = Reference(artifact.registry, artifact.repository, None, artifact.digest)
    return {"artifact": str(artifact), "signature": sign_image(store, subject, signer)}


def sign_artifact(artifact: Reference, signer: sign.Signer, baked: tuple[Artifact, ...] | None = None) -> dict:
    """A cosign signature on the kernel artifact's manifest digest, in its own repository; with
    `baked` (the record's artifacts), only if it holds exactly their files: each .so the image baked,
    its schema and the compiler line."""
    from ..oci.store import RegistryStore

    if artifact.digest is None:
        raise InputError(f"the build record names kernel artifact {artifact} without a digest: build again")
    store = RegistryStore(artifact)
    manifest = store.manifest(str(artifact.digest))
    if manifest is None:
        raise InputError(f"kernel artifact {artifact} is not in its registry: build again with --push")
    if baked is not None:
        with malformed(f"kernel artifact {artifact}"):
            held = {layer.annotations["org.opencontainers.image.title"]: str(layer.digest)
                    for layer in Manifest.parse(manifest, f"kernel artifact {artifact}").layers}
        names = {"toolchain.txt"} | {f"{a.name}{suffix}" for a in baked for suffix in (".so", ".schema")}
        differ = [a.name for a in baked if held.get(f"{a.name}.so") != f"sha256:{a.sha256}"]
        if not baked or differ or set(held) != names:
            raise IntegrityError(f"kernel artifact {artifact} does not hold exactly the files the build record says "
                                 f"the image baked ({', '.join(differ) or 'its file names differ'}): not signed")
    subject = Reference(artifact.registry, artifact.repository, None, artifact.digest)
    return {"artifact": str(artifact), "signature": sign_image(store, subject, signer)}
