"""What a build says of itself in its record: who ran it, from which source, with which tools, and
the record assembled from what each stage of the build returned (bake/pipeline.py). The record's
shape is bakery.trust.record."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import sys
import zlib
from datetime import UTC, datetime
from pathlib import Path

from .. import __version__
from ..base import inventory
from ..errors import BakeryError, InputError, IntegrityError
from ..inputs import image as image_mod, overlays as overlays_mod
from ..trust.record import (
    Artifact as ArtifactRecord,
    Base as BaseRecord,
    Builder,
    BuildRecord,
    DebPackage,
    Deleted,
    Distribution,
    File as FileRecord,
    Hashed,
    ImageSpec,
    Kernels as KernelsRecord,
    Layer as LayerRecord,
    LockPin,
    Manifest as ManifestRecord,
    OperatingSystem,
    Overlay as OverlayRecord,
    Source,
    Tuning,
)
from .opened import OpenBase, probe_files
from .stages import Image, Kernels, Overlays, Tables, Verdicts


def tools() -> dict:
    """Versions that can change output bytes (zlib: gzip streams) or explain a build. (requests is
    no longer one: the registry client speaks HTTP through the standard library.)"""
    import yaml

    return {"bakery": __version__, "python": sys.version.split()[0], "zlib": zlib.ZLIB_RUNTIME_VERSION,
            "pyyaml": yaml.__version__, "platform": sys.platform}


def builder() -> Builder:
    """Who ran the build: the GitHub workflow run when in Actions, else `local`."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true":
        server, repo = env.get("GITHUB_SERVER_URL", "https://github.com"), env.get("GITHUB_REPOSITORY", "")
        workflow = env.get("GITHUB_WORKFLOW_REF", f"{repo}/.github/workflows/release.yml@{env.get('GITHUB_REF', '')}")
        return Builder(f"{server}/{workflow}", f"{server}/{repo}/actions/runs/{env.get('GITHUB_RUN_ID')}/attempts/"
                                               f"{env.get('GITHUB_RUN_ATTEMPT', '1')}")
    return Builder("local", "local")


def _actions_repository() -> str | None:
    """The repository Actions runs the build for (the builder vouches for it), outside Actions None."""
    env = os.environ
    if env.get("GITHUB_ACTIONS") == "true" and env.get("GITHUB_REPOSITORY"):
        return f"{env.get('GITHUB_SERVER_URL', 'https://github.com')}/{env['GITHUB_REPOSITORY']}"
    return None


def source_repository(project: Path, origin) -> str:
    """Where the source came from, as the builder can vouch for it: the Actions repository in CI,
    else the checkout's origin (git's answer, `origin()`, in https form), else the checkout's own path."""
    in_actions = _actions_repository()
    if in_actions:
        return in_actions
    try:
        url = origin()
    except Exception:
        return f"file://{project}"
    ssh = re.fullmatch(r"(?:ssh://)?git@([^:/]+)[:/](.+)", url)
    if ssh:
        url = f"https://{ssh.group(1)}/{ssh.group(2)}"
    elif "://" not in url:  # a clone of a local path: name it as a URI all the same
        url = (project / url).resolve().as_uri()
    return url.removesuffix(".git").rstrip("/")


# -- the source: which revision, clean or not, and the one clock -----------------------------------

def _git_started(project: Path, *args: str):
    """Ask git now; the answer (stripped stdout, or InputError) when the returned function is called."""
    proc = subprocess.Popen(["git", "-C", str(project), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def answer() -> str:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise InputError(f"{project} is not a git checkout with a commit ({err.strip()}): "
                             f"bakery records the source revision; commit first")
        return out.strip()
    return answer


def source_date_epoch(committed: str) -> int:
    """SOURCE_DATE_EPOCH if set, else the commit time of HEAD (`committed`, as git said it): read once, here."""
    value = os.environ.get("SOURCE_DATE_EPOCH")
    if value is None:
        return int(committed)
    if not value.isdigit():
        raise InputError(f"SOURCE_DATE_EPOCH={value!r} is not a whole number of seconds since 1970")
    return int(value)


def read_source(project: Path) -> Source:
    """The revision, whether the checkout is dirty (untracked files count: they can change the
    image), SOURCE_DATE_EPOCH (else HEAD's commit time) and where the source came from; git is asked
    all at once (HEAD and its time in one process)."""
    head = _git_started(project, "log", "-1", "--no-show-signature", "--format=%H %ct")
    status = _git_started(project, "status", "--porcelain")
    origin = None if _actions_repository() else _git_started(project, "remote", "get-url", "origin")
    revision, committed = head().split()
    dirty = bool(status())
    return Source(source_repository(project, origin), revision, dirty, source_date_epoch(committed))


def input_files(project: Path) -> list[Path]:
    """Every checked-in file that can change the image."""
    return sorted(p for folder in ("image", "overlays", "tuning", "hip") if (project / folder).is_dir()
                  for p in (project / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)


# -- the record, from what each stage returned -----------------------------------------------------

def base_record(opened: OpenBase, dists: list) -> BaseRecord:
    """The base as read, with what its SBOM names: its Pythons, its OS and its dpkg packages (a base
    with dpkg packages and no os-release is refused: scanners could not say whose packages they are)."""
    base, pinned = opened.image, opened.spec

    def os_and_debs(found: list) -> tuple:
        os_doc, debs_doc = found
        return (OperatingSystem.from_json(os_doc) if os_doc else None,
                tuple(DebPackage.from_json(d, f"the base's dpkg package {i}") for i, d in enumerate(debs_doc)))

    os_found, debs = _of_the_base(opened, "os and debs", [], lambda: [inventory.operating_system(opened.fs),
                                                                     inventory.debian_packages(opened.fs)], os_and_debs)
    if debs and os_found is None:
        raise IntegrityError("the base has dpkg packages but no /etc/os-release or /usr/lib/os-release: its SBOM "
                             "could not name their distribution; the base is refused")
    return BaseRecord(pinned.image.name, pinned.image, str(base.ref), pinned.platform, base.index_digest,
                      base.manifest_digest, base.manifest_media_type, len(base.manifest_bytes),
                      base.config_descriptor, tuple(base.layers), tuple(dists),
                      os_found, debs)


@functools.cache
def _source_sha256(path: str) -> str:
    """sha256 of one of bakery's own modules: the same few files for each of a build's cached readings."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _of_the_base(opened: OpenBase, what: str, given: list, read, parse, code_of: tuple = ()):
    """parse(read()): what the SBOM and VEX say of the base's files, a function of the base's bytes
    (its manifest digest), `given`, and the code that reads them (the inventory, the merged view,
    `code_of`). Kept in the cache under that key: a warm build would otherwise parse every dpkg
    status line and RECORD row again (torch's RECORD alone has tens of thousands) and load every
    layer's index for the folders above each probed path. An entry that does not name its key or
    does not parse is read again. Not kept inside the sandbox (a rebuild's build): the code
    of the base its proofs ran could have written there."""
    import json

    from .. import sandbox
    from ..base import filesystem, layercache, scan
    from ..files import canonical_json
    from ..oci.layer import write_blob
    from ..project import cache_dir

    if os.environ.get(sandbox.INSIDE) == "1":
        return parse(read())
    code = [_source_sha256(m.__file__) for m in (inventory, filesystem, scan, layercache, *code_of) if m.__file__]
    key = hashlib.sha256(canonical_json([what, str(opened.image.manifest_digest), given, code])).hexdigest()
    path = cache_dir("inventory") / f"{key}.json"
    try:
        doc = json.loads(path.read_bytes())
        if isinstance(doc, dict) and doc.get("key") == key:
            return parse(doc["value"])
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError, BakeryError):
        pass
    value = read()
    parsed = parse(value)  # a base refused is refused here, every time: nothing is kept of it
    write_blob(path, canonical_json({"key": key, "value": value}))
    return parsed


def overlay_records(project: Path, overlays: list, applied: list, proofs: dict, opened: OpenBase,
                    dists: list[Distribution]) -> tuple[OverlayRecord, ...]:
    """Every registered overlay (baked or not) with its hashes, and for a baked one the distribution
    whose RECORD lists its target (the SBOM puts the file in that package, and says the RECORD's
    sha256 is no longer the file's)."""
    by_id = {a.overlay.id: a for a in applied}
    # audit records' targets too: the VEX names the distribution for them as well
    metadata, targets = [d.metadata for d in dists], [o.target for o in overlays]
    def owners(found: dict) -> dict:
        out = {}
        for target, (index, sha256) in found.items():
            if type(index) is not int or not 0 <= index < len(metadata) or not isinstance(sha256, (str, type(None))):
                raise TypeError("not a distribution and sha256")
            out[target] = (index, sha256)
        return out

    owned_by = _of_the_base(opened, "owners", [metadata, targets], lambda: inventory.owners(opened.fs, metadata, targets),
                            owners)
    # an audit record's probe, run on this base: the VEX says not_affected only where it holds
    probed = [o for o in overlays if not o.baked and o.probe]

    def probe_all() -> dict:
        files = probe_files(opened.fs, [c["path"] for o in probed for c in o.probe])  # as rebase reads them
        return {o.id: dict(zip(("holds", "detail"), overlays_mod.probe_holds(o, files), strict=True)) for o in probed}

    def audits_of(found: dict) -> dict:
        if set(found) != {o.id for o in probed} or not all(
                isinstance(a, dict) and set(a) == {"holds", "detail"} and isinstance(a["holds"], bool)
                and isinstance(a["detail"], str) for a in found.values()):
            raise TypeError("not each probe's outcome")
        return found

    # the folders above each probed path are asked of every layer's index: kept by the base's digest too
    audits = _of_the_base(opened, "probes", [[o.id, list(o.probe)] for o in probed], probe_all, audits_of,
                          (overlays_mod,)) if probed else {}
    out = []
    for o in overlays:
        a = by_id.get(o.id)
        patch = a.overlay.patch_path if a else o.patch_path
        owned = owned_by.get(o.target)
        owner = {"distribution": dists[owned[0]].name, "version": dists[owned[0]].version,
                 "record_sha256": owned[1]} if owned else None
        out.append(OverlayRecord(o.id, o.target, o.kind, o.status, a is not None, o.upstream, o.reason,
                                 tuple(o.platforms), str(patch.relative_to(project)) if patch else None,
                                 a.overlay.patch_sha256 if a else o.patch_sha256, proofs.get(o.id),
                                 a.base_sha256 if a else None, a.result_sha256 if a else None,
                                 hashlib.sha1(a.result, usedforsecurity=False).hexdigest() if a else None, owner,
                                 o.defect, audits.get(o.id)))
    return tuple(out)




def assemble(project: Path, lock_path: Path, started: datetime, source: Source, opened: OpenBase,
             dists: list[Distribution], overlays: Overlays, verdicts: Verdicts, kernels: Kernels, tables: Tables,
             image: Image, spec) -> BuildRecord:
    """The build record of what the stages returned, before anything is pushed (its outputs and push
    are filled in once they are)."""
    layers, derived = image.layers, image.derived
    return BuildRecord(
        source=source,
        inputs=tuple(Hashed(str(p.relative_to(project)), hashlib.sha256(p.read_bytes()).hexdigest())
                     for p in input_files(project)),
        base=base_record(opened, dists),
        files=tuple(FileRecord(f.path, f.sha256, len(f.data), oct(f.mode), i)
                    for i, layer in enumerate(layers) for f in layer.files),
        deleted=tuple(Deleted(d, i, "an extension module Python would import instead of an overlaid module"
                              if d.endswith(".so") else "stale bytecode of an overlaid module")
                      for i, layer in enumerate(layers)
                      for d in layer.deletions),
        overlays=overlay_records(project, overlays.registered, overlays.applied, overlays.proofs, opened, dists),
        verdicts=verdicts.records,
        artifacts=tuple(ArtifactRecord.from_json(a.record(), f"artifacts[{i}]")
                        for i, a in enumerate(kernels.compiled.artifacts)),
        kernels=KernelsRecord.from_json(kernels.compiled.record()),
        tuning=tuple(Tuning(t.name, t.path, t.sha256, t.rows, t.env, t.source.name) for t in tables.tables),
        layers=tuple(LayerRecord(layer.descriptor, layer.diff_id, layer.comment) for layer in layers),
        config=derived.config_descriptor,
        manifest=ManifestRecord(derived.digest, image_mod.OCI_MANIFEST, len(derived.manifest), image.notes),
        image=ImageSpec(spec.repository.name, dict(spec.env), tuple(spec.entrypoint), tuple(spec.cmd)),
        outputs=(),
        push=None,
        overlays_lock=LockPin(str(lock_path), str(opened.spec.image), hashlib.sha256(lock_path.read_bytes()).hexdigest()),
        builder=builder(),
        tools=tools(),
        started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        finished=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),  # again once pushed
        layer_downloads=opened.fs.cache.downloads,
    )
