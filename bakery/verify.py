"""`invoke verify`: what ops run before deploying a digest. Every check must hold; each says why not."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from . import provenance, sbom, sign
from .errors import IntegrityError
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
        except Exception as e:  # a registry error is a failed check here, not a crash
            bad.append(f"{d.digest}: {e}")
    report.check(not bad, f"all {len(descs)} blobs present and matching their digests" +
                 (f": {bad[0]}" if bad else ""))


def _signature(store, ref: Reference, key, report: Report) -> None:
    manifest = store.manifest(signature_tag(ref.digest, "sig"))
    if not report.check(manifest is not None, f"signature manifest {signature_tag(ref.digest, 'sig')} present"):
        return
    reasons = []
    for layer in json.loads(manifest)["layers"]:
        desc = Descriptor.from_json(layer)
        try:
            payload = store.blob(desc)
            sign.check(key, base64.b64decode(desc.annotations.get("dev.cosignproject.cosign/signature", "")),
                       payload, "image signature")
            critical = json.loads(payload)["critical"]
        except (IntegrityError, ValueError, KeyError) as e:
            reasons.append(str(e))
            continue
        signed_digest = critical["image"]["docker-manifest-digest"]
        signed_name = critical["identity"]["docker-reference"]
        if signed_digest != str(ref.digest):
            reasons.append(f"signature is for {signed_digest}, not {ref.digest} (copied from another image)")
        elif signed_name != ref.name:
            reasons.append(f"signature names repository {signed_name}, not {ref.name}")
        else:
            reasons = []
            break
    report.check(not reasons, "signature valid for this digest and repository" +
                 (f": {'; '.join(reasons)}" if reasons else ""))


def _attestations(store, ref: Reference, key, report: Report) -> dict:
    manifest = store.manifest(signature_tag(ref.digest, "att"))
    found: dict[str, dict] = {}
    if not report.check(manifest is not None, f"attestation manifest {signature_tag(ref.digest, 'att')} present"):
        return found
    for layer in json.loads(manifest)["layers"]:
        desc = Descriptor.from_json(layer)
        kind = desc.annotations.get("predicateType", "?")
        try:
            statement = json.loads(sign.open_envelope(store.blob(desc), key, f"attestation {kind}"))
        except (IntegrityError, ValueError) as e:
            report.check(False, str(e))
            continue
        subjects = [s["digest"].get("sha256") for s in statement.get("subject", [])]
        if report.check(ref.digest.hex in subjects,
                        f"attestation {statement.get('predicateType')} is about this digest"
                        + ("" if ref.digest.hex in subjects else f" (it names sha256:{', '.join(subjects)})")):
            found[statement["predicateType"]] = statement["predicate"]
    return found


def verify(store, ref: Reference, key, policy: dict, require_smoke: bool = False, blobs: bool = True) -> Report:
    report = Report()
    manifest = store.manifest(str(ref.digest))
    if not report.check(manifest is not None, f"image {ref} present"):
        return report
    if blobs:
        _blobs(store, manifest, report)
    _signature(store, ref, key, report)
    found = _attestations(store, ref, key, report)
    report.check(sbom.SPDX_PREDICATE in found, "SBOM (SPDX 2.3) attestation present and signed")
    prov = found.get(provenance.SLSA_PREDICATE)
    if report.check(prov is not None, "SLSA provenance attestation present and signed"):
        params = prov["buildDefinition"]["externalParameters"]
        report.check(params.get("base") == policy["base"],
                     f"provenance base is the pinned {policy['base']}"
                     + ("" if params.get("base") == policy["base"] else f" (it names {params.get('base')})"))
        source = params.get("source", {}).get("repository")
        report.check(source in policy["allowed_sources"],
                     f"provenance source {source} is an allowed repository")
        base_digest = json.loads(manifest).get("annotations", {}).get("org.opencontainers.image.base.digest", "")
        resolved = {f"sha256:{d['digest'].get('sha256')}" for d in prov["buildDefinition"]["resolvedDependencies"]
                    if d.get("name", "").startswith("base image")}
        report.check(base_digest in resolved, f"image annotation base.digest {base_digest or '(none)'} "
                                              f"is the provenance's base")
    if require_smoke or policy.get("require_smoke"):
        smoke = found.get(SMOKE_PREDICATE)
        compared = ((smoke or {}).get("report") or {}).get("regression_compared", 0)
        report.check(smoke is not None and smoke.get("result") == "PASSED" and compared > 0,
                     "a passing MI300X smoke attestation, its regression outputs compared"
                     + ("" if smoke else " (none attached)")
                     + (f" (result {smoke.get('result')}, {compared} outputs compared)" if smoke else ""))
    if sbom.SPDX_PREDICATE in found:
        report.summary = summarize(found[sbom.SPDX_PREDICATE], prov)
    return report


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


