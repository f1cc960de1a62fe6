"""Outputs of a build: a registry push or an OCI image layout directory. Same inputs, same digest."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .base import Image
from .errors import EnvironmentProblem, InputError
from .layer import Layer, write_blob
from .refs import Descriptor, Digest, Reference
from .registry import OCI_INDEX, OCI_MANIFEST, Registry


@dataclass(frozen=True)
class Derived:
    """A built image, still local: its manifest and config bytes and the layers we wrote."""

    base: Image
    base_registry: Registry
    manifest: bytes
    config: bytes
    config_descriptor: Descriptor
    layers: tuple[Layer, ...]

    @property
    def digest(self) -> Digest:
        return Digest.of(self.manifest)

    @property
    def base_layers(self) -> list[Descriptor]:
        return [Descriptor.from_json(d) for d in json.loads(self.manifest)["layers"][: len(self.base.layers)]]


@dataclass
class PushStats:
    base_layers_present: int = 0
    base_layers_mounted: int = 0
    base_layers_copied: int = 0
    base_bytes_uploaded: int = 0
    new_bytes_uploaded: int = 0
    notes: list = field(default_factory=list)


def push(derived: Derived, target: Reference, registries: dict) -> tuple[Reference, PushStats]:
    """Upload what the target lacks, then the manifest: by digest first, the tag last."""
    reg = registries.get(target.registry) or registries.setdefault(target.registry, Registry(target.registry))
    repo, stats = target.repository, PushStats()
    src_reg, src_repo = derived.base_registry, derived.base.ref.repository
    for desc in derived.base_layers:
        if reg.blob_exists(repo, desc.digest):
            stats.base_layers_present += 1
        elif reg is src_reg and reg.mount_blob(repo, desc.digest, src_repo):
            stats.base_layers_mounted += 1
        else:  # another registry (or a refused mount): copy once, streaming
            reg.upload_blob(repo, desc, lambda d=desc: src_reg.stream_blob(src_repo, d))
            stats.base_layers_copied += 1
            stats.base_bytes_uploaded += desc.size
    for layer in derived.layers:
        if not reg.blob_exists(repo, layer.descriptor.digest):
            reg.upload_blob(repo, layer.descriptor, lambda p=layer.path: iter([p.read_bytes()]))
            stats.new_bytes_uploaded += layer.descriptor.size
    if not reg.blob_exists(repo, derived.config_descriptor.digest):
        reg.upload_blob(repo, derived.config_descriptor, lambda: iter([derived.config]))
        stats.new_bytes_uploaded += len(derived.config)
    digest = reg.put_manifest(repo, str(derived.digest), derived.manifest, OCI_MANIFEST)
    if target.tag:
        reg.put_manifest(repo, target.tag, derived.manifest, OCI_MANIFEST)
    return target.with_digest(digest), stats


def write_layout(derived: Derived, dest: Path, tag: str | None, blob_cache: Path) -> Path:
    """Write an OCI image layout holding every blob (air-gapped hand-off), atomically.

    Base layers are downloaded once into blob_cache (verified) and linked from there.
    """
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        if not (dest / "oci-layout").exists():
            raise InputError(f"--layout {dest} exists and is not an OCI layout: choose an empty or new directory")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))
    except OSError as e:
        raise EnvironmentProblem(f"cannot create {dest}: {e.strerror}") from None
    try:
        blobs = tmp / "blobs" / "sha256"
        blobs.mkdir(parents=True)
        for desc in derived.base_layers:
            cached = blob_cache / "sha256" / desc.digest.hex
            if not _cached_blob_ok(cached, desc):
                derived.base_registry.download_blob(derived.base.ref.repository, desc, cached)
            _link_or_copy(cached, blobs / desc.digest.hex)
        for layer in derived.layers:
            _link_or_copy(layer.path, blobs / layer.descriptor.digest.hex)
        write_blob(blobs / derived.config_descriptor.digest.hex, derived.config)
        write_blob(blobs / derived.digest.hex, derived.manifest)
        entry = Descriptor(OCI_MANIFEST, derived.digest, len(derived.manifest),
                           {"org.opencontainers.image.ref.name": tag} if tag else {})
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [entry.to_json()]}
        write_blob(tmp / "index.json", json.dumps(index, sort_keys=True, indent=1).encode())
        write_blob(tmp / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _cached_blob_ok(path: Path, desc: Descriptor) -> bool:
    """Is a cached base blob there and still the bytes its name promises? A poisoned one is
    deleted with one warning (and downloaded again by the caller)."""
    if not path.exists():
        return False
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    if h.hexdigest() == desc.digest.hex and size == desc.size:
        return True
    print(f"warning: dropped a corrupt cached blob {desc.digest.hex[:12]}; downloading it again", file=sys.stderr)
    path.unlink()
    return False


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        try:
            shutil.copyfile(src, dst)
        except OSError as e:
            hint = "the disk is full" if e.errno == 28 else e.strerror
            raise EnvironmentProblem(f"writing {dst.name[:12]} to {dst.parent}: {hint}; nothing was kept") from None
