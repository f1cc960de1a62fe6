"""The build record (build-record.json): every input and output of a build by digest, as typed
values checked on load. SBOM and provenance are views of it; `invoke attest` signs them. The build
writes it (bakery.bake.pipeline, with what the build says of itself from bakery.bake.record).

A record read back gives the bytes it was written with: each section takes exactly its keys and
gives them back. Parts whose shape belongs to another module (a proof's summary, an upstream pin,
push statistics, a kernel's code objects) are kept as the JSON they are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..errors import InputError
from ..oci.layer import write_blob
from ..oci.refs import Descriptor, Digest, Reference

SCHEMA = "https://github.com/dsv4-mi300x/bakery/build-record/v2"
OPTIONAL = type(None)


def checked(obj, shape: dict, where: str) -> dict:
    """obj, if it is a mapping with exactly shape's keys, each of its type(s); else one input error."""
    if not isinstance(obj, dict):
        raise InputError(f"build record: {where} must be a mapping, got {type(obj).__name__}")
    if set(obj) != set(shape):
        odd = sorted(set(obj) ^ set(shape))
        raise InputError(f"build record: {where} has other keys than {', '.join(sorted(shape))} "
                         f"(differs in {', '.join(map(str, odd))}): build again")
    for key, kinds in shape.items():
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        value = obj[key]
        # bool is an int to isinstance: a count or size that says `true` is refused all the same
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = "/".join("null" if k is OPTIONAL else k.__name__ for k in kinds)
            raise InputError(f"build record: {where}.{key} must be {names}, got {type(value).__name__}")
    return obj


def _listed(obj, where: str) -> list:
    if not isinstance(obj, list):
        raise InputError(f"build record: {where} must be a list, got {type(obj).__name__}")
    return obj


def _digest(text: str, where: str) -> Digest:
    try:
        digest = Digest.parse(text)
    except InputError:
        digest = None
    if digest is None or digest.algorithm != "sha256":
        raise InputError(f"build record: {where} is not a sha256 digest: build again")
    return digest


def _pinned(text: str, where: str) -> Reference:
    """A reference by sha256 digest, written as a build writes it (the signed documents name it)."""
    ref = Reference.parse(text)
    if ref.digest is None or ref.digest.algorithm != "sha256" or str(ref) != text:
        raise InputError(f"build record: {where} {text!r} is not REGISTRY/REPO@sha256:DIGEST as a build writes "
                         f"it: build again")
    return ref


# each section's keys and their types, for checked (beside its class: a NamedTuple holds only fields)
_SOURCE_SHAPE = {"repository": str, "revision": str, "dirty": bool, "source_date_epoch": int}


class Source(NamedTuple):
    repository: str
    revision: str
    dirty: bool
    source_date_epoch: int

    @classmethod
    def from_json(cls, obj) -> Source:
        return cls(**checked(obj, _SOURCE_SHAPE, "source"))

    def to_json(self) -> dict:
        return {"repository": self.repository, "revision": self.revision, "dirty": self.dirty,
                "source_date_epoch": self.source_date_epoch}


_HASHED_SHAPE = {"path": str, "sha256": str}


class Hashed(NamedTuple):
    """A file by path and sha256: a checked-in input, or a kernel's source."""
    path: str
    sha256: str

    @classmethod
    def from_json(cls, obj, where: str) -> Hashed:
        return cls(**checked(obj, _HASHED_SHAPE, where))

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256}


_DISTRIBUTION_SHAPE = {"name": str, "version": str, "metadata": str, "sha256": str, "supplier": (str, OPTIONAL)}


class Distribution(NamedTuple):
    """A Python distribution installed in the base, as its METADATA names it; supplier: its Author or
    Maintainer (None: it names neither)."""
    name: str
    version: str
    metadata: str
    sha256: str
    supplier: str | None

    @classmethod
    def from_json(cls, obj, where: str) -> Distribution:
        return cls(**checked(obj, _DISTRIBUTION_SHAPE, where))

    def to_json(self) -> dict:
        return self._asdict()


_OPERATING_SYSTEM_SHAPE = {"id": str, "version_id": (str, OPTIONAL), "name": str, "path": str}


class OperatingSystem(NamedTuple):
    """The base's os-release: ID, VERSION_ID (None: it gives none), NAME, and which file said so."""
    id: str
    version_id: str | None
    name: str
    path: str

    @classmethod
    def from_json(cls, obj) -> OperatingSystem:
        return cls(**checked(obj, _OPERATING_SYSTEM_SHAPE, "base.os"))

    def to_json(self) -> dict:
        return self._asdict()


_DEB_PACKAGE_SHAPE = {"name": str, "version": str, "arch": str, "source": str, "source_version": str,
                      "maintainer": (str, OPTIONAL), "licenses": list, "status": str}


class DebPackage(NamedTuple):
    """A package dpkg has installed in the base (bakery.base.inventory): licenses are the names its
    copyright file states, as it states them; status: the dpkg file that lists it."""
    name: str
    version: str
    arch: str
    source: str
    source_version: str
    maintainer: str | None
    licenses: tuple[str, ...]
    status: str

    @classmethod
    def from_json(cls, obj, where: str) -> DebPackage:
        fields = dict(checked(obj, _DEB_PACKAGE_SHAPE, where))
        if not all(isinstance(x, str) for x in fields["licenses"]):
            raise InputError(f"build record: {where}.licenses must be a list of names")
        return cls(**{**fields, "licenses": tuple(fields["licenses"])})

    def to_json(self) -> dict:
        return {**self._asdict(), "licenses": list(self.licenses)}


_BASE_SHAPE = {"name": str, "pinned": str, "read_from": str, "platform": str,
               "index_digest": (str, OPTIONAL), "manifest": dict, "config": dict, "layers": list,
               "python_distributions": list, "os": (dict, OPTIONAL), "debian_packages": list}


class Base(NamedTuple):
    """The base as it was read: the pin, the platform image it resolved to, its layers and Pythons."""
    name: str
    pinned: Reference
    read_from: str
    platform: str
    index_digest: Digest | None
    manifest_digest: Digest
    manifest_media_type: str
    manifest_size: int
    config: Descriptor
    layers: tuple[Descriptor, ...]
    python_distributions: tuple[Distribution, ...]
    os: OperatingSystem | None
    debian_packages: tuple[DebPackage, ...]

    @classmethod
    def from_json(cls, obj) -> Base:
        checked(obj, _BASE_SHAPE, "base")
        manifest = checked(obj["manifest"], {"digest": str, "mediaType": str, "size": int}, "base.manifest")
        return cls(obj["name"], _pinned(obj["pinned"], "base.pinned"), obj["read_from"], obj["platform"],
                   _digest(obj["index_digest"], "base.index_digest") if obj["index_digest"] else None,
                   _digest(manifest["digest"], "base.manifest.digest"), manifest["mediaType"], manifest["size"],
                   Descriptor.from_json(obj["config"]),
                   tuple(Descriptor.from_json(d) for d in _listed(obj["layers"], "base.layers")),
                   tuple(Distribution.from_json(d, f"base.python_distributions[{i}]")
                         for i, d in enumerate(_listed(obj["python_distributions"], "base.python_distributions"))),
                   OperatingSystem.from_json(obj["os"]) if obj["os"] is not None else None,
                   tuple(DebPackage.from_json(d, f"base.debian_packages[{i}]")
                         for i, d in enumerate(_listed(obj["debian_packages"], "base.debian_packages"))))

    def to_json(self) -> dict:
        return {"name": self.name, "pinned": str(self.pinned), "read_from": self.read_from, "platform": self.platform,
                "index_digest": str(self.index_digest) if self.index_digest else None,
                "manifest": {"digest": str(self.manifest_digest), "mediaType": self.manifest_media_type,
                             "size": self.manifest_size},
                "config": self.config.to_json(), "layers": [d.to_json() for d in self.layers],
                "python_distributions": [d.to_json() for d in self.python_distributions],
                "os": self.os.to_json() if self.os else None,
                "debian_packages": [d.to_json() for d in self.debian_packages]}


_FILE_SHAPE = {"path": str, "sha256": str, "size": int, "mode": str, "layer": int}


class File(NamedTuple):
    """A file a layer of ours holds."""
    path: str
    sha256: str
    size: int
    mode: str  # octal, as oct() writes it
    layer: int

    @classmethod
    def from_json(cls, obj, where: str) -> File:
        return cls(**checked(obj, _FILE_SHAPE, where))

    def to_json(self) -> dict:
        return {"path": self.path, "sha256": self.sha256, "size": self.size, "mode": self.mode, "layer": self.layer}


_DELETED_SHAPE = {"path": str, "layer": int, "why": str}


class Deleted(NamedTuple):
    """A base file a layer of ours deletes (a whiteout), and why."""
    path: str
    layer: int
    why: str

    @classmethod
    def from_json(cls, obj, where: str) -> Deleted:
        return cls(**checked(obj, _DELETED_SHAPE, where))

    def to_json(self) -> dict:
        return {"path": self.path, "layer": self.layer, "why": self.why}


_OVERLAY_SHAPE = {"id": str, "target": str, "kind": str, "status": str, "baked": bool, "upstream": dict,
                  "reason": str, "platforms": list, "patch": (str, OPTIONAL), "patch_sha256": (str, OPTIONAL),
                  "proof": (dict, OPTIONAL), "base_sha256": (str, OPTIONAL), "result_sha256": (str, OPTIONAL),
                  "result_sha1": (str, OPTIONAL), "owner": (dict, OPTIONAL), "defect": (dict, OPTIONAL),
                  "audit": (dict, OPTIONAL)}


class Overlay(NamedTuple):
    """A registered overlay, baked or not, with its hashes; proof: its proof's summary (None: none ran)."""
    id: str
    target: str
    kind: str
    status: str
    baked: bool
    upstream: dict  # {repo, ref, path}: the upstream file it patches
    reason: str
    platforms: tuple[str, ...]
    patch: str | None
    patch_sha256: str | None
    proof: dict | None
    base_sha256: str | None
    result_sha256: str | None
    result_sha1: str | None  # SPDX names a file by its SHA1 too
    owner: dict | None  # {distribution, version, record_sha256}: whose RECORD lists the target, and its hash there
    defect: dict | None  # {id, aliases}: the upstream defect overlays.yaml names (None: it names none)
    audit: dict | None  # {holds, detail}: an audit record's probe run on this base (None: it has none)

    @classmethod
    def from_json(cls, obj, where: str) -> Overlay:
        fields = dict(checked(obj, _OVERLAY_SHAPE, where))
        return cls(**{**fields, "platforms": tuple(fields["platforms"])})

    def to_json(self) -> dict:
        return {"id": self.id, "target": self.target, "kind": self.kind, "status": self.status, "baked": self.baked,
                "upstream": self.upstream, "reason": self.reason, "platforms": list(self.platforms),
                "patch": self.patch, "patch_sha256": self.patch_sha256, "proof": self.proof,
                "base_sha256": self.base_sha256, "result_sha256": self.result_sha256, "result_sha1": self.result_sha1,
                "owner": self.owner, "defect": self.defect, "audit": self.audit}


_VERDICT_SHAPE = {"overlay": str, "side": str, "key": str, "verdict": str, "origin": str,
                            "artifact": (str, OPTIONAL)}


class Verdict(NamedTuple):
    """A proof verdict the build took (origin registry or cache) or proved (proven); artifact: where
    it is pushed, when it is."""
    overlay: str
    side: str
    key: str
    verdict: str
    origin: str
    artifact: Reference | None

    @classmethod
    def from_json(cls, obj, where: str) -> Verdict:
        fields = dict(checked(obj, _VERDICT_SHAPE, where))
        artifact = _pinned(fields["artifact"], f"{where}.artifact") if fields["artifact"] else None
        return cls(**{**fields, "artifact": artifact})

    def to_json(self) -> dict:
        return {"overlay": self.overlay, "side": self.side, "key": self.key, "verdict": self.verdict,
                "origin": self.origin, "artifact": str(self.artifact) if self.artifact else None}


_ARTIFACT_SHAPE = {"name": str, "path": str, "sha256": str, "arch": str, "toolchain": str, "sources": list,
                             "schema": list, "code_objects": list, "serves": list}


class Artifact(NamedTuple):
    """A compiled kernel library the image bakes, and what it was compiled from and with."""
    name: str
    path: str
    sha256: str
    arch: str
    toolchain: str  # "COMPILER; image IMAGE" (inputs.hip.Toolchain reads it)
    sources: tuple[Hashed, ...]
    schema: tuple[str, ...]
    code_objects: tuple[dict, ...]
    serves: tuple[dict, ...]  # {operator, function, overlay}

    @classmethod
    def from_json(cls, obj, where: str) -> Artifact:
        f = checked(obj, _ARTIFACT_SHAPE, where)
        return cls(f["name"], f["path"], f["sha256"], f["arch"], f["toolchain"],
                   tuple(Hashed.from_json(s, f"{where}.sources[{i}]") for i, s in enumerate(f["sources"])),
                   tuple(f["schema"]), tuple(f["code_objects"]), tuple(f["serves"]))

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "arch": self.arch,
                "toolchain": self.toolchain, "sources": [s.to_json() for s in self.sources],
                "schema": list(self.schema), "code_objects": list(self.code_objects), "serves": list(self.serves)}


_KERNELS_SHAPE = {"key": str, "origin": str, "artifact": (str, OPTIONAL)}


class Kernels(NamedTuple):
    """The kernel artifact: its recipe key, where the build got it, and its pushed reference."""
    key: str
    origin: str
    artifact: Reference | None

    @classmethod
    def from_json(cls, obj) -> Kernels:
        f = checked(obj, _KERNELS_SHAPE, "kernels")
        return cls(f["key"], f["origin"], _pinned(f["artifact"], "kernels.artifact") if f["artifact"] else None)

    def to_json(self) -> dict:
        return {"key": self.key, "origin": self.origin, "artifact": str(self.artifact) if self.artifact else None}


_TUNING_SHAPE = {"name": str, "path": str, "sha256": str, "rows": int, "env": (str, OPTIONAL), "source": str}


class Tuning(NamedTuple):
    """An AITER tuning table the image bakes, and the variable that points AITER at it."""
    name: str
    path: str
    sha256: str
    rows: int
    env: str | None  # the AITER variable that names it; None: it lies in AITER's model_configs/
    source: str

    @classmethod
    def from_json(cls, obj, where: str) -> Tuning:
        return cls(**checked(obj, _TUNING_SHAPE, where))

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "sha256": self.sha256, "rows": self.rows, "env": self.env,
                "source": self.source}


class Layer(NamedTuple):
    """A layer of ours: its descriptor, its uncompressed digest and what it holds."""
    descriptor: Descriptor
    diff_id: Digest
    comment: str

    @classmethod
    def from_json(cls, obj, where: str) -> Layer:
        if not isinstance(obj, dict) or not isinstance(obj.get("diff_id"), str) \
                or not isinstance(obj.get("comment"), str) \
                or not set(obj) - {"annotations"} == {"mediaType", "digest", "size", "diff_id", "comment"}:
            raise InputError(f"build record: {where} must be a descriptor with diff_id and comment: build again")
        rest = {k: v for k, v in obj.items() if k not in ("diff_id", "comment")}
        return cls(Descriptor.from_json(rest), _digest(obj["diff_id"], f"{where}.diff_id"), obj["comment"])

    def to_json(self) -> dict:
        return {**self.descriptor.to_json(), "diff_id": str(self.diff_id), "comment": self.comment}


class Manifest(NamedTuple):
    """The derived image's manifest: the digest everything else is about."""
    digest: Digest
    media_type: str
    size: int
    annotations: dict

    @classmethod
    def from_json(cls, obj) -> Manifest:
        f = checked(obj, {"digest": str, "mediaType": str, "size": int, "annotations": dict}, "manifest")
        return cls(_digest(f["digest"], "manifest.digest"), f["mediaType"], f["size"], f["annotations"])

    def to_json(self) -> dict:
        return {"digest": str(self.digest), "mediaType": self.media_type, "size": self.size,
                "annotations": self.annotations}


class ImageSpec(NamedTuple):
    """What image/image.yaml made of the image: its repository, environment and command."""
    repository: str
    env: dict
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]

    @classmethod
    def from_json(cls, obj) -> ImageSpec:
        f = checked(obj, {"repository": str, "env": dict, "entrypoint": list, "cmd": list}, "image")
        if not f["entrypoint"]:
            raise InputError("build record: image.entrypoint is empty: build again")
        return cls(f["repository"], f["env"], tuple(f["entrypoint"]), tuple(f["cmd"]))

    def to_json(self) -> dict:
        return {"repository": self.repository, "env": self.env, "entrypoint": list(self.entrypoint),
                "cmd": list(self.cmd)}


_LOCK_PIN_SHAPE = {"path": str, "base": str, "sha256": str}


class LockPin(NamedTuple):
    """The overlays.lock the build was held to, by hash, and the base it pins."""
    path: str
    base: str
    sha256: str

    @classmethod
    def from_json(cls, obj) -> LockPin:
        return cls(**checked(obj, _LOCK_PIN_SHAPE, "overlays_lock"))

    def to_json(self) -> dict:
        return {"path": self.path, "base": self.base, "sha256": self.sha256}


_BUILDER_SHAPE = {"id": str, "invocation": str}


class Builder(NamedTuple):
    """Who ran the build: a workflow run's identity, or `local`."""
    id: str
    invocation: str

    @classmethod
    def from_json(cls, obj) -> Builder:
        return cls(**checked(obj, _BUILDER_SHAPE, "builder"))

    def to_json(self) -> dict:
        return {"id": self.id, "invocation": self.invocation}


@dataclass(frozen=True)
class BuildRecord:
    """build-record.json. SBOM and provenance are views of it; `invoke attest` signs them."""
    source: Source
    inputs: tuple[Hashed, ...]
    base: Base
    files: tuple[File, ...]
    deleted: tuple[Deleted, ...]
    overlays: tuple[Overlay, ...]
    verdicts: tuple[Verdict, ...]
    artifacts: tuple[Artifact, ...]
    kernels: Kernels
    tuning: tuple[Tuning, ...]
    layers: tuple[Layer, ...]
    config: Descriptor
    manifest: Manifest
    image: ImageSpec
    outputs: tuple[dict, ...]  # {kind: registry, reference, tag} or {kind: oci-layout, path, digest}
    push: dict | None  # what the push moved (publish.PushStats), None when nothing was pushed
    overlays_lock: LockPin
    builder: Builder
    tools: dict  # {name: version} of what can change the output's bytes
    started: str
    finished: str
    layer_downloads: int

    SHAPE = {"schema": str, "source": dict, "inputs": list, "base": dict, "files": list, "deleted": list,
                       "overlays": list, "verdicts": list, "artifacts": list, "kernels": dict, "tuning": list,
                       "layers": list, "config": dict, "manifest": dict, "image": dict, "outputs": list,
                       "push": (dict, OPTIONAL), "overlays_lock": dict, "builder": dict, "tools": dict,
                       "started": str, "finished": str, "layer_downloads": int}

    @classmethod
    def from_json(cls, doc) -> BuildRecord:
        """Checked on load: a record of another shape is one input error naming the key, not a
        KeyError half-way through an SBOM."""
        checked(doc, cls.SHAPE, "the record")
        if doc["schema"] != SCHEMA:
            raise InputError(f"build record: schema {doc['schema']!r}, expected {SCHEMA}")

        def each(key, load):
            return tuple(load(v, f"{key}[{i}]") for i, v in enumerate(doc[key]))

        return cls(Source.from_json(doc["source"]), each("inputs", Hashed.from_json), Base.from_json(doc["base"]),
                   each("files", File.from_json), each("deleted", Deleted.from_json),
                   each("overlays", Overlay.from_json), each("verdicts", Verdict.from_json),
                   each("artifacts", Artifact.from_json), Kernels.from_json(doc["kernels"]),
                   each("tuning", Tuning.from_json), each("layers", Layer.from_json),
                   Descriptor.from_json(doc["config"]), Manifest.from_json(doc["manifest"]),
                   ImageSpec.from_json(doc["image"]), tuple(doc["outputs"]), doc["push"],
                   LockPin.from_json(doc["overlays_lock"]), Builder.from_json(doc["builder"]), doc["tools"],
                   doc["started"], doc["finished"], doc["layer_downloads"])

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "source": self.source.to_json(), "inputs": [i.to_json() for i in self.inputs],
                "base": self.base.to_json(), "files": [f.to_json() for f in self.files],
                "deleted": [d.to_json() for d in self.deleted], "overlays": [o.to_json() for o in self.overlays],
                "verdicts": [v.to_json() for v in self.verdicts],
                "artifacts": [a.to_json() for a in self.artifacts], "kernels": self.kernels.to_json(),
                "tuning": [t.to_json() for t in self.tuning], "layers": [layer.to_json() for layer in self.layers],
                "config": self.config.to_json(), "manifest": self.manifest.to_json(), "image": self.image.to_json(),
                "outputs": list(self.outputs), "push": self.push, "overlays_lock": self.overlays_lock.to_json(),
                "builder": self.builder.to_json(), "tools": self.tools, "started": self.started,
                "finished": self.finished, "layer_downloads": self.layer_downloads}


def dumps(record: BuildRecord) -> bytes:
    """The record file's bytes: what `invoke attest` reads back and signs views of."""
    return json.dumps(record.to_json(), indent=2, sort_keys=True).encode() + b"\n"


def read_back(record: BuildRecord) -> BuildRecord:
    """The record as `invoke attest` will read it from the file dumps writes: dumps' encoding (ASCII,
    so a surrogate pair is escaped, and JSON joins it on reading) without the indentation, which a
    reader skips and Python's encoder writes ten times slower."""
    return BuildRecord.from_json(json.loads(json.dumps(record.to_json(), sort_keys=True)))


def write(path: Path, record: BuildRecord) -> None:
    write_blob(path, dumps(record))


def read(path: Path) -> BuildRecord:
    from ..schema import load_json

    return BuildRecord.from_json(load_json(path, SCHEMA, "build record", "run `invoke build` first (or pass --record)"))
