"""SLSA v1 provenance (the predicate of an in-toto statement, trust/statement.py) from the build record, and
the predicate types we sign."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import IntegrityError
from .record import BuildRecord
from .statement import Shape

SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
SPDX_PREDICATE = "https://spdx.dev/Document"
# OpenVEX (bakery/trust/vex.py): the in-toto type is the unversioned namespace, the one cosign 2.5's
# `--type openvex` selects; the document's @context says which version (0.2.0)
VEX_PREDICATE = "https://openvex.dev/ns"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
REBUILD_PREDICATE = "https://github.com/dsv4-mi300x/bakery/rebuild/v1"  # `invoke reproduce --attest`
BUILD_TYPE = "https://github.com/dsv4-mi300x/bakery/build/v1"


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


@dataclass(frozen=True)
class Dependency:
    """A resolved dependency or a byproduct, as the predicate names it."""
    name: str
    uri: str = ""
    sha256: str | None = None
    annotations: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class Provenance:
    """A SLSA v1 predicate as bakery writes it (of) and reads it back (read): what verify, reproduce
    and prune judge, typed once, and the predicate itself. A field may be absent (an older or
    another writer's predicate): each reader says what it needs; one present with the wrong type is
    refused."""
    base: str | None
    repository: str | None
    revision: str | None
    dirty: bool | None
    source_date_epoch: int | None
    builder: str
    dependencies: tuple[Dependency, ...]
    byproducts: tuple[Dependency, ...]
    source: dict  # as the predicate names it (what verify's summary shows)
    document: dict

    @classmethod
    def of(cls, record: BuildRecord) -> Provenance:
        return cls.read(predicate(record))

    @classmethod
    def read(cls, doc: dict, what: str = "the provenance") -> Provenance:
        shape = Shape(what)
        obj, typed = shape.obj, shape.typed

        def listed(value, where: str) -> tuple[Dependency, ...]:
            out = []
            for d in shape.rows(value, where):
                d = obj(d, where)
                digest = obj(d.get("digest"), f"{where}' digest")
                out.append(Dependency(typed(d.get("name"), str, f"{where}' name") or "",
                                      typed(d.get("uri"), str, f"{where}' uri") or "",
                                      typed(digest.get("sha256"), str, f"{where}' sha256"),
                                      obj(d.get("annotations"), f"{where}' annotations")))
            return tuple(out)

        _keys_once(doc, what)
        build, run = obj(obj(doc, "the predicate").get("buildDefinition"), "buildDefinition"), \
            obj(doc.get("runDetails"), "runDetails")
        params = obj(build.get("externalParameters"), "externalParameters")
        source = obj(params.get("source"), "the source")
        return cls(typed(params.get("base"), str, "the base"), typed(source.get("repository"), str, "the repository"),
                   typed(source.get("revision"), str, "the revision"), typed(source.get("dirty"), bool, "dirty"),
                   typed(params.get("sourceDateEpoch"), int, "sourceDateEpoch"),
                   typed(obj(run.get("builder"), "the builder").get("id"), str, "the builder id") or "",
                   listed(build.get("resolvedDependencies"), "resolvedDependencies"),
                   listed(run.get("byproducts"), "byproducts"), source, doc)

    @property
    def base_digests(self) -> set[str]:
        """sha256:HEX of the dependencies named as the base image (and its platform image)."""
        return {f"sha256:{d.sha256}" for d in self.dependencies if d.name.startswith("base image") and d.sha256}

    @property
    def uris(self) -> list[str]:
        """The URIs of its dependencies and byproducts."""
        return [d.uri for d in (*self.dependencies, *self.byproducts) if d.uri]


def _keys_once(value, what: str, depth: int = 0) -> None:
    """Each object of the predicate holds each key once, ignoring case: slsa-verifier and cosign
    decode SLSA v1 into Go structs, whose fields match keys without case (buildDefinition beside
    BuildDefinition is one field to them and two to Python)."""
    from ..files import one_each

    if depth > 64:
        raise IntegrityError(f"{what}: nested past 64 levels")
    if isinstance(value, dict):
        try:
            one_each(list(value.items()))
        except ValueError as e:
            raise IntegrityError(f"{what}: {e}") from None
        for v in value.values():
            _keys_once(v, what, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _keys_once(v, what, depth + 1)
