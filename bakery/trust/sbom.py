"""SPDX 2.3 JSON of a derived image: a view of the build record, deterministic to the byte."""

from __future__ import annotations

import json
import re

from ..inputs.image import rfc3339

from .provenance import SPDX_PREDICATE  # noqa: F401 (re-exported: the SBOM's statement type)
from .record import BuildRecord


def _id(kind: str, name: str) -> str:
    return f"SPDXRef-{kind}-" + re.sub(r"[^A-Za-z0-9.-]+", "-", name).strip("-")


def _package(spdx_id: str, name: str, version: str | None, sha256: str | None = None, purpose: str | None = None,
             purl: str | None = None, download: str = "NOASSERTION", comment: str | None = None) -> dict:
    pkg = {"SPDXID": spdx_id, "name": name, "downloadLocation": download, "filesAnalyzed": False,
           "licenseConcluded": "NOASSERTION", "licenseDeclared": "NOASSERTION", "copyrightText": "NOASSERTION"}
    if version:
        pkg["versionInfo"] = version
    if sha256:
        pkg["checksums"] = [{"algorithm": "SHA256", "checksumValue": sha256}]
    if purpose:
        pkg["primaryPackagePurpose"] = purpose
    if purl:
        pkg["externalRefs"] = [{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": purl}]
    if comment:
        pkg["comment"] = comment
    return pkg


def _oci_purl(name: str, digest: str) -> str:
    registry, _, repo = name.partition("/")
    return f"pkg:oci/{repo.rsplit('/', 1)[-1]}@{digest.replace(':', '%3A')}?repository_url={registry}/{repo}"


def proof_summary(proof: dict | None) -> str:
    """One line on how an overlay was proven."""
    if not proof:
        return "no proof recorded"
    if "hardware" in proof:
        return f"no proof runs off the hardware: {proof['hardware']}"
    return (f"proof {proof['script']} (code sha256 {proof['code_sha256']}): stock {proof['stock']}, "
            f"overlaid {proof['overlaid']} ({proof['reason']})")


def document(record: BuildRecord, image_name: str) -> bytes:
    """The SBOM for the image the record describes; image_name is where it was pushed."""
    digest = str(record.manifest.digest)
    image_id = "SPDXRef-Image"
    base = record.base
    base_digest = str(base.manifest_digest)
    packages = [
        _package(image_id, image_name, digest, record.manifest.digest.hex, "CONTAINER", _oci_purl(image_name, digest)),
        _package("SPDXRef-Base", base.name, base_digest, base.manifest_digest.hex, "CONTAINER",
                 _oci_purl(base.name, base_digest)),
    ]
    rels = [("SPDXRef-DOCUMENT", "DESCRIBES", image_id), (image_id, "DESCENDANT_OF", "SPDXRef-Base")]
    for dist in base.python_distributions:
        pid = _id("Python", dist.name)
        packages.append(_package(pid, dist.name, dist.version, purpose="LIBRARY",
                                 purl=f"pkg:pypi/{dist.name.lower()}@{dist.version}",
                                 comment=f"installed in the base; metadata {dist.metadata}"))
        rels.append(("SPDXRef-Base", "CONTAINS", pid))
    for o in record.overlays:
        up = o.upstream
        upstream_id, patch_id, overlay_id = _id("Upstream", o.id), _id("Patch", o.id), _id("Overlay", o.id)
        packages.append(_package(upstream_id, up["path"], up["ref"], o.base_sha256, "FILE",
                                 download=f"git+{up['repo']}@{up['ref']}#{up['path']}",
                                 comment="the upstream file as found in the base"))
        if o.patch_sha256:
            packages.append(_package(patch_id, o.patch, None, o.patch_sha256, "FILE",
                                     comment=f"{o.kind}; {o.reason}"))
            rels.append((patch_id, "PATCH_FOR", upstream_id))
        if o.baked:
            packages.append(_package(overlay_id, o.target, None, o.result_sha256, "FILE",
                                     comment=f"overlay {o.id} ({o.status}), platforms {', '.join(o.platforms)}; "
                                     + proof_summary(o.proof)))
            rels += [(image_id, "CONTAINS", overlay_id), (overlay_id, "GENERATED_FROM", upstream_id)]
            if o.patch_sha256:
                rels.append((overlay_id, "GENERATED_FROM", patch_id))
        else:
            rels.append((image_id, "OTHER", upstream_id))
    kernels = record.kernels.artifact
    if kernels:
        packages.append(_package("SPDXRef-KernelArtifact", kernels.name, str(kernels.digest), kernels.digest.hex,
                                 "ARCHIVE", _oci_purl(kernels.name, str(kernels.digest)),
                                 comment="the OCI artifact of the compiled kernels (kernels-<key>): compiled by this "
                                         "build and pushed, or taken from the registry under a release-key signature"))
    for artifact in record.artifacts:
        aid = _id("Artifact", artifact.name)
        packages.append(_package(aid, artifact.path, None, artifact.sha256, "FILE",
                                 comment=f"compiled for {artifact.arch} with {artifact.toolchain}"
                                 + "".join(f"; {s['operator']} serves {s['function']} (overlay {s['overlay']})"
                                           for s in artifact.serves)))
        rels.append((image_id, "CONTAINS", aid))
        if kernels:
            rels.append(("SPDXRef-KernelArtifact", "CONTAINS", aid))
        for src in artifact.sources:
            sid = _id("Source", src.path)
            if not any(p["SPDXID"] == sid for p in packages):
                packages.append(_package(sid, src.path, None, src.sha256, "SOURCE"))
            rels.append((aid, "GENERATED_FROM", sid))
    for table in record.tuning:
        tid = _id("Tuning", table.name)
        packages.append(_package(tid, table.path, None, table.sha256, "FILE", comment="AITER tuning table"))
        rels.append((image_id, "CONTAINS", tid))
    described = {o.target for o in record.overlays if o.baked} | {a.path for a in record.artifacts} \
        | {t.path for t in record.tuning}
    for f in record.files:
        if f.path in described:
            continue
        fid = _id("File", f.path)
        purpose = "FILE" if f.path != record.image.entrypoint[0] else "APPLICATION"
        packages.append(_package(fid, f.path, None, f.sha256, purpose,
                                 comment="entrypoint" if purpose == "APPLICATION" else None))
        rels.append((image_id, "CONTAINS", fid))
    doc = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{image_name}@{digest}",
        "documentNamespace": f"{record.source.repository}/spdx/{digest.replace(':', '-')}",
        "creationInfo": {"created": rfc3339(record.source.source_date_epoch),
                         "creators": [f"Tool: bakery-{record.tools['bakery']}"]},
        "packages": packages,
        "relationships": [{"spdxElementId": a, "relationshipType": t, "relatedSpdxElement": b} for a, t, b in rels],
    }
    return json.dumps(doc, indent=1, sort_keys=True).encode()
