"""`invoke verify`: what ops run before deploying a digest. Every check must hold; each says why not."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import untrusted
from ..errors import PARSE_ERRORS, BakeryError, InputError, IntegrityError, malformed
from ..files import Fields
from ..oci.manifest import Manifest
from ..oci.refs import Descriptor, Digest, Reference
from ..oci.store import signature_tag
from . import bundle, keys as keys_mod, policy as policy_mod, provenance, sbom, sign, vex
from .smoke_result import SmokeResult
from .statement import Statement


@dataclass
class Report:
    checks: list = field(default_factory=list)  # (ok, what)
    summary: dict = field(default_factory=dict)
    smoke: dict | None = None  # the signed smoke report, as signed (untrusted JSON), where one was checked

    def check(self, ok: bool, what: str) -> bool:
        self.checks.append((ok, what))
        return ok

    @property
    def failures(self) -> list[str]:
        return [what for ok, what in self.checks if not ok]


def _blobs(store, manifest: bytes, report: Report, what: str) -> None:
    """Every blob the manifest names is present and hashes to its digest."""
    descs = Manifest.parse(manifest, what).blobs
    bad = []
    for d in descs:
        try:
            for _ in store.stream(d):
                pass
        except IntegrityError as e:
            bad.append(str(e))
        except BakeryError as e:  # a registry error is a failed check here, not a crash
            bad.append(f"{d.digest}: {e}")
    report.check(not bad, f"all {len(descs)} blobs present and matching their digests" +
                 (f": {bad[0]}" if bad else ""))


def _signers(role, check) -> set[str]:
    """Distinct keyids of the role's keys for which check(key) passes (check raises IntegrityError
    otherwise): one key listed twice is still one signer."""
    out = set()
    for key in role.keys:
        try:
            check(key)
            out.add(keys_mod.keyid(key))
        except IntegrityError:
            continue
    return out


@dataclass
class Signers:
    """Who signed an image digest, read from every format present: the distinct keys of a role that
    count, why each other signature did not, and where they were read."""
    by: set
    reasons: list
    read: list  # "tag sha256-<hex>.sig", "2 bundle(s) via the referrers API", ...


def _judge_signature(role, policy, digest: Digest, signature: bytes, payload: bytes, signed_digest, signed_name,
                     verify_with, reasons: list, verified: set[str] | None = None) -> set[str]:
    """The role's keys (or `verified`: the keyless identity already checked) that signed one image
    signature which is for `digest` and names a repository the policy allows (not necessarily the
    one read from: a mirror keeps the original's signature)."""
    keyids = verified if verified is not None else _signers(role, verify_with)
    if not keyids:
        reasons.append(f"not signed by a {role.name} key of the policy")
    elif signed_digest != str(digest):
        reasons.append(f"signature is for {signed_digest}, not {digest} (copied from another image)")
    elif not isinstance(signed_name, str) or not policy.repository_allowed(signed_name):
        reasons.append(f"signature names repository {signed_name}, which the policy's allowed_repositories "
                       f"do not list")
    else:
        return keyids
    return set()


def _tag_signers(store, digest: Digest, role, policy) -> tuple[set[str], list[str]] | None:
    """cosign's tag scheme (sha256-<hex>.sig, simple-signing payloads); None if there is none."""
    tag = signature_tag(digest, "sig")
    manifest = store.manifest(tag)
    if manifest is None:
        return None
    reasons: list[str] = []
    signed_by: set[str] = set()
    for desc in _layers(manifest, f"signature manifest {tag}"):
        try:
            payload = store.document(desc, f"signature payload in {tag}")
            signature = base64.b64decode(desc.annotations.get("dev.cosignproject.cosign/signature", ""))
            signed_digest, signed_name = simple_signing_claims(payload)
        except (IntegrityError, *PARSE_ERRORS) as e:
            reasons.append(f"unreadable signature: {e}")
            continue
        # _signers calls the check before the loop moves on; the defaults bind this layer's bytes all the same
        signed_by |= _judge_signature(role, policy, digest, signature, payload, signed_digest, signed_name,
                                      lambda k, signature=signature, payload=payload:
                                      sign.check(k, signature, payload, "image signature"), reasons)
    return signed_by, reasons


def simple_signing_claims(payload: bytes) -> tuple[str, str]:
    """(docker-manifest-digest, docker-reference) of a cosign simple-signing payload, unverified. Its
    top, `critical`, `identity` and `image` are structs to cosign's Go decoder, which matches keys
    without case: each key once there, or the two readers would take their claims from different
    fields. `optional` is a Go map (exact keys): its annotations may differ in case alone."""
    doc = json.loads(payload, object_pairs_hook=Fields.of)
    critical = doc["critical"]
    identity, image = critical["identity"], critical["image"]
    if any(getattr(level, "twice", False) for level in (doc, critical, identity, image)):
        raise ValueError("a key appears twice, or twice in different cases, where cosign reads a struct")
    return image["docker-manifest-digest"], identity["docker-reference"]


def _bundles(store, digest: Digest) -> tuple[list[tuple[str, bytes]], str, list[str]]:
    """([(annotated predicate type, the bundle's bytes)] of the image's bundle referrers, how they
    were listed, the unreadable ones' reasons)."""
    from ..oci import referrers

    listing = referrers.listing(store, digest)
    found, reasons = [], []
    for referrer in listing.referrers:
        try:
            read = bundle.read_referrer(store, referrer, digest, f"referrer {referrer.descriptor.digest}")
        except IntegrityError as e:
            reasons.append(str(e))
            continue
        if read is not None:
            found.append(read[:2])
    return found, listing.via, reasons


def _bundle_signers(digest: Digest, role, policy, bundles) -> tuple[set[str], list[str]] | None:
    """The image signature as bundles carry it (cosign 3's sign statement); None if there is none."""
    reasons: list[str] = []
    signed_by: set[str] = set()
    signatures = [data for kind, data in bundles if kind == bundle.COSIGN_SIGN]
    for data in signatures:
        try:
            if bundle.is_keyless(data):
                payload, identity = keyless_payload(data, role.name, policy, "bundle signature")
            else:
                envelope = bundle.envelope_of(data, "bundle signature")
                payload_type, payload, _ = sign.read_envelope(envelope, "bundle signature")
                if payload_type != sign.IN_TOTO:
                    raise ValueError(f"payloadType {payload_type[:80]}")
            statement = Statement.read(payload, "bundle signature")
            if statement.predicate_type != bundle.COSIGN_SIGN:
                raise ValueError(f"a statement of type {statement.predicate_type[:80]}")
            subject, = statement.subjects
            signed_digest, signed_name = f"sha256:{subject.sha256}", subject.name
        except (IntegrityError, *PARSE_ERRORS) as e:
            reasons.append(f"unreadable bundle signature: {e}")
            continue
        if bundle.is_keyless(data):  # verified above, by the role's identity: only what it says is left to judge
            signed_by |= _judge_signature(role, policy, digest, b"", payload, signed_digest, signed_name,
                                          lambda k: None, reasons, {identity})
        else:
            signed_by |= _judge_signature(role, policy, digest, b"", payload, signed_digest, signed_name,
                                          lambda k, envelope=envelope: sign.open_envelope(envelope, k,
                                                                                          "bundle signature"), reasons)
    return (signed_by, reasons) if signatures else None


def keyless_payload(data: bytes, role: str, policy, what: str) -> tuple[bytes, str]:
    """(payload, "keyless <the role's signer URI pattern>") of a keyless bundle signed by the role's
    identity: one identity is one signer, whichever tag its job ran on (two bundles from one
    workflow are not two of a threshold)."""
    from . import keyless

    identity = policy.identities.get(role)
    if identity is None or policy.trusted_root is None:
        raise IntegrityError(f"{what} is signed keyless, but the policy names no keyless identity for the {role} "
                             f"role (keyless.roles.{role})")
    payload, _ = keyless.open_bundle(data, identity, policy.trusted_root, what)
    return payload, f"keyless {identity.signer_uri}"


def cosign_signers(store, digest: Digest, role, policy, read_bundles=None) -> Signers | None:
    """The image's signature in both formats cosign reads (the .sig tag, bundles as referrers); where
    both exist they must be signed by the same keys, or none count. None if neither exists."""
    bundles, via, unreadable = read_bundles or _bundles(store, digest)
    tagged = _tag_signers(store, digest, role, policy)
    bundled = _bundle_signers(digest, role, policy, bundles)
    read = ([f"tag {signature_tag(digest, 'sig')}"] if tagged else []) + \
           ([f"{sum(k == bundle.COSIGN_SIGN for k, _ in bundles)} bundle(s) via {via}"] if bundled else [])
    if tagged is None and bundled is None:
        return None
    if tagged is not None and bundled is not None and tagged[0] != bundled[0]:
        return Signers(set(), [f"the tag signature (by {len(tagged[0])} {role.name} key(s)) and the bundle signature "
                               f"(by {len(bundled[0])}) disagree: refused (a verifier reading either format must see "
                               f"the same signers)"] + tagged[1] + [r for r in bundled[1] if r not in tagged[1]], read)
    by, reasons = tagged or bundled or (set(), [])
    more = (bundled[1] if tagged and bundled else []) + unreadable
    return Signers(by, reasons + [r for r in more if r not in reasons], read)  # each reason once


def _signature(store, ref: Reference, policy, report: Report, read_bundles=None) -> None:
    """The cosign signature: signed by enough release keys, for this digest, naming an allowed repository."""
    role = policy.roles["release"]
    found = cosign_signers(store, ref.pin, role, policy, read_bundles)
    if not report.check(found is not None, f"signature manifest {signature_tag(ref.pin, 'sig')} or a bundle signature present") \
            or found is None:
        return
    ok = len(found.by) >= role.threshold
    report.check(ok, f"signature valid for this digest, by {len(found.by)} of {role.threshold} required release "
                     f"key(s), naming an allowed repository (read: {', '.join(found.read)})"
                 + ("" if ok or not found.reasons else f": {'; '.join(found.reasons)}"))


def require_signed(store, ref: Reference, policy, what: str) -> None:
    """Raise IntegrityError unless enough release keys signed `ref`'s digest (cosign format). An
    acceptance is remembered (BAKERY_CACHE/verified/signatures), keyed by all that decided it: the
    same digest read from the same repository under the same keys, threshold and allowed
    repositories is then accepted without asking the registry again; anything else is verified
    afresh. A refusal is never remembered."""
    role = policy.roles["release"]
    path, decided_by = _signed_entry(ref, role, policy)
    remembered = _remembered_signers(path, decided_by)
    if remembered is not None and len(remembered) >= role.threshold:
        return
    found = cosign_signers(store, ref.pin, role, policy) or \
        Signers(set(), [f"it has no signature manifest {signature_tag(ref.pin, 'sig')} and no bundle signature"], [])
    signed_by, reasons = found.by, found.reasons
    if len(signed_by) < role.threshold:
        raise IntegrityError(f"{what} {ref} is signed by {len(signed_by)} of {role.threshold} required release "
                             f"key(s)" + (f" ({'; '.join(reasons)})" if reasons else ""))
    _remember_signers(path, decided_by, signed_by)


def _signed_entry(ref: Reference, role, policy) -> tuple[Path, dict]:
    """Where an accepted signature check of `ref` is kept, and all that decided it: the digest, where
    the signature was read, the role's keys (by keyid), its threshold and the allowed repositories."""
    from ..oci.registry import verified_dir

    decided_by = {"check": "cosign signature", "version": 1, "digest": str(ref.digest),
                  "read_from": f"{ref.registry}/{ref.repository}", "role": role.name,
                  "keys": sorted({keys_mod.keyid(k) for k in role.keys}), "threshold": role.threshold,
                  "allowed_repositories": list(policy.allowed_repositories)}
    name = hashlib.sha256(json.dumps(decided_by, sort_keys=True).encode()).hexdigest()
    return verified_dir() / "signatures" / f"{name}.json", decided_by


def _entry_sum(decided_by: dict, signed_by: list) -> str:
    return hashlib.sha256(json.dumps({"decided_by": decided_by, "signed_by": signed_by},
                                     sort_keys=True).encode()).hexdigest()


def _remembered_signers(path: Path, decided_by: dict) -> set[str] | None:
    """The keyids an earlier check here found signing, if its entry is whole and was decided by exactly
    this (a corrupt, edited or foreign entry is ignored: the signature is verified again)."""
    try:
        entry = json.loads(path.read_text())
        signed_by = entry["signed_by"]
        if entry["decided_by"] != decided_by or entry["sha256"] != _entry_sum(decided_by, signed_by):
            return None
        if not isinstance(signed_by, list) or not set(signed_by) <= set(decided_by["keys"]):
            return None
        return set(signed_by)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _remember_signers(path: Path, decided_by: dict, signed_by: set[str]) -> None:
    """Keep an accepted check, written whole or not at all; a cache that cannot be written is skipped."""
    from ..oci.registry import keep_verified

    signed = sorted(signed_by)
    keep_verified(path, json.dumps({"decided_by": decided_by, "signed_by": signed,
                                    "sha256": _entry_sum(decided_by, signed)}, sort_keys=True).encode())


SIGNATURE_LAYERS = 256  # a .sig or .att manifest holds a few: one per signature or statement


def _layers(manifest: bytes, what: str) -> list[Descriptor]:
    """The layer descriptors of a manifest someone else wrote; malformed or past SIGNATURE_LAYERS
    (each would be fetched and checked) is an IntegrityError."""
    return list(Manifest.parse(manifest, what, SIGNATURE_LAYERS).layers)


class Unjudged(Exception):
    """A statement whose role has no key here (and is not required): it can be neither accepted nor refused."""


def _open_statement(data: bytes, labelled: str, policy, where: str) -> tuple[Statement, set[str]]:
    """(statement, signing keyids) of one signed envelope (a .att layer or a bundle's), opened with
    the keys of the role that the statement's own predicateType names. The
    label beside it is not signed: it must agree with the statement or the envelope is refused. A
    rebuild statement is one rebuilder's: one key; how many rebuilders agree is counted across
    statements (_rebuilds)."""
    payload_type, payload, _ = sign.read_envelope(data, f"{where} {labelled}")
    statement = Statement.read(payload, f"{where} {labelled}")
    kind = statement.predicate_type
    role = _signing_role(kind, labelled, where, policy)
    if not role.keys:
        raise Unjudged(f"attestation {kind} not checked: no {role.name} key given (--{role.name}-key, or "
                       f"roles.{role.name}.keys in the policy)")
    if payload_type != sign.IN_TOTO:
        raise IntegrityError(f"attestation {kind}: payloadType {payload_type}, not {sign.IN_TOTO}")
    signers = _signers(role, lambda k: sign.open_envelope(data, k, f"attestation {kind}"))
    needed = 1 if kind == provenance.REBUILD_PREDICATE else role.threshold
    if not signers and kind == provenance.REBUILD_PREDICATE:  # anyone may rebuild; only listed rebuilders count
        raise Unjudged(f"attestation {kind} by a rebuilder this policy does not list: not counted")
    if len(signers) < needed:
        raise IntegrityError(f"attestation {kind} signed by {len(signers)} of {needed} required "
                             f"{role.name} key(s)")
    return statement, signers


def _signing_role(kind: str, labelled: str, where: str, policy):
    """The role whose keys or identity may sign a statement of this (signed) type; the unsigned label
    beside it must say the same."""
    if kind != labelled:
        raise IntegrityError(f"{where} annotated {labelled} holds a statement of type {kind}: refused "
                             f"(the annotation is unsigned; the signed statement decides who may sign it)")
    role = policy.role_for(kind)
    if role is None:
        raise IntegrityError(f"attestation of type {kind}: no role of the policy may sign that type; refused")
    return role


def _open_keyless_statement(data: bytes, labelled: str, policy) -> tuple[Statement, set[str]]:
    """_open_statement for a keyless bundle: the role its statement's type names, then that role's
    identity must have signed it (the chain, log proof and signature checked offline)."""
    from . import keyless

    kind = keyless.bundle_statement(data, f"bundle {labelled}").predicate_type
    role = _signing_role(kind, labelled, "bundle", policy)
    if role.name not in policy.identities:
        raise Unjudged(f"attestation {kind} signed keyless, not checked: the policy names no keyless identity for "
                       f"the {role.name} role")
    needed = 1 if kind == provenance.REBUILD_PREDICATE else role.threshold
    if needed != 1:
        raise IntegrityError(f"attestation {kind} signed keyless: one identity, and {needed} {role.name} signers "
                             f"are required")
    try:
        payload, signer = keyless_payload(data, role.name, policy, f"attestation {kind}")
    except IntegrityError as e:
        if kind == provenance.REBUILD_PREDICATE:  # as by key: anyone may rebuild; only the listed count
            raise Unjudged(f"{e}: not counted") from None
        raise
    statement = Statement.read(payload, f"attestation {kind}")
    if statement.predicate_type != kind:
        raise IntegrityError(f"attestation {kind}: the signed statement is of type {statement.predicate_type}")
    return statement, {signer}


def _envelopes(store, ref: Reference, report: Report, read_bundles=None) -> dict[str, list[tuple[str, bytes]]]:
    """{"tag" | "bundle": [(label, envelope or bundle)]}: the attestations in each format present."""
    tag = signature_tag(ref.pin, "att")
    out: dict[str, list[tuple[str, bytes]]] = {}
    manifest = store.manifest(tag)
    if manifest is not None:
        out["tag"] = []
        for desc in _layers(manifest, f"attestation manifest {tag}"):
            labelled = str(desc.annotations.get("predicateType", "(none)"))
            try:
                out["tag"].append((labelled, store.document(desc, f"attestation layer {labelled}")))
            except IntegrityError as e:
                report.check(False, str(e))
    bundles, via, unreadable = read_bundles or _bundles(store, ref.pin)
    for reason in unreadable:
        report.check(False, reason)
    statements = [(kind, data) for kind, data in bundles if kind != bundle.COSIGN_SIGN]
    if statements:
        out["bundle"] = statements
    read = ([f"tag {tag}"] if "tag" in out else []) + ([f"{len(statements)} bundle(s) via {via}"] if statements else [])
    report.check(bool(out), f"attestations present (read: {', '.join(read) or f'neither tag {tag} nor a bundle'})")
    return out


_WHERE = {"tag": "attestation layer", "bundle": "bundle"}


# the predicates verify reads typed (each read once, for every check of it); the others as JSON
TYPED = {provenance.SLSA_PREDICATE: provenance.Provenance.read, provenance.TEST_RESULT_PREDICATE: SmokeResult.read,
         provenance.VEX_PREDICATE: vex.Vex.read, sbom.SPDX_PREDICATE: sbom.Sbom.read}


def _attestations(store, ref: Reference, policy, report: Report, read_bundles=None) -> dict:
    """{predicateType: predicate} of the statements about this digest, each signed by its role;
    two statements of one type in one format are both refused (which one counts would be the
    pusher's choice); where both formats are present, each type must be the same statements in both
    (a verifier reading only one format must see what the other sees)."""
    found: dict[str, Any] = {}  # a rebuild's: a list of (signers, predicate), one per rebuilder
    seen: dict[str, dict[str, set]] = {}  # format -> type -> {(signed payload, its signers)}
    counts: dict[tuple[str, str], int] = {}
    forms = _envelopes(store, ref, report, read_bundles)
    for form, envelopes in forms.items():
        for labelled, data in envelopes:
            try:
                if form == "bundle" and bundle.is_keyless(data):
                    statement, signers = _open_keyless_statement(data, labelled, policy)
                else:
                    envelope = bundle.envelope_of(data, f"bundle {labelled}") if form == "bundle" else data
                    statement, signers = _open_statement(envelope, labelled, policy, _WHERE[form])
            except IntegrityError as e:
                report.check(False, str(e))
                continue
            except Unjudged as e:
                report.check(True, str(e))
                continue
            kind = statement.predicate_type
            counts[(form, kind)] = counts.get((form, kind), 0) + 1
            signed = (statement.raw, frozenset(signers))  # two rebuilders sign the very same statement
            if signed in seen.setdefault(form, {}).setdefault(kind, set()):
                continue
            seen[form][kind].add(signed)
            if form == "bundle" and signed in seen.get("tag", {}).get(kind, set()):
                continue  # the same signed statement in both formats: counted once
            about = statement.names(ref.pin)
            if report.check(about, f"attestation {kind} is about this digest"
                            + ("" if about else f" (it names sha256:{', '.join(statement.digests)})")):
                if kind == provenance.REBUILD_PREDICATE:  # one per rebuilder: counted by key, never one for all
                    found.setdefault(kind, []).append((signers, statement.predicate))
                elif kind in TYPED:  # read once, typed, for every reader of it
                    try:
                        found[kind] = TYPED[kind](statement.predicate, f"attestation {kind}")
                    except IntegrityError as e:
                        report.check(False, str(e))
                    else:
                        if kind == provenance.TEST_RESULT_PREDICATE:
                            _remember_failure(ref, found[kind])  # even one refused below as a duplicate
                else:
                    found[kind] = statement.predicate
    for (form, kind), n in sorted(counts.items()):
        if n > 1 and kind != provenance.REBUILD_PREDICATE:
            report.check(False, f"{n} signed statements of type {kind} for this digest"
                                f"{' in its bundles' if form == 'bundle' else ''}: refused (one per type; which one "
                                f"counts must not be the choice of whoever can push)")
            found.pop(kind, None)
    tagged, bundled = seen.get("tag", {}), seen.get("bundle", {})
    for kind in sorted(set(tagged) | set(bundled)) if len(forms) == 2 else ():
        if tagged.get(kind, set()) != bundled.get(kind, set()):
            report.check(False, f"the {kind} statements under the tag and in the bundles differ: refused (a verifier "
                                f"reading either format must see the same statements)")
            found.pop(kind, None)
    return found


def _vex(doc: vex.Vex, ref: Reference, report: Report) -> None:
    """Every statement is about this image: a VEX signed for one digest says nothing of another. Its
    products are this digest's pkg:oci purl (the same in @id and identifiers), its subcomponents
    Python packages; its status one OpenVEX knows. No statement at all is a VEX too (every overlay
    superseded)."""
    image = re.compile(r"pkg:oci/[^@?#/]+@" + re.escape(str(ref.digest).replace(":", "%3A")) + r"(\?[^#]*)?")
    wrong = [untrusted.safe(p.id, limit=120) for s in doc.statements for p in s.products
             if not (s.status in vex.STATUSES and image.fullmatch(p.id) and p.named_once
                     and all(c.id.startswith("pkg:pypi/") and c.named_once for c in p.subcomponents))]
    report.check(not wrong, f"every VEX statement is about this image ({len(doc.statements)} statement(s))"
                 + (f"; {len(wrong)} name another product or status: {wrong[0]}" if wrong else ""))


def _provenance(prov: provenance.Provenance, manifest: bytes, policy, report: Report) -> None:
    """How it was built: the pinned base, an allowed builder and source, a clean checkout."""
    report.check(prov.base == policy.base, f"provenance base is the pinned {policy.base}"
                 + ("" if prov.base == policy.base else f" (it names {prov.base})"))
    report.check(policy.source_allowed(prov.repository or ""),
                 f"provenance source {prov.repository} is an allowed repository")
    builder = prov.builder
    report.check(policy.builder_allowed(builder), f"builder {builder} is an allowed builder"
                 + ("" if policy.builder_allowed(builder) else " (a build from elsewhere: list it in allowed_builders "
                                                                "only if you trust that machine)"))
    dirty = prov.dirty is not False  # unless it says clean
    report.check(not dirty or policy.allow_dirty,
                 "built from a clean checkout" if not dirty else
                 ("built from a checkout with uncommitted changes, allowed by this (dev) policy" if policy.allow_dirty
                  else "built from a checkout with uncommitted or untracked changes: not reproducible from its "
                       "revision; refused (a dev policy may set allow_dirty: true)"))
    base_digest = json.loads(manifest).get("annotations", {}).get("org.opencontainers.image.base.digest", "")
    report.check(base_digest in prov.base_digests, f"image annotation base.digest {base_digest or '(none)'} "
                                          f"is the provenance's base")


def _as_of(as_of, policy, prov: provenance.Provenance, report: Report):
    """The policy as it stood at the revision the signed provenance names: an earlier release ran
    the base and smoke spec committed then, not today's."""
    revision = prov.revision
    if revision is None:
        raise IntegrityError("the signed provenance names no source revision")
    then = as_of(policy, revision)
    report.check(True, f"built from {untrusted.safe(str(revision))[:12]}, judged by the base and smoke spec committed there")
    return then


def _rebuilds(rebuilds: list, ref: Reference, needed: int, report: Report) -> None:
    """At least `needed` distinct rebuilder keys attest a rebuild that gave this very digest."""
    agreeing: set[str]
    disagreeing: set[str]
    agreeing, disagreeing = set(), set()
    said: dict[str, int] = {}
    for signers, predicate in rebuilds:
        with malformed("a rebuild attestation"):
            match = predicate["match"] is True and predicate["result"] == str(ref.digest)
        (agreeing if match else disagreeing).update(signers)
        for signer in signers:
            said[signer] = said.get(signer, 0) + 1
    twice = {signer for signer, n in said.items() if n > 1}  # an old word put back beside a newer one
    agreeing -= twice | disagreeing
    if twice:
        report.check(False, f"{len(twice)} rebuilder key(s) signed more than one rebuild statement for this digest: "
                            f"not counted (one word per rebuilder; which one counts must not be the pusher's choice)")
    report.check(len(agreeing) >= needed, f"rebuilt to this digest by {len(agreeing)} of {needed} required rebuilder "
                                          f"key(s)" + (f"; {len(disagreeing)} rebuilder(s) got other bytes"
                                                       if disagreeing else ""))


def verify(store, ref: Reference, policy, require_smoke: bool = False, blobs: bool = True,
           require_rebuilds: int = 0, smoke_run: str | None = None, as_of=None) -> Report:
    """Everything the policy asks of ref; smoke_run: the smoke result must say it ran in that
    workflow run (REPO#RUN_ID: the release's own). as_of, for an earlier release taken as a
    reference: as_of(policy, revision) is the policy with the base and smoke spec committed at the
    revision its signed provenance names (it raises where that revision is not one of ours)."""
    report = Report()
    rebuilds_needed = max(require_rebuilds, policy.require_rebuilds)
    flags = {"release": "key", "smoke": "smoke-key", "rebuilder": "rebuilder-key"}
    for name in ("release",) + (("smoke",) if require_smoke or policy.require_smoke else ()) \
            + (("rebuilder",) if rebuilds_needed else ()):
        if not policy.may_sign(name):
            raise InputError(f"no {name} public key: pass --{flags[name]} FILE, or list it under "
                             f"roles.{name}.keys in the policy (or name the role's identity under keyless.roles)")
    manifest = store.manifest(str(ref.digest))
    if not report.check(manifest is not None, f"image {ref} present"):
        return report
    if blobs:
        _step(report, f"image manifest {ref.digest}", _blobs, store, manifest, report, f"image manifest {ref.digest}")
    read: tuple = _step(report, "the image's referrers", _bundles, store, ref.pin) or \
        ([], "an unreadable listing", [])  # listed and read once, for both (its failure is a check already)
    _step(report, f"signature {signature_tag(ref.pin, 'sig')}", _signature, store, ref, policy, report, read)
    found = _step(report, f"attestations {signature_tag(ref.pin, 'att')}", _attestations, store, ref, policy,
                  report, read) or {}
    report.check(sbom.SPDX_PREDICATE in found, "SBOM (SPDX 2.3) attestation present and signed")
    vex_doc = found.get(provenance.VEX_PREDICATE)
    if report.check(vex_doc is not None, "VEX (OpenVEX 0.2.0) attestation present and signed"):
        _step(report, "the signed VEX", _vex, vex_doc, ref, report)
    prov = found.get(provenance.SLSA_PREDICATE)
    if report.check(prov is not None, "SLSA provenance attestation present and signed"):
        if as_of is not None:
            policy = _step(report, "the signed provenance's revision", _as_of, as_of, policy, prov, report) or policy
        _step(report, "the signed provenance", _provenance, prov, manifest, policy, report)
    if rebuilds_needed:
        _step(report, "the rebuild attestations", _rebuilds, found.get(provenance.REBUILD_PREDICATE, []), ref,
              rebuilds_needed, report)
    smoke_checked = require_smoke or policy.require_smoke
    if smoke_checked:
        _step(report, "the signed smoke result", _smoke, found.get(provenance.TEST_RESULT_PREDICATE), policy, report,
              str(ref.digest), smoke_run)
    if sbom.SPDX_PREDICATE in found:
        report.summary = _step(report, "the signed SBOM", summarize, found[sbom.SPDX_PREDICATE], prov) or {}
        if smoke_checked and provenance.TEST_RESULT_PREDICATE in found:
            report.summary["smoke"] = found[provenance.TEST_RESULT_PREDICATE].summary
    return report


def _smoke(smoke: SmokeResult | None, policy, report: Report, digest: str = "", run: str | None = None) -> None:
    """A PASSED result that ran the A/B against a reference on both paths, from the spec the policy
    pins, on the GPU it names, and not older than a FAILED this machine has seen for the same digest
    and spec (the ledger)."""
    ab = smoke is not None and smoke.ran_ab
    if not report.check(smoke is not None and smoke.passed and ab,
                        "a passing MI300X acceptance gate signed by a smoke key, its A/B run against a "
                        "reference on both paths"
                        + ("" if smoke else " (none attached, or not signed by a smoke key)")
                        + (f" (result {smoke.result}, {'the A/B ran' if ab else 'no A/B'})" if smoke else "")) \
            or smoke is None:
        return
    report.smoke = smoke.report
    report.check(smoke.launched_both,
                 "the gate launched this digest and its reference itself (a result against an --endpoint says what "
                 "a server started elsewhere answered, not what this digest or the named reference serves)")
    ran = smoke.spec_sha256
    report.check(ran == policy.smoke_spec, f"the smoke ran the pinned spec {policy_mod.SMOKE_SPEC} "
                 f"sha256:{policy.smoke_spec}" + ("" if ran == policy.smoke_spec else
                                                  f" (it ran sha256:{ran}: an older or other spec; run the smoke "
                                                  f"again with the pinned one)"))
    report.check(smoke.host.gfx_arch == policy.smoke_arch and smoke.host.compute_units == policy.smoke_compute_units,
                 f"the smoke ran on a {policy.smoke_arch} GPU with {policy.smoke_compute_units} CUs (it reports "
                 f"{smoke.summary})")
    if run is not None:
        said = smoke.workflow_run
        report.check(said == run, f"the smoke result is from workflow run {run}" + ("" if said == run else
                     f" (it says {str(said)[:80]}: a result of another run, put back over this run's?)"))
    if digest and ran is not None:
        from . import smoke_ledger

        later = smoke_ledger.later_failure(digest, ran, smoke.finished, smoke.run)
        report.check(later is None, "no later FAILED result for this digest and spec in this machine's smoke ledger"
                     + (f" (this PASSED finished {smoke.finished[:20]}; a FAILED finished {later['finished']}: an "
                        f"older result was put back over it)" if later else ""))
        smoke_ledger.remember(digest, ran, smoke.result, smoke.finished, smoke.run)


def _remember_failure(ref: Reference, smoke: SmokeResult) -> None:
    """A signed smoke result other than PASSED, seen here: kept in this machine's ledger, so an older
    PASSED put back over it is refused later."""
    from . import smoke_ledger

    if smoke.result != "PASSED" and smoke.spec_sha256 is not None:
        smoke_ledger.remember(str(ref.digest), smoke.spec_sha256, smoke.result, smoke.finished, smoke.run)


def _step(report: Report, what: str, fn, *args):
    """One part of verification; a document that will not parse, or a registry that fails, is a
    failed check with its reason (verification never crashes on what it reads)."""
    try:
        with malformed(what):
            return fn(*args)
    except BakeryError as e:
        report.check(False, str(e))
        return None


def summarize(spdx: sbom.Sbom, prov: provenance.Provenance | None) -> dict:
    """What is in the image, from the signed SBOM: base, overlays, kernels, tables."""
    base = spdx.package("SPDXRef-Base")
    return {
        "base": f"{base.name if base else None}@{base.version if base else None}",
        "python": [f"{p.name} {p.version}" for p in spdx.packages_of("Python")],
        "overlays": [f"{f.file_name.removeprefix('.')} sha256:{(f.sha256 or '?')[:12]}" for f in spdx.files
                     if f.spdx_id.startswith("SPDXRef-Overlay-")],
        "kernels": [f"{p.name} sha256:{(p.sha256 or '?')[:12]}" for p in spdx.packages_of("Artifact")],
        "tables": [f"{p.name} sha256:{(p.sha256 or '?')[:12]}" for p in spdx.packages_of("Tuning")],
        "source": prov.source if prov else {},
        "builder": (prov.builder or None) if prov else None,
    }


def require(report: Report) -> None:
    if report.failures:
        raise IntegrityError(f"verification failed: {'; '.join(report.failures)}")
