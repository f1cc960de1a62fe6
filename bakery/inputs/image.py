"""The derived image: image/image.yaml plus new layers on top of the base config. Pure functions."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from .. import schema
from ..base.spec import Image
from ..errors import InputError
from ..files import canonical_json
from ..oci.layer import FileEntry, Layer
from ..oci.refs import Descriptor, Reference
from ..oci.registry import OCI_MANIFEST

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST_PATH = "/etc/bakery/manifest.json"
IMAGE_KEYS = {"repository": str, "source": str, "env": dict, "entrypoint": list, "cmd": list,
              "labels": dict, "files": list}
FILE_KEYS = {"src": str, "dest": str, "executable": bool}
# The same blob bytes, named the OCI way, so the derived manifest is one consistent OCI manifest.
OCI_LAYER_TYPES = {
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.docker.image.rootfs.diff.tar": "application/vnd.oci.image.layer.v1.tar",
}


@dataclass(frozen=True)
class ImageSpec:
    """image/image.yaml: the repository, the entrypoint and command, the env and our files in the image."""
    repository: Reference
    source: str
    env: tuple[tuple[str, str], ...]
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    labels: tuple[tuple[str, str], ...]
    files: tuple[FileEntry, ...]


def load_spec(path: Path) -> ImageSpec:
    data = schema.load_yaml(path, IMAGE_KEYS, required={"repository", "source", "entrypoint"})
    repo = Reference.parse(data["repository"])
    if repo.tag or repo.digest:
        raise InputError(f"{path}: repository names a repository only, got {data['repository']!r}")
    files = []
    for i, entry in enumerate(data.get("files") or []):
        schema.check_keys(entry, FILE_KEYS, f"{path}: files[{i}]", required={"src", "dest"})
        src = schema.file_inside(path.parent, entry["src"], f"{path}: files[{i}].src")
        files.append(FileEntry(entry["dest"], src.read_bytes(), bool(entry.get("executable"))))
    for key in ("env", "labels"):
        for k, v in (data.get(key) or {}).items():
            if not isinstance(v, str):
                raise InputError(f"{path}: {key}.{k} must be a string (quote it), got {v!r}")
    return ImageSpec(repo, data["source"], tuple((data.get("env") or {}).items()),
                     tuple(map(str, data["entrypoint"])), tuple(map(str, data.get("cmd") or [])),
                     tuple((data.get("labels") or {}).items()), tuple(files))


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_image_manifest(files: tuple[FileEntry, ...]) -> FileEntry:
    """/etc/bakery/manifest.json: every baked file and its sha256, checked at container start."""
    body = {"files": {f.path: f.sha256 for f in sorted(files, key=lambda f: f.path)}}
    return FileEntry(MANIFEST_PATH, json.dumps(body, indent=1, sort_keys=True).encode() + b"\n")


def image_annotations(base_name: str, base: Image, spec: ImageSpec, revision: str, epoch: int) -> dict:
    return {
        "org.opencontainers.image.base.name": base_name,
        "org.opencontainers.image.base.digest": str(base.manifest_digest),
        "org.opencontainers.image.source": spec.source,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": rfc3339(epoch),
    }


def derive_config(base: Image, layers: list[Layer], spec: ImageSpec, epoch: int, notes: dict) -> bytes:
    """The base config with our env, entrypoint, cmd, labels, layers and history appended."""
    cfg = copy.deepcopy(base.config)  # read_config's: each field read here typed, as Go would read it
    created = rfc3339(epoch)
    cfg["created"] = created
    run = cfg["config"] = cfg.get("config") or {}  # null is no config to Go
    env = [e for e in run.get("Env") or [] if e.partition("=")[0] not in dict(spec.env)]
    run["Env"] = env + [f"{k}={v}" for k, v in spec.env]
    run["Entrypoint"] = list(spec.entrypoint)
    run["Cmd"] = list(spec.cmd) or None
    run["Labels"] = {**(run.get("Labels") or {}), **dict(spec.labels), **notes}
    rootfs = cfg["rootfs"] = cfg.get("rootfs") or {"type": "layers"}
    rootfs["diff_ids"] = list(rootfs.get("diff_ids") or []) + [str(layer.diff_id) for layer in layers]
    cfg["history"] = list(cfg.get("history") or []) + [
        {"created": created, "created_by": f"bakery: {layer.comment}", "comment": "bakery"} for layer in layers]
    return canonical_json(cfg, f"the config of base {base.ref}")


def derive_manifest(base: Image, config: Descriptor, layers: list[Layer], notes: dict) -> bytes:
    """An OCI manifest: base layers referenced as they are, ours after them."""
    base_layers = [Descriptor(OCI_LAYER_TYPES.get(d.media_type, d.media_type), d.digest, d.size, d.annotations)
                   for d in base.layers]
    return canonical_json({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.to_json(),
        "layers": [d.to_json() for d in base_layers] + [layer.descriptor.to_json() for layer in layers],
        "annotations": notes,
    })
