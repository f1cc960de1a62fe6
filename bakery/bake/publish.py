"""Outputs of a build: a registry push or an OCI image layout directory. Same inputs, same digest."""

from __future__ import annotations

import hashlib
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..base.spec import Image
from ..errors import EnvironmentProblem, InputError
from ..files import atomic_dir
from ..oci.layer import Layer
from ..oci.manifest import Manifest
from ..oci.mirror import copy_blob
from ..oci.refs import Descriptor, Digest, Reference
from ..oci.registry import OCI_MANIFEST, Registry
from ..oci.store import LayoutStore


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
        return list(Manifest.parse(self.manifest, "the derived manifest").layers[: len(self.base.layers)])


@dataclass
class PushStats:
    """What a push sent and what it found already there, for the record."""
    base_layers_present: int = 0
    base_layers_mounted: int = 0
    base_layers_copied: int = 0
    base_bytes_uploaded: int = 0
    new_bytes_uploaded: int = 0
    notes: list = field(default_factory=list)


PUSH_CONNECTIONS = 8  # blobs checked and sent at once: each is a round trip or a stream of its own


def push(derived: Derived, target: Reference, registries: dict) -> tuple[Reference, PushStats]:
    """Upload what the target lacks, every blob concurrently, then the manifest: by digest first,
    the tag last, and neither unless every blob is there."""
    reg = registries.get(target.registry) or registries.setdefault(target.registry, Registry(target.registry))
    repo, stats = target.repository, PushStats()
    if reg.manifest_is(repo, target.tag or str(derived.digest), derived.digest):
        # pushed before: the registry holds this manifest (so every blob it names) under the name
        stats.base_layers_present = len(derived.base_layers)
        return target.with_digest(derived.digest), stats
    src_reg, src_repo = derived.base_registry, derived.base.ref.repository

    def base_layer(desc: Descriptor) -> str:
        return copy_blob(src_reg, src_repo, reg, repo, desc)

    def new_blob(desc: Descriptor, chunks) -> int:
        if reg.blob_exists(repo, desc.digest):
            return 0
        reg.upload_blob(repo, desc, chunks)
        return desc.size

    ours = [(layer.descriptor, lambda p=layer.path: iter([p.read_bytes()])) for layer in derived.layers] + \
        [(derived.config_descriptor, lambda: iter([derived.config]))]
    with ThreadPoolExecutor(PUSH_CONNECTIONS) as pool:
        based = [pool.submit(base_layer, d) for d in derived.base_layers]
        sent = [pool.submit(new_blob, d, chunks) for d, chunks in ours]
        for desc, done in zip(derived.base_layers, based, strict=True):
            how = done.result()  # the first failure propagates; no manifest is written then
            setattr(stats, f"base_layers_{how}", getattr(stats, f"base_layers_{how}") + 1)
            stats.base_bytes_uploaded += desc.size if how == "copied" else 0
        stats.new_bytes_uploaded = sum(done.result() for done in sent)
    digest = reg.put_manifest(repo, str(derived.digest), derived.manifest, OCI_MANIFEST)
    if target.tag:
        reg.put_manifest(repo, target.tag, derived.manifest, OCI_MANIFEST)
    return target.with_digest(digest), stats


def write_layout(derived: Derived, dest: Path, tag: str, blob_cache: Path) -> Path:
    """Write an OCI image layout holding every blob (air-gapped hand-off), atomically.

    Base layers are downloaded once into blob_cache (verified) and linked from there.
    """
    dest = dest.resolve()
    if dest.exists() and any(dest.iterdir()):
        if not (dest / "oci-layout").exists():
            raise InputError(f"--layout {dest} exists and is not an OCI layout: choose an empty or new directory")
    with ExitStack() as stack:
        try:
            tmp = stack.enter_context(atomic_dir(dest))  # becomes dest only when everything is in it
        except OSError as e:
            raise EnvironmentProblem(f"cannot create {dest}: {e.strerror}") from None
        layout = LayoutStore(tmp, create=True)
        for desc in derived.base_layers:
            cached = blob_cache / "sha256" / desc.digest.hex
            if not _cached_blob_ok(cached, desc):
                derived.base_registry.download_blob(derived.base.ref.repository, desc, cached)
            layout.put_file(desc, cached)
        for layer in derived.layers:
            layout.put_file(layer.descriptor, layer.path)
        layout.put_blob(derived.config, derived.config_descriptor.media_type)
        layout.put_manifest(tag, derived.manifest)
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
