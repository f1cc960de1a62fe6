"""The compile cache that travels: a compile's outputs as an OCI artifact (REPO:kernels-<key>) in the
build's target registry, pushed unsigned by the build and used by a later build only once a release
key has signed it (oci/artifact.py: how it travels; here: what it holds)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import IntegrityError
from ..files import atomic_dir
from ..oci import artifact
from ..oci.refs import Reference
from .hip_outputs import read_accepted, same_outputs

ARTIFACT_TYPE = "application/vnd.bakery.hip-kernels.v1"
ARTIFACT_CONFIG = "application/vnd.bakery.hip-kernels.config.v1+json"
TITLE = "org.opencontainers.image.title"


def artifact_tag(key: str) -> str:
    return f"kernels-{key}"


def kernels(key: str, out: Path, accepted: dict[str, str] | None = None) -> artifact.Artifact:
    """A compile's outputs as an OCI artifact: one blob per file, a config naming key, toolchain and
    sha256s; deterministic bytes, so the same compile gives the same artifact digest. `accepted`:
    the outputs' sha256s the caller chose, refused if `out` holds others by now."""
    from ..oci.refs import Descriptor

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
    return artifact.Artifact.of(artifact_tag(key), ARTIFACT_TYPE, (Descriptor.of(ARTIFACT_CONFIG, config), config),
                                blobs)


def push_artifact(store, key: str, out: Path, accepted: dict[str, str] | None = None) -> Reference:
    """Push a compile's outputs under REPO:kernels-<key> in `store` (the build's push target)."""
    return artifact.push(store, kernels(key, out, accepted))


def fetch_artifact(store, key: str, dest: Path, trust, expected: set[str]) -> tuple[Reference, dict[str, str]] | None:
    """The outputs of this exact compile from REPO:kernels-<key>: its manifest digest must carry a
    release-key signature (`trust(ref)` raises otherwise) before any of its bytes is used; then every
    blob is checked by digest and the config's key and sha256s against what arrives. The artifact
    pinned, and the outputs' sha256s it vouches for; None if the registry has no artifact for this key."""
    from ..errors import malformed
    from ..oci.manifest import Manifest

    ref = store.ref.with_tag(artifact_tag(key))

    def signed(pinned: Reference) -> None:
        try:
            trust(pinned)
        except IntegrityError as e:
            raise IntegrityError(f"{e}; refused: a kernel artifact is used only when a release key signed it. "
                                 f"Compile here instead with `invoke build --recompile` (the release workflow's sign "
                                 f"job signs the artifact the build record names)") from None

    taken = artifact.take(store, artifact_tag(key), signed)
    if taken is None:
        return None
    pinned, body = taken
    manifest = Manifest.parse(body, f"kernel artifact {ref}")
    with malformed(f"kernel artifact {ref}"):
        config = json.loads(store.document(manifest.config, f"config of kernel artifact {ref}"))
        layers = manifest.layers
        if config["key"] != key:
            raise IntegrityError(f"kernel artifact {ref} is for recipe {config['key']}, not {key}")
        names = {layer.annotations[TITLE] for layer in layers}
        if names != set(config["sha256"]) or names != expected:
            raise IntegrityError(f"kernel artifact {ref}: its files {sorted(map(repr, names))[:8]} are not the ones "
                                 f"this recipe makes ({', '.join(sorted(expected))}) or its config names")
    with atomic_dir(dest, keep=same_outputs(config["sha256"])) as tmp:
        for layer in layers:
            data = store.registry.fetch_blob(store.repo, layer)  # checked against the layer's digest
            name = layer.annotations[TITLE]
            if hashlib.sha256(data).hexdigest() != config["sha256"][name]:
                raise IntegrityError(f"kernel artifact {ref}: {name} does not match the sha256 its config records")
            (tmp / name).write_bytes(data)
        (tmp / "done.json").write_text(json.dumps({"toolchain_image": config["toolchain"], "sha256": config["sha256"],
                                                   "artifact": str(pinned)}))
    return pinned, {str(k): str(v) for k, v in config["sha256"].items()}
