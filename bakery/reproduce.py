"""`invoke reproduce IMAGE@DIGEST`: rebuild a released digest from its signed provenance, on this
machine, trusting none of the original builder's outputs, and say whether the bytes are the same.

The provenance is opened only once its signature by the release keys holds. From it: the source
repository and revision, the pinned base, SOURCE_DATE_EPOCH and the toolchain the kernels were
compiled in. The revision is cloned into a fresh folder and built there with an empty cache,
compiling hip/ itself (never fetching the kernel artifact), into an OCI layout. Same manifest
digest: reproduced. Otherwise each differing layer is read on both sides and the files that
differ are named with both sha256. Plan and compare are pure; clone, build and read are I/O.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from . import provenance
from .errors import EnvironmentProblem, IntegrityError, InputError, malformed
from .refs import Descriptor, Digest, Reference


@dataclass(frozen=True)
class Plan:
    """What the signed provenance says the digest was built from."""
    repository: str
    revision: str
    dirty: bool
    base: str
    epoch: int
    toolchain: str | None  # the image the kernels were compiled in, by ID or digest


def plan(prov: dict) -> Plan:
    with malformed("the signed provenance"):
        params = prov["buildDefinition"]["externalParameters"]
        source = params["source"]
        toolchains = {b["annotations"]["toolchain"].rsplit("; image ", 1)[-1]
                      for b in prov["runDetails"].get("byproducts", []) if "toolchain" in b.get("annotations", {})}
        if len(toolchains) > 1:
            raise InputError(f"the provenance names {len(toolchains)} toolchains; a rebuild needs one")
        return Plan(str(source["repository"]), str(source["revision"]), bool(source.get("dirty")), str(params["base"]),
                    int(params["sourceDateEpoch"]), next(iter(toolchains), None))


def signed_provenance(store, ref: Reference, policy) -> dict:
    """The SLSA provenance of ref, once the image signature and the statement's signature hold."""
    from . import verify

    report = verify.Report()
    verify._signature(store, ref, policy, report)
    found = verify._attestations(store, ref, policy, report)
    if report.failures:
        raise IntegrityError(f"{ref}: {report.failures[0]}: its provenance cannot be trusted to rebuild from")
    if provenance.SLSA_PREDICATE not in found:
        raise IntegrityError(f"{ref}: no signed SLSA provenance to rebuild from")
    return found[provenance.SLSA_PREDICATE]


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise EnvironmentProblem(f"git {args[0]}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return done.stdout.strip()


def rebuild(p: Plan, workdir: Path, toolchain: str | None, log) -> tuple[Path, Path]:
    """(OCI layout, build record) of the revision built here from nothing: a fresh clone, an empty
    cache, the kernels compiled (the artifact the original used is never fetched)."""
    source = workdir / "source"
    log(f"cloning {p.repository} at {p.revision[:12]}")
    _git("clone", "-q", "--no-checkout", p.repository, str(source))
    _git("checkout", "-q", "--detach", p.revision, cwd=source)
    layout, out = workdir / "layout", workdir / "out"
    tools = toolchain or p.toolchain
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(p.epoch), "BAKERY_CACHE": str(workdir / "cache")}
    env.pop("BAKERY_TOOLCHAIN", None)
    argv = [sys.executable, "-m", "invoke", "--search-root", str(source), "build", "--base", p.base,
            "--layout", str(layout), "--out", str(out), "--recompile"] + (["--toolchain", tools] if tools else [])
    log(f"building {p.revision[:12]} with an empty cache (SOURCE_DATE_EPOCH={p.epoch})")
    done = subprocess.run(argv, cwd=source, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"the rebuild failed (exit {done.returncode}): {said}")
    return layout, out / "build-record.json"


def _files(store, desc: Descriptor) -> dict[str, str]:
    """{path: sha256} of the regular files of one layer (whatever its compression)."""
    raw = b"".join(store.stream(desc))
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    files = {}
    with tarfile.open(fileobj=__import__("io").BytesIO(data), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                files["/" + member.name.lstrip("./")] = hashlib.sha256(tar.extractfile(member).read()).hexdigest()
            elif member.issym() or member.islnk():
                files["/" + member.name.lstrip("./")] = f"link to {member.linkname}"
    return files


def differences(original, original_manifest: bytes, rebuilt, rebuilt_manifest: bytes) -> list[dict]:
    """Per differing layer: its index, both digests, and the files that differ (path, both sha256;
    None where a side lacks the file). The config is compared too (it holds the diff_ids)."""
    a, b = json.loads(original_manifest), json.loads(rebuilt_manifest)
    out = []
    layers_a, layers_b = a.get("layers", []), b.get("layers", [])
    for i in range(max(len(layers_a), len(layers_b))):
        da = Descriptor.from_json(layers_a[i]) if i < len(layers_a) else None
        db = Descriptor.from_json(layers_b[i]) if i < len(layers_b) else None
        if da and db and da.digest == db.digest:
            continue
        fa = _files(original, da) if da else {}
        fb = _files(rebuilt, db) if db else {}
        changed = [{"path": path, "original": fa.get(path), "rebuilt": fb.get(path)}
                   for path in sorted(set(fa) | set(fb)) if fa.get(path) != fb.get(path)]
        out.append({"layer": i, "original": str(da.digest) if da else None, "rebuilt": str(db.digest) if db else None,
                    "files": changed})
    if a.get("config", {}).get("digest") != b.get("config", {}).get("digest") and not out:
        out.append({"layer": "config", "original": a["config"]["digest"], "rebuilt": b["config"]["digest"], "files": []})
    return out


def rebuilt_digest(layout: Path) -> tuple[Digest, bytes]:
    index = json.loads((layout / "index.json").read_text())
    with malformed("the rebuilt layout's index.json"):
        digest = Digest.parse(index["manifests"][0]["digest"])
    return digest, (layout / "blobs" / "sha256" / digest.hex).read_bytes()


def statement(ref: Reference, p: Plan, result: Digest, diffs: list[dict]) -> bytes:
    """The rebuilder's in-toto statement about ref: what was rebuilt, from which revision and
    inputs, on what machine, what it gave, and whether that is ref's digest."""
    import platform

    from . import __version__

    predicate = {"rebuilt": {"source": {"repository": p.repository, "revision": p.revision}, "base": p.base,
                             "sourceDateEpoch": p.epoch, "toolchain": p.toolchain},
                 "builder": {"host": platform.node(), "system": platform.platform(), "bakery": __version__},
                 "result": str(result), "match": result == ref.digest,
                 "differences": [{"layer": d["layer"], "files": [f["path"] for f in d["files"]]} for d in diffs]}
    return provenance.statement(ref, provenance.REBUILD_PREDICATE, predicate)
