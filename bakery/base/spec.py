"""The pinned base: read image/base.yaml, resolve the digest to one platform's image."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError, IntegrityError, RegistryError, malformed
from ..files import go_document, go_fold, go_struct
from ..oci.manifest import Manifest
from ..oci.refs import DESCRIPTOR_FIELDS, MANIFEST_FIELDS, PLATFORM_FIELDS, Descriptor, Digest, Reference
from ..oci.registry import INDEX_TYPES, MANIFEST_TYPES, Registry

BASE_KEYS = {"image": str, "platform": str, "mirror": str}


@dataclass(frozen=True)
class BaseSpec:
    """image/base.yaml: the pinned base, its platform and where it is mirrored."""
    image: Reference  # the upstream name, pinned by digest
    platform: str
    mirror: Reference | None  # where to read the same digest from, if mirrored

    @property
    def source(self) -> Reference:
        """The reference builds read from: the mirror when there is one."""
        if self.mirror:
            return Reference(self.mirror.registry, self.mirror.repository, None, self.image.digest)
        return self.image


def load_spec(path: Path, override: str | None = None, override_mirror: str | None = None) -> BaseSpec:
    """Read base.yaml; --base REF@DIGEST replaces the image and the mirror (none, or override_mirror)."""
    data = schema.load_yaml(path, BASE_KEYS, required={"image", "platform"})
    if data["platform"].count("/") != 1:
        raise InputError(f"{path}: platform must look like os/arch, e.g. linux/amd64")
    where: str | Path
    if override:
        image, mirror_text, where = Reference.parse_pinned(override, "--base"), override_mirror, "the mirror"
    else:
        image, mirror_text, where = Reference.parse_pinned(data["image"], f"{path}: image"), data.get("mirror"), path
    mirror = Reference.parse(mirror_text) if mirror_text else None
    if mirror and (mirror.tag or mirror.digest):
        raise InputError(f"{where}: mirror names a repository only (REGISTRY/REPO), got {mirror_text!r}")
    return BaseSpec(image, data["platform"], mirror)


@dataclass(frozen=True)
class Image:
    """A resolved image: the exact manifest and config bytes, verified, plus their parsed forms."""

    ref: Reference  # repository it was read from, with the manifest digest
    index_digest: Digest | None  # when the pin named an index
    manifest_bytes: bytes
    manifest_media_type: str
    config_bytes: bytes
    config_descriptor: Descriptor
    layers: tuple[Descriptor, ...]

    @property
    def manifest_digest(self) -> Digest:
        return Digest.of(self.manifest_bytes)

    @functools.cached_property
    def config(self) -> dict:
        """The config as read_config reads it, read once: its readers only read it (derive_config
        writes into a copy)."""
        return read_config(self.config_bytes, f"the config of {self.ref}")


# the OCI image config's structs, as Docker and containerd decode them (config.config: what a container runs)
CONFIG_FIELDS = frozenset({"created", "author", "architecture", "os", "os.version", "os.features", "variant", "config",
                           "rootfs", "history"})
RUN_FIELDS = frozenset({"User", "ExposedPorts", "Env", "Entrypoint", "Cmd", "Volumes", "WorkingDir", "Labels",
                        "StopSignal", "ArgsEscaped", "Memory", "MemorySwap", "CpuShares", "Healthcheck", "Shell",
                        "OnBuild", "Hostname", "Domainname", "AttachStdin", "AttachStdout", "AttachStderr", "Tty",
                        "OpenStdin", "StdinOnce", "Image", "NetworkDisabled", "MacAddress", "StopTimeout"})
ROOTFS_FIELDS = frozenset({"type", "diff_ids"})
HISTORY_FIELDS = frozenset({"created", "created_by", "author", "comment", "empty_layer"})


MAPS = frozenset({"labels", "exposedports", "volumes"})  # Go maps inside the config: their keys are exact
DEPTH = 64  # levels a config may nest: Docker's are a handful deep


def read_config(data: bytes, what: str) -> dict:
    """A base's image config, as Docker and containerd read it, or refused: in each of its structs a
    key twice, or one Go takes for a field but spelled otherwise (the build writes Entrypoint, Env,
    Cmd and Labels beside the base's keys: an "entrypoint" of the base's would be the one Go ran;
    a Healthcheck's "test" beside its "Test" would change places once written in canonical order);
    what the build reads of it of the wrong type; NaN or Infinity; nesting past DEPTH."""
    with malformed(what):
        doc = go_document(data, "the config", CONFIG_FIELDS)
        if not isinstance(doc, dict):
            raise TypeError("it is not an object")
        _structs_once(doc, "the config")
        run = _object_or_null(doc, "config", RUN_FIELDS)
        rootfs = _object_or_null(doc, "rootfs", ROOTFS_FIELDS)
        _strings_or_null(run.get("Env"), "its Env")  # the build rewrites Entrypoint and Cmd (a string to Docker too)
        _strings_or_null(rootfs.get("diff_ids"), "its diff_ids")
        _strings_or_null(run.get("OnBuild"), "its OnBuild")
        labels = run.get("Labels")
        if labels is not None and not (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values())):
            raise TypeError("its Labels is not an object of strings")
        history = doc.get("history")
        if history is not None and not (isinstance(history, list) and all(
                isinstance(go_struct(h, "a history entry", HISTORY_FIELDS), dict) for h in history)):
            raise TypeError("its history is not a list of objects")
    return doc


def without_triggers(image: Image) -> Image:
    """The base, unless its config holds ONBUILD triggers: a Docker build FROM it runs them and keeps
    none in what it makes; bakery runs no build steps, so passed on they would run in whoever
    builds FROM our image (and ours would lack what they do). Asked of a base to derive from, not
    of every image resolved (a nightly the tracker keeps, a toolchain)."""
    if (image.config.get("config") or {}).get("OnBuild"):
        raise IntegrityError(f"the base {image.ref} has ONBUILD triggers, which a build FROM it runs; bakery runs no "
                             f"build steps, so the base is refused")
    return image


def _structs_once(value, where: str, depth: int = 0, a_map: bool = False) -> None:
    """Every object of the config but its maps holds each key once, however cased (Go's fields)."""
    if depth > DEPTH:
        raise ValueError(f"{where} nests past {DEPTH} levels")
    if isinstance(value, dict):
        if not a_map:
            go_struct(value, where)
        for key, inner in value.items():
            _structs_once(inner, f"{where}.{key}"[:200], depth + 1, not a_map and go_fold(key) in MAPS)
    elif isinstance(value, list):
        for inner in value:
            _structs_once(inner, where, depth + 1)


def _object_or_null(doc: dict, key: str, fields: frozenset[str]) -> dict:
    found = go_struct(doc.get(key), f"its {key}", fields)
    if found is not None and not isinstance(found, dict):
        raise TypeError(f"its {key} is not an object")
    return found or {}


def _strings_or_null(value, what: str) -> None:
    if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise TypeError(f"{what} is not a list of strings")


def _descriptor(obj) -> Descriptor:
    """A descriptor from someone else's document: malformed is a ValueError, for malformed()."""
    try:
        return Descriptor.from_json(obj)
    except InputError as e:
        raise ValueError(str(e)) from None


def select_platform(index: dict, platform: str, where: str) -> Descriptor:
    """Pick the manifest for os/arch from an index; refuse if it is not there."""
    os_name, arch = platform.split("/")
    offered = []
    for entry in index.get("manifests", []):
        p = go_struct(go_struct(entry, "an entry", DESCRIPTOR_FIELDS).get("platform") or {}, "an entry's platform",
                      PLATFORM_FIELDS)
        offered.append(f"{p.get('os')}/{p.get('architecture')}")
        if p.get("os") == os_name and p.get("architecture") == arch:
            return _descriptor(entry)
    raise InputError(f"{where} has no {platform} image (it offers {', '.join(offered) or 'none'})")


def resolve(registry: Registry, ref: Reference, platform: str) -> Image:
    """Fetch manifest (through an index if need be) and config, each checked by digest (a copy
    this machine read and verified before is verified again, not fetched again)."""
    body, media_type, digest = registry.get_manifest(ref, cached=True)
    index_digest = None
    if media_type in INDEX_TYPES:
        index_digest = digest
        with malformed(f"index {ref}"):
            chosen = select_platform(go_document(body, "the index", MANIFEST_FIELDS), platform, str(ref))
        ref = ref.with_digest(chosen.digest)
        body, media_type, digest = registry.get_manifest(ref, cached=True)
    if media_type not in MANIFEST_TYPES:
        raise RegistryError(f"{ref}: unsupported manifest type {media_type!r}")
    manifest = Manifest.parse(body, f"manifest {ref}")
    config_desc, layers = manifest.config, manifest.layers
    if len(layers) > LAYER_LIMIT:  # each would be streamed and indexed
        raise IntegrityError(f"{ref}: the manifest lists {len(layers)} layers, past the {LAYER_LIMIT} a base may have "
                             f"(an image builder stops near 127)")
    config = registry.fetch_document(ref.repository, config_desc, f"config of {ref}", cached=True)
    with malformed(f"config {config_desc.digest} of {ref}"):
        diff_ids = (read_config(config, f"config {config_desc.digest} of {ref}").get("rootfs") or {}).get("diff_ids") or []
        len(diff_ids)
    if len(diff_ids) != len(layers):
        raise IntegrityError(f"{ref}: config lists {len(diff_ids)} diff_ids for {len(layers)} layers")
    return Image(ref.with_digest(digest), index_digest, body, media_type, config, config_desc, layers)


LAYER_LIMIT = 1000
