"""The compile cache that travels: a compile's outputs as an OCI artifact (REPO:kernels-<key>) in the
build's target registry, pushed unsigned by the build and used by a later build only once a release
key has signed it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import IntegrityError
from ..files import atomic_dir
from ..oci.refs import Reference
from .hip_outputs import read_accepted, same_outputs

ARTIFACT_TYPE = "application/vnd.bakery.hip-kernels.v1"
ARTIFACT_CONFIG = "application/vnd.bakery.hip-kernels.config.v1+json"
TITLE = "org.opencontainers.image.title"


def artifact_tag(key: str) -> str:
    return f"kernels-{key}"


def artifact_parts(key: str, out: Path, accepted: dict[str, str] | None = None) -> tuple[list, bytes]:
    """A compile's outputs as an OCI artifact: ([(descriptor, bytes)] of its blobs, config last,
    and its manifest); deterministic bytes, so the same compile gives the same artifact digest.
    `accepted`: the outputs' sha256s the caller chose, refused if `out` holds others by now."""
    from ..oci.refs import Descriptor
    from ..oci.registry import OCI_MANIFEST

    recorded = json.loads((out / "done.json").read_text())
    if accepted is not None and recorded["sha256"] != accepted:
        raise IntegrityError(f"the compile cache entry {out} changed while this run read it (its record names other "
                             f"outputs than it chose); another run replaced it: run again")
    blobs = []
    for name in sorted(recorded["sha256"]):
        data = (out / name).read_bytes() if accepted is None else read_accepted(out, name, accepted)
        blobs.append((Descriptor.of("application/octet-stream", data, {TITLE: name}), data))
    config = json.dumps({"key": key, "toolchain": recorded["toolchain_image"], "sha256": recorded["sha256"]},
                        sort_keys=True).encode()
    config_desc = Descriptor.of(ARTIFACT_CONFIG, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
                           "config": config_desc.to_json(), "layers": [d.to_json() for d, _ in blobs]},
                          sort_keys=True).encode()
    return blobs + [(config_desc, config)], manifest


def artifact_manifest(key: str, out: Path, accepted: dict[str, str] | None = None) -> bytes:
    return artifact_parts(key, out, accepted)[1]


def push_artifact(registry, repo: str, key: str, out: Path, accepted: dict[str, str] | None = None) -> Reference:
    """Push a compile's outputs (one blob per file, a config naming key and sha256s) under
    REPO:kernels-<key>."""
    from ..oci.refs import Digest
    from ..oci.registry import OCI_MANIFEST

    blobs, manifest = artifact_parts(key, out, accepted)
    if registry.manifest_is(repo, artifact_tag(key), Digest.of(manifest)):  # pushed before: one HEAD
        return Reference(registry.name, repo, None, Digest.of(manifest))
    for desc, data in blobs:
        registry.upload_blob(repo, desc, lambda d=data: iter([d]))
    registry.put_manifest(repo, artifact_tag(key), manifest, OCI_MANIFEST)
    return Reference(registry.name, repo, None, Digest.of(manifest))


def fetch_artifact(registry, repo: str, key: str, dest: Path, trust,
                   expected: set[str]) -> tuple[Reference, dict[str, str]] | None:
    """The outputs of this exact compile from REPO:kernels-<key>: its manifest digest must carry a
    release-key signature (`trust(ref)` raises otherwise) before any of its bytes is used; then every
    blob is checked by digest and the config's key and sha256s against what arrives. The artifact
    pinned, and the outputs' sha256s it vouches for; None if the registry has no artifact for this key."""
    from ..errors import NotFound, malformed
    from ..oci.manifest import Manifest

    ref = Reference(registry.name, repo, artifact_tag(key))
    try:
        body, _, digest = registry.get_manifest(ref)
    except NotFound:
        return None
    try:
        trust(ref.with_digest(digest))
    except IntegrityError as e:
        raise IntegrityError(f"{e}; refused: a kernel artifact is used only when a release key signed it. "
                             f"Compile here instead with `invoke build --recompile` (the release workflow's sign "
                             f"job signs the artifact the build record names)") from None
    manifest = Manifest.parse(body, f"kernel artifact {ref}")
    with malformed(f"kernel artifact {ref}"):
        config = json.loads(registry.fetch_document(repo, manifest.config, f"config of kernel artifact {ref}"))
        layers = manifest.layers
        if config["key"] != key:
            raise IntegrityError(f"kernel artifact {ref} is for recipe {config['key']}, not {key}")
        names = {layer.annotations[TITLE] for layer in layers}
        if names != set(config["sha256"]) or names != expected:
            raise IntegrityError(f"kernel artifact {ref}: its files {sorted(map(repr, names))[:8]} are not the ones "
                                 f"this recipe makes ({', '.join(sorted(expected))}) or its config names")
    with atomic_dir(dest, keep=same_outputs(config["sha256"])) as tmp:
        for layer in layers:
            data = registry.fetch_blob(repo, layer)  # checked against the layer's digest
            name = layer.annotations[TITLE]
            if hashlib.sha256(data).hexdigest() != config["sha256"][name]:
                raise IntegrityError(f"kernel artifact {ref}: {name} does not match the sha256 its config records")
            (tmp / name).write_bytes(data)
        (tmp / "done.json").write_text(json.dumps({"toolchain_image": config["toolchain"], "sha256": config["sha256"],
                                                   "artifact": str(ref.with_digest(digest))}))
    return ref.with_digest(digest), {str(k): str(v) for k, v in config["sha256"].items()}
