"""`invoke verify`: what ops run before deploying a digest. Every check must hold; each says why not."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from . import keys as keys_mod, provenance, sbom, sign
from .errors import BakeryError, InputError, IntegrityError, malformed
from .refs import Descriptor, Reference
from .store import signature_tag

SMOKE_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"  # bakery.smoke.TEST_RESULT


@dataclass
class Report:
    checks: list = field(default_factory=list)  # (ok, what)
    summary: dict = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> bool:
        self.checks.append((ok, what))
        return ok

    @property
    def failures(self) -> list[str]:
        return [what for ok, what in self.checks if not ok]


def _blobs(store, manifest: bytes, report: Report) -> None:
    """Every blob the manifest names is present and hashes to its digest."""
    body = json.loads(manifest)
    descs = [Descriptor.from_json(body["config"])] + [Descriptor.from_json(l) for l in body["layers"]]
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


def _signature(store, ref: Reference, policy, report: Report) -> None:
    """The cosign signature: signed by enough release keys, for this digest, naming a repository the
    policy allows (not necessarily the one read from: a mirror keeps the original's signature)."""
    manifest = store.manifest(signature_tag(ref.digest, "sig"))
    if not report.check(manifest is not None, f"signature manifest {signature_tag(ref.digest, 'sig')} present"):
        return
    role, reasons, signed_by = policy.roles["release"], [], set()
    for layer in json.loads(manifest)["layers"]:
        desc = Descriptor.from_json(layer)
        try:
            payload = store.blob(desc)
            signature = base64.b64decode(desc.annotations.get("dev.cosignproject.cosign/signature", ""))
            critical = json.loads(payload)["critical"]
            signed_digest = critical["image"]["docker-manifest-digest"]
            signed_name = critical["identity"]["docker-reference"]
        except (IntegrityError, ValueError, KeyError, TypeError) as e:
            reasons.append(f"unreadable signature: {e}")
            continue
        keyids = _signers(role, lambda k: sign.check(k, signature, payload, "image signature"))
        if not keyids:
            reasons.append("not signed by a release key of the policy")
        elif signed_digest != str(ref.digest):
            reasons.append(f"signature is for {signed_digest}, not {ref.digest} (copied from another image)")
        elif not policy.repository_allowed(signed_name):
            reasons.append(f"signature names repository {signed_name}, which the policy's allowed_repositories "
                           f"do not list")
        else:
            signed_by.update(keyids)
    ok = len(signed_by) >= role.threshold
    report.check(ok, f"signature valid for this digest, by {len(signed_by)} of {role.threshold} required release "
                     f"key(s), naming an allowed repository" + ("" if ok or not reasons else f": {'; '.join(reasons)}"))


def _attestations(store, ref: Reference, policy, report: Report) -> dict:
    """Each attestation opened with the keys of its role: smoke results with smoke keys, the rest with
    release keys; a statement signed by the other role's key is refused."""
    manifest = store.manifest(signature_tag(ref.digest, "att"))
    found: dict[str, dict] = {}
    if not report.check(manifest is not None, f"attestation manifest {signature_tag(ref.digest, 'att')} present"):
        return found
    for layer in json.loads(manifest)["layers"]:
        desc = Descriptor.from_json(layer)
        kind = desc.annotations.get("predicateType", "?")
        role = policy.roles["smoke" if kind == SMOKE_PREDICATE else "release"]
        try:
            data = store.blob(desc)
        except IntegrityError as e:
            report.check(False, str(e))
            continue
        opened = {}
        signers = _signers(role, lambda k: opened.setdefault("body", sign.open_envelope(data, k, f"attestation {kind}")))
        if len(signers) < role.threshold:
            report.check(False, f"attestation {kind} signed by {len(signers)} of {role.threshold} required "
                                f"{role.name} key(s)")
            continue
        try:
            statement = json.loads(opened["body"])
        except ValueError as e:
            report.check(False, f"attestation {kind} is not JSON: {e}")
            continue
        subjects = [s["digest"].get("sha256") for s in statement.get("subject", [])]
        if report.check(ref.digest.hex in subjects,
                        f"attestation {statement.get('predicateType')} is about this digest"
                        + ("" if ref.digest.hex in subjects else f" (it names sha256:{', '.join(subjects)})")):
            found[statement["predicateType"]] = statement["predicate"]
    return found


def _provenance(prov: dict, manifest: bytes, policy, report: Report) -> None:
    """How it was built: the pinned base, an allowed builder and source, a clean checkout."""
    params = prov["buildDefinition"]["externalParameters"]
    report.check(params.get("base") == policy.base, f"provenance base is the pinned {policy.base}"
                 + ("" if params.get("base") == policy.base else f" (it names {params.get('base')})"))
    source = params.get("source", {})
    report.check(policy.source_allowed(source.get("repository") or ""),
                 f"provenance source {source.get('repository')} is an allowed repository")
    builder = prov.get("runDetails", {}).get("builder", {}).get("id", "")
    report.check(policy.builder_allowed(builder), f"builder {builder} is an allowed builder"
                 + ("" if policy.builder_allowed(builder) else " (a build from elsewhere: list it in allowed_builders "
                                                                "only if you trust that machine)"))
    dirty = source.get("dirty", True)
    report.check(not dirty or policy.allow_dirty,
                 "built from a clean checkout" if not dirty else
                 ("built from a checkout with uncommitted changes, allowed by this (dev) policy" if policy.allow_dirty
                  else "built from a checkout with uncommitted or untracked changes: not reproducible from its "
                       "revision; refused (a dev policy may set allow_dirty: true)"))
    base_digest = json.loads(manifest).get("annotations", {}).get("org.opencontainers.image.base.digest", "")
    resolved = {f"sha256:{d['digest'].get('sha256')}" for d in prov["buildDefinition"]["resolvedDependencies"]
                if d.get("name", "").startswith("base image")}
    report.check(base_digest in resolved, f"image annotation base.digest {base_digest or '(none)'} "
                                          f"is the provenance's base")


def verify(store, ref: Reference, policy, require_smoke: bool = False, blobs: bool = True) -> Report:
    report = Report()
    for name in ("release",) + (("smoke",) if require_smoke or policy.require_smoke else ()):
        if not policy.roles[name].keys:
            raise InputError(f"no {name} public key: pass --{'key' if name == 'release' else 'smoke-key'} FILE, or "
                             f"list it under roles.{name}.keys in the policy")
    manifest = store.manifest(str(ref.digest))
    if not report.check(manifest is not None, f"image {ref} present"):
        return report
    if blobs:
        _step(report, f"image manifest {ref.digest}", _blobs, store, manifest, report)
    _step(report, f"signature {signature_tag(ref.digest, 'sig')}", _signature, store, ref, policy, report)
    found = _step(report, f"attestations {signature_tag(ref.digest, 'att')}", _attestations, store, ref, policy,
                  report) or {}
    report.check(sbom.SPDX_PREDICATE in found, "SBOM (SPDX 2.3) attestation present and signed")
    prov = found.get(provenance.SLSA_PREDICATE)
    if report.check(prov is not None, "SLSA provenance attestation present and signed"):
        _step(report, "the signed provenance", _provenance, prov, manifest, policy, report)
    if require_smoke or policy.require_smoke:
        smoke = found.get(SMOKE_PREDICATE)
        compared = ((smoke or {}).get("report") or {}).get("regression_compared", 0)
        report.check(smoke is not None and smoke.get("result") == "PASSED" and compared > 0,
                     "a passing MI300X smoke attestation signed by a smoke key, its regression outputs compared"
                     + ("" if smoke else " (none attached, or not signed by a smoke key)")
                     + (f" (result {smoke.get('result')}, {compared} outputs compared)" if smoke else ""))
    if sbom.SPDX_PREDICATE in found:
        report.summary = _step(report, "the signed SBOM", summarize, found[sbom.SPDX_PREDICATE], prov) or {}
    return report


def _step(report: Report, what: str, fn, *args):
    """One part of verification; a document that will not parse, or a registry that fails, is a
    failed check with its reason (verification never crashes on what it reads)."""
    try:
        with malformed(what):
            return fn(*args)
    except BakeryError as e:
        report.check(False, str(e))
        return None


def summarize(spdx: dict, prov: dict | None) -> dict:
    """What is in the image, from the signed SBOM: base, overlays, kernels, tables."""
    def by(prefix):
        return [p for p in spdx["packages"] if p["SPDXID"].startswith(prefix)]

    base = next((p for p in spdx["packages"] if p["SPDXID"] == "SPDXRef-Base"), {})
    return {
        "base": f"{base.get('name')}@{base.get('versionInfo')}",
        "python": [f"{p['name']} {p.get('versionInfo')}" for p in by("SPDXRef-Python-")],
        "overlays": [f"{p['name']} sha256:{p['checksums'][0]['checksumValue'][:12]}" for p in by("SPDXRef-Overlay-")],
        "kernels": [f"{p['name']} sha256:{p['checksums'][0]['checksumValue'][:12]}" for p in by("SPDXRef-Artifact-")],
        "tables": [f"{p['name']} sha256:{p['checksums'][0]['checksumValue'][:12]}" for p in by("SPDXRef-Tuning-")],
        "source": (prov or {}).get("buildDefinition", {}).get("externalParameters", {}).get("source", {}),
        "builder": (prov or {}).get("runDetails", {}).get("builder", {}).get("id"),
    }


def require(report: Report) -> None:
    if report.failures:
        raise IntegrityError(f"verification failed: {'; '.join(report.failures)}")


