"""`invoke build`: inputs -> base -> files -> layers -> config + manifest -> outputs -> record."""

from __future__ import annotations

import email.parser
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import base as base_mod
from . import image as image_mod
from . import record
from .errors import InputError
from .extract import BaseFilesystem, LayerCache
from .layer import FileEntry, write_blob, write_layer
from .publish import Derived, push, write_layout
from .refs import Descriptor, Reference
from .registry import Registry

DIST_INFO = "usr/local/lib/python3*/dist-packages/*.dist-info/METADATA"


@dataclass(frozen=True)
class Options:
    project: Path
    base: str | None = None  # REF@DIGEST overriding image/base.yaml
    push: str | None = None  # REGISTRY/REPO[:TAG]
    layout: Path | None = None
    out: Path | None = None  # where blobs and the record go; default PROJECT/out

    @property
    def out_dir(self) -> Path:
        return self.out or self.project / "out"


def _git(project: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise InputError(f"{project} is not a git checkout with a commit ({result.stderr.strip()}): "
                         f"bakery records the source revision; commit first")
    return result.stdout.strip()


def source_date_epoch(project: Path) -> int:
    """SOURCE_DATE_EPOCH if set, else the commit time of HEAD: read once, here."""
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return int(_git(project, "log", "-1", "--format=%ct"))
    if not value.isdigit():
        raise InputError(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds since 1970")
    return int(value)


def input_files(project: Path) -> list[Path]:
    """Every checked-in file that can change the image."""
    return sorted(p for p in (project / "image").rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def python_distributions(fs: BaseFilesystem) -> list[dict]:
    """Name and version of each Python distribution installed in the base, from its dist-info."""
    found = fs.read(fs.glob(DIST_INFO))
    dists = []
    for path, f in sorted(found.items()):
        if f and f.data:
            meta = email.parser.BytesParser().parsebytes(f.data, headersonly=True)
            dists.append({"name": meta.get("Name"), "version": meta.get("Version"), "metadata": "/" + path,
                          "sha256": f.sha256})
    return dists


def build(opts: Options, log=print) -> tuple[Reference, dict]:
    project = opts.project.resolve()
    started = datetime.now(timezone.utc)
    epoch = source_date_epoch(project)
    revision = _git(project, "rev-parse", "HEAD")
    dirty = bool(_git(project, "status", "--porcelain", "--untracked-files=no"))
    spec = image_mod.load_spec(project / "image" / "image.yaml")
    base_spec = base_mod.load_spec(project / "image" / "base.yaml", opts.base)

    source = base_spec.source
    registries = {source.registry: Registry(source.registry)}
    log(f"resolving base {source}")
    base = base_mod.resolve(registries[source.registry], source, base_spec.platform)
    fs = BaseFilesystem(registries[source.registry], base, LayerCache(), keep=(DIST_INFO,))
    dists = python_distributions(fs)

    files = spec.files
    manifest_entry = image_mod.in_image_manifest(files)
    blobs = opts.out_dir / "blobs"
    layers = [write_layer(files + (manifest_entry,), epoch, blobs, "entrypoint, self-check and in-image manifest")]

    notes = image_mod.annotations(base_spec.image.name, base, spec, revision, epoch)
    config = image_mod.derive_config(base, layers, spec, epoch, notes)
    config_desc = Descriptor.of(image_mod.OCI_CONFIG, config)
    manifest = image_mod.derive_manifest(base, config_desc, layers, notes)
    derived = Derived(base, registries[source.registry], manifest, config, config_desc, tuple(layers))
    write_blob(blobs / "sha256" / config_desc.digest.hex, config)
    write_blob(blobs / "sha256" / derived.digest.hex, manifest)

    outputs, stats = [], None
    name = spec.repository.with_digest(derived.digest)
    if opts.push:
        target = Reference.parse(opts.push)
        if target.digest:
            raise InputError(f"--push {opts.push!r}: give REGISTRY/REPO[:TAG]; the digest is computed")
        log(f"pushing to {target}")
        name, stats = push(derived, target, registries)
        outputs.append({"kind": "registry", "reference": str(name), "tag": target.tag})
    if opts.layout:
        tag = Reference.parse(opts.push).tag if opts.push else None
        path = write_layout(derived, Path(opts.layout), tag or "latest", fs.cache.root / "blobs")
        outputs.append({"kind": "oci-layout", "path": str(path), "digest": str(derived.digest)})

    rec = {
        "schema": record.SCHEMA,
        "source": {"repository": spec.source, "revision": revision, "dirty": dirty, "source_date_epoch": epoch},
        "inputs": [{"path": str(p.relative_to(project)), "sha256": Descriptor.of("", p.read_bytes()).digest.hex}
                   for p in input_files(project)],
        "base": {
            "name": base_spec.image.name,
            "pinned": str(base_spec.image),
            "read_from": str(base.ref),
            "platform": base_spec.platform,
            "index_digest": str(base.index_digest) if base.index_digest else None,
            "manifest": {"digest": str(base.manifest_digest), "mediaType": base.manifest_media_type,
                         "size": len(base.manifest_bytes)},
            "config": base.config_descriptor.to_json(),
            "layers": [d.to_json() for d in base.layers],
            "python_distributions": dists,
        },
        "files": [{"path": f.path, "sha256": f.sha256, "size": len(f.data), "mode": oct(f.mode), "layer": i}
                  for i, l in enumerate(layers) for f in l.files],
        "layers": [{**l.descriptor.to_json(), "diff_id": str(l.diff_id), "comment": l.comment} for l in layers],
        "config": config_desc.to_json(),
        "manifest": {"digest": str(derived.digest), "mediaType": image_mod.OCI_MANIFEST, "size": len(manifest),
                     "annotations": notes},
        "image": {"repository": spec.repository.name, "env": dict(spec.env), "entrypoint": list(spec.entrypoint),
                  "cmd": list(spec.cmd)},
        "outputs": outputs,
        "push": vars(stats) if stats else None,
        "tools": record.tools(),
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "layer_downloads": fs.cache.downloads,
    }
    record.write(opts.out_dir / "build-record.json", rec)
    return name, rec
