"""SLSA v1 provenance (an in-toto Statement v1) from the build record, and the predicate types we sign."""

from __future__ import annotations

from ..files import canonical_json
from ..oci.refs import Reference
from .record import BuildRecord

STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
SPDX_PREDICATE = "https://spdx.dev/Document"
# OpenVEX (bakery/trust/vex.py): the in-toto type is the unversioned namespace, the one cosign 2.5's
# `--type openvex` selects; the document's @context says which version (0.2.0)
VEX_PREDICATE = "https://openvex.dev/ns"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
REBUILD_PREDICATE = "https://github.com/dsv4-mi300x/bakery/rebuild/v1"  # `invoke reproduce --attest`
BUILD_TYPE = "https://github.com/dsv4-mi300x/bakery/build/v1"


def statement(subject: Reference, predicate_type: str, predicate: dict) -> bytes:
    """An in-toto Statement v1 about one image digest, serialized deterministically."""
    body = {"_type": STATEMENT, "subject": [{"name": subject.name, "digest": {"sha256": subject.pin.hex}}],
            "predicateType": predicate_type, "predicate": predicate}
    return canonical_json(body)


def predicate(record: BuildRecord) -> dict:
    """The SLSA v1 predicate: what was built from what, by whom; nothing recomputed."""
    src, base = record.source, record.base
    deps = [{"uri": f"docker://{base.pinned}", "digest": {"sha256": base.pinned.pin.hex}, "name": "base image"},
            {"uri": f"git+{src.repository}@{src.revision}", "digest": {"gitCommit": src.revision},
             "name": "source"}]
    if base.manifest_digest != base.pinned.digest:  # the pin named an index: add the platform image
        deps.insert(1, {"uri": f"docker://{base.name}@{base.manifest_digest}",
                        "digest": {"sha256": base.manifest_digest.hex}, "name": f"base image ({base.platform})"})
    deps += [{"name": i.path, "digest": {"sha256": i.sha256}} for i in record.inputs]
    for artifact in record.artifacts:
        deps += [{"name": s.path, "digest": {"sha256": s.sha256}} for s in artifact.sources
                 if not any(d.get("name") == s.path for d in deps)]
    kernels = record.kernels.artifact
    if kernels:  # the OCI artifact the baked .so files came from (or were pushed as)
        deps.append({"uri": f"docker://{kernels.name}@{kernels.digest}", "digest": {"sha256": kernels.pin.hex},
                     "name": "kernel artifact"})
    # proof verdicts this build took, signed, instead of proving (the others it proved: byproducts)
    verdicts = [v for v in record.verdicts if v.artifact]
    deps += [{"uri": f"docker://{v.artifact.name}@{v.artifact.digest}", "digest": {"sha256": v.artifact.pin.hex},
              "name": f"proof verdict: {v.overlay} ({v.side})", "annotations": {"verdict": v.verdict}}
             for v in verdicts if v.artifact and v.origin == "registry"]
    byproducts = [{"name": a.path, "digest": {"sha256": a.sha256},
                   "annotations": {"arch": a.arch, "toolchain": a.toolchain}} for a in record.artifacts]
    byproducts += [{"name": f"layer: {layer.comment}", "digest": {"sha256": layer.descriptor.digest.hex},
                    "mediaType": layer.descriptor.media_type} for layer in record.layers]
    # each baked overlay's proof: the code that judged it, and what it said on stock and overlaid bytes
    byproducts += [{"name": f"proof: {o.id}", "digest": {"sha256": o.proof["code_sha256"]},
                    "annotations": {"stock": o.proof["stock"], "overlaid": o.proof["overlaid"],
                                    "script": o.proof["script"], "reason": o.proof["reason"]}}
                   for o in record.overlays if o.baked and o.proof and o.proof.get("code_sha256")]
    byproducts += [{"uri": f"docker://{v.artifact.name}@{v.artifact.digest}",
                    "digest": {"sha256": v.artifact.pin.hex},
                    "name": f"proof verdict: {v.overlay} ({v.side})", "annotations": {"verdict": v.verdict}}
                   for v in verdicts if v.artifact and v.origin == "proven"]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "base": str(base.pinned),
                "platform": base.platform,
                "source": {"repository": src.repository, "revision": src.revision, "dirty": src.dirty},
                "overlaysLock": {"sha256": record.overlays_lock.sha256, "base": record.overlays_lock.base},
                "sourceDateEpoch": src.source_date_epoch,
            },
            "internalParameters": {"tools": record.tools},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": record.builder.id},
            "metadata": {"invocationId": record.builder.invocation, "startedOn": record.started,
                         "finishedOn": record.finished},
            "byproducts": byproducts,
        },
    }
