"""A simulated month in a registry, for `invoke prune`'s tests and bench: mirrored nightlies (each a
small image tagged kept-sha256-<hex>, recorded in a ledger), candidates built on them (each with its
own layer, signed by a release key in both formats, with a signed provenance naming its base and its
kernel artifact, kernels-<key>, signed too), some of them promoted (a v* tag). Candidates are tagged
with real commits of a git repository, one a day, so prune ranks them by their commit's date.

The images are small and their bytes random (a fresh digest each run); the signatures, bundles,
referrers and tags are written by bakery's own code, as `invoke attest` writes them.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..oci.refs import Reference
from ..oci.registry import OCI_MANIFEST
from ..oci.store import RegistryStore
from ..trust import attest, provenance
from ..trust.statement import Statement

LAYER = "application/vnd.oci.image.layer.v1.tar"
DAY = 86400
START = 1764547200  # 2025-12-01T00:00:00Z


@dataclass
class Month:
    nightlies: list[Reference] = field(default_factory=list)  # oldest first, in the mirror
    candidates: list[tuple[str, Reference]] = field(default_factory=list)  # (commit, image), oldest first
    kernels: dict[str, Reference] = field(default_factory=dict)  # candidate digest -> its kernel artifact
    releases: dict[str, Reference] = field(default_factory=dict)  # tag -> image


def image(store: RegistryStore, layers: list, tag: str | None, size: int) -> tuple[Reference, list]:
    """One image: the given layers (descriptors already in the repository) and one of `size` random bytes."""
    own = store.put_blob(os.urandom(size), LAYER)
    config = store.put_blob(json.dumps({"architecture": "amd64", "os": "linux",
                                        "rootfs": {"type": "layers",
                                                   "diff_ids": [str(d.digest) for d in [*layers, own]]}}).encode(),
                            "application/vnd.oci.image.config.v1+json")
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config.to_json(),
                       "layers": [d.to_json() for d in [*layers, own]]}).encode()
    digest = store.put_manifest(tag, body)
    return Reference(store.registry.name, store.repo, None, digest), [*layers, own]


def simulate(host: str, image_repo: str, mirror_repo: str, git: Path, signer, nightlies: int = 30,
             candidates_per: int = 3, promoted: int = 2, layer_bytes: int = 256 * 1024, log=lambda m: None) -> Month:
    """The month in host's image_repo and mirror_repo; the ledger is ledger_text(month)."""
    month = Month()
    mirror = RegistryStore(Reference(host, mirror_repo, None, None))
    store = RegistryStore(Reference(host, image_repo, None, None))
    for day in range(nightlies):
        ref, base_layers = image(mirror, [], None, layer_bytes)
        mirror.put_manifest(f"kept-sha256-{ref.pin.hex}", mirror.manifest(str(ref.digest)) or b"")
        month.nightlies.append(ref)
        for n in range(candidates_per):
            for d in base_layers:  # the base's layers, mounted as a build pushes them
                store.registry.mount_blob(image_repo, d.digest, mirror_repo)
            when = START + day * DAY + n * 3600
            sha = _commit(git, when, f"day {day} candidate {n}")
            cand, _ = image(store, base_layers, f"candidate-{sha}", layer_bytes // 4)
            kernels, _ = image(store, [], f"kernels-{os.urandom(32).hex()}", layer_bytes // 8)
            attest.sign_image(RegistryStore(kernels), kernels, signer)
            attest.sign_image(store, cand, signer)
            attest.attach(store, cand, {provenance.SLSA_PREDICATE: Statement.about(cand, provenance.SLSA_PREDICATE, {
                "buildDefinition": {"resolvedDependencies": [
                    {"uri": f"docker://{host}/{mirror_repo}@{ref.digest}", "name": "base image"},
                    {"uri": f"docker://{host}/{image_repo}@{kernels.digest}", "name": "kernel artifact"}]},
                "runDetails": {"builder": {"id": "local"}}}).raw}, signer)
            month.candidates.append((sha, cand))
            month.kernels[str(cand.digest)] = kernels
        log(f"day {day + 1}: a nightly and {candidates_per} candidates")
    # promoted: spread over the month, the oldest first (a release needs a base past the newest kept)
    for i in range(promoted):
        sha, cand = month.candidates[(i * len(month.candidates)) // max(promoted, 1)]
        tag = f"v0.{i + 1}.0"
        store.put_manifest(tag, store.manifest(str(cand.digest)) or b"")
        month.releases[tag] = cand
    return month


def ledger_text(month: Month, host: str, upstream: str, mirror_repo: str) -> str:
    """image/nightlies.yaml for the month's nightlies, one seen a day."""
    import yaml

    entries = [{"digest": str(ref.digest), "index": None, "created": _iso(START + day * DAY),
                "seen": _iso(START + day * DAY), "tags": [f"nightly-{day}"], "moved": {}, "deleted": [],
                "vllm": {"version": "0.26.1", "commit": None}, "aiter": {"version": "0.1.19", "commit": None},
                "mirrored": f"{host}/{mirror_repo}@{ref.digest}", "tried": None}
               for day, ref in enumerate(month.nightlies)]
    return yaml.safe_dump({"upstream": upstream, "mirror": f"{host}/{mirror_repo}",
                           "nightlies": list(reversed(entries))}, sort_keys=False)


def _iso(epoch: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _commit(git: Path, when: int, message: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000",
           "GIT_AUTHOR_NAME": "month", "GIT_AUTHOR_EMAIL": "month@localhost", "GIT_COMMITTER_NAME": "month",
           "GIT_COMMITTER_EMAIL": "month@localhost"}
    subprocess.run(["git", "-C", str(git), "commit", "-q", "--allow-empty", "-m", message], check=True, env=env)
    return subprocess.run(["git", "-C", str(git), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
