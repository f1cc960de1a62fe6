"""The pinned base: read image/base.yaml, resolve the digest to one platform's image."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError, IntegrityError, RegistryError, malformed
from ..files import Fields, go_struct
from ..oci.manifest import Manifest
from ..oci.refs import DESCRIPTOR_FIELDS, MANIFEST_FIELDS, PLATFORM_FIELDS, Descriptor, Digest, Reference
from ..oci.registry import INDEX_TYPES, MANIFEST_TYPES, Registry

BASE_KEYS = {"image": str, "platform": str, "mirror": str}


@dataclass(frozen=True)
class BaseSpec:
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

    @property
    def config(self) -> dict:
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


def read_config(data: bytes, what: str) -> dict:
    """A base's image config, as Docker and containerd read it: in each of its structs a key twice,
    or one Go takes for a field but spelled otherwise, is refused (the build writes Entrypoint, Env,
    Cmd and Labels beside the base's keys: an "entrypoint" of the base's would be the one Go ran)."""
    with malformed(what):
        doc = go_struct(json.loads(data, object_pairs_hook=Fields.of), "the config", CONFIG_FIELDS)
        if not isinstance(doc, dict):
            raise TypeError("it is not an object")
        for key, fields in (("config", RUN_FIELDS), ("rootfs", ROOTFS_FIELDS)):
            if not isinstance(go_struct(doc.get(key) or {}, f"its {key}", fields), dict):
                raise TypeError(f"its {key} is not an object")
        history = doc.get("history") or []
        if not isinstance(history, list) or not all(isinstance(go_struct(h, "a history entry", HISTORY_FIELDS), dict)
                                                    for h in history):
            raise TypeError("its history is not a list of objects")
    return doc


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
            chosen = select_platform(go_struct(json.loads(body, object_pairs_hook=Fields.of), "the index",
                                               MANIFEST_FIELDS), platform, str(ref))
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
        diff_ids = read_config(config, f"config {config_desc.digest} of {ref}").get("rootfs", {}).get("diff_ids", [])
        len(diff_ids)
    if len(diff_ids) != len(layers):
        raise IntegrityError(f"{ref}: config lists {len(diff_ids)} diff_ids for {len(layers)} layers")
    return Image(ref.with_digest(digest), index_digest, body, media_type, config, config_desc, layers)


LAYER_LIMIT = 1000
