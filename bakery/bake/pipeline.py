"""`invoke build`: inputs -> base -> files -> layers -> config + manifest -> outputs -> record."""

from __future__ import annotations

import dataclasses
import email.parser
import functools
import glob
import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from .. import untrusted
from ..base import inventory, spec as base_mod
from ..base.filesystem import BaseFilesystem
from ..base.layercache import LayerCache
from ..base.scan import normalize
from ..errors import BakeryError, EnvironmentProblem, InputError, IntegrityError
from ..inputs import hip as hip_mod, hip_compile, image as image_mod, overlays as overlays_mod, tuning as tuning_mod
from ..oci.layer import FileEntry, write_blob, write_layer
from ..oci.refs import Descriptor, Reference
from ..oci.registry import Registry
from ..oci.store import RegistryStore
from ..project import Project, cache_dir
from ..proofs import gate, runner as prove_mod
from ..trust import record as record_file
from ..trust.record import (
    Artifact as ArtifactRecord,
    Base as BaseRecord,
    BuildRecord,
    DebPackage,
    Deleted,
    Distribution,
    File as FileRecord,
    Hashed,
    ImageSpec,
    Kernels,
    Layer as LayerRecord,
    LockPin,
    Manifest as ManifestRecord,
    OperatingSystem,
    Overlay as OverlayRecord,
    Source,
    Tuning,
    Verdict,
)
from . import record
from .publish import Derived, push, write_layout

DIST_INFO = "usr/local/lib/python3*/dist-packages/*.dist-info/METADATA"
DIST_RECORD = DIST_INFO.removesuffix("METADATA") + "RECORD"  # which files each distribution installed


@dataclass(frozen=True)
class Options:
    project: Path
    base: str | None = None  # REF@DIGEST overriding image/base.yaml
    push: str | None = None  # REGISTRY/REPO[:TAG]
    layout: Path | None = None
    out: Path | None = None  # where blobs and the record go; default PROJECT/out
    lock: Path | None = None  # overlays lock; default PROJECT/overlays/overlays.lock
    toolchain: str | None = None  # image to compile hip/ in (hip_compile.toolchain_image: its default)
    keys: tuple[Path, ...] = ()  # release public keys, beside the policy's: who may vouch for kernels
    policy: Path | None = None  # default PROJECT/provenance/policy.yaml
    recompile: bool = False  # compile hip/ here even where the registry holds a signed artifact
    reprove: bool = False  # run every proof here, whatever this machine or the registry holds
    device: str = "cpu"  # where `invoke prove` runs the proofs' Triton kernels: cpu (interpreted) or cuda
    base_mirror: str | None = None  # with base: read that digest from this REGISTRY/REPO (a kept nightly)

    @classmethod
    def from_flags(cls, project: Path, *, layout=None, out=None, lock=None, key=None, policy=None, **rest) -> Options:
        """From a task's flags, by name (strings as given; key: one release public key)."""
        as_path = lambda v: Path(v) if v else None  # noqa: E731 (one line, used four times below)
        return cls(project, layout=as_path(layout), out=as_path(out), lock=as_path(lock),
                   keys=(Path(key),) if key else (), policy=as_path(policy), **rest)

    @property
    def out_dir(self) -> Path:
        return self.out or Project(self.project).out

    @property
    def lock_path(self) -> Path:
        return self.lock or Project(self.project).lock

    def kernel_trust(self, registry: Registry):
        """What a kernel artifact (or a proof verdict) must carry to be used: a cosign signature by the
        policy's release keys or its release workflow's keyless identity (threshold, allowed
        repositories). None where the policy names neither. With --key there is one, so the policy is
        read when a signature is first checked (a warm build checks none)."""
        from ..trust import policy

        load = functools.lru_cache(maxsize=1)(lambda: policy.load_policy(
            self.policy or Project(self.project).policy, self.project, {"release": list(self.keys)}))
        if not self.keys and not load().may_sign("release"):
            return None

        def trust(ref, what="kernel artifact") -> None:
            from ..oci.store import RegistryStore
            from ..trust import verify

            verify.require_signed(RegistryStore(ref, registry), ref, load(), what)

        return trust


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


def _git(project: Path, *args: str) -> str:
    return _git_started(project, *args)()


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
    return sorted(p for folder in ("image", "overlays", "tuning", "hip") if (project / folder).is_dir()
                  for p in (project / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)


@dataclass(frozen=True)
class OpenBase:
    spec: base_mod.BaseSpec
    registry: Registry
    image: base_mod.Image
    fs: BaseFilesystem
    overlays: list | None = None  # overlays.yaml as loaded when the base was opened; None if it did not load


def registered_overlays(project: Path) -> list | None:
    """overlays.yaml loaded, or None when it does not load: whoever needs it reports why."""
    try:
        return overlays_mod.load(Project(project).overlays_yaml)
    except BakeryError:
        return None


def needed_files(project: Path, registered: list | None = None) -> tuple[str, ...]:
    """Every base file a build or rebase reads (as patterns): dist-info, overlay targets, what the
    proofs and probes read. Kept on a layer's first pass, so no layer is streamed twice."""
    registered = registered if registered is not None else registered_overlays(project)
    always = (DIST_INFO, DIST_RECORD) + inventory.PATTERNS
    if registered is None:
        return always
    paths = {o.target for o in registered} | {r for o in registered if o.proof for r in o.proof.reads} | \
        {c["path"] for o in registered for c in o.probe}
    return always + tuple(sorted(glob.escape(p.lstrip("/")) for p in paths))


def open_base(project: Path, override: str | None, log=print, mirror: str | None = None) -> OpenBase:
    """Resolve the pinned base (or --base, read from mirror when given) and open its filesystem
    through the layer cache; layers not yet indexed are streamed now, concurrently, once each."""
    spec = base_mod.load_spec(Project(project).base_yaml, override, mirror)
    registry = Registry(spec.source.registry)
    log(f"resolving base {spec.source}")
    image = base_mod.resolve(registry, spec.source, spec.platform)
    registered = registered_overlays(project)  # loaded once: its checks are not free
    fs = BaseFilesystem(registry, image, LayerCache(), keep=needed_files(project, registered))
    fs.prefetch()
    fs.check_layers()
    fs.check_merge()  # what we read of it is what every engine unpacks, or the base is refused
    return OpenBase(spec, registry, image, fs, registered)


def base_files(base: OpenBase, paths) -> dict:
    """{image path: bytes} of the base's regular files (None where absent or not a regular file)."""
    return regular_files(base.fs, paths)


def regular_files(fs: BaseFilesystem, paths) -> dict:
    """{path as given: bytes} of the regular files at those paths (None where absent or not one)."""
    paths = sorted(set(paths))
    found = fs.read(paths) if paths else {}
    return {p: (f.data if f is not None and f.kind in ("file", "hardlink") else None)
            for p, f in ((p, found.get(normalize(p))) for p in paths)}


def probe_files(fs: BaseFilesystem, paths) -> dict:
    """{path as given: what an audit probe reads there}: a regular file's bytes; None where nothing is,
    nor anything Python would import as that module instead; else what is there, described (a link or
    a folder at the path or above it, the module in another form), which no probe takes for the file
    or for its absence: the code could be reached through it."""
    paths = sorted(set(paths))
    found = fs.read(paths) if paths else {}
    above = {p: [str(a) for a in PurePosixPath(normalize(p)).parents if str(a) != "."] for p in paths}
    kinds = fs.kinds({a for folders in above.values() for a in folders})
    out: dict[str, bytes | str | None] = {}
    for p in paths:
        f = found.get(normalize(p))
        through = next(((a, k[0]) for a in above[p] if (k := kinds.get(a)) and k[0] != "dir"), None)
        if through:
            out[p] = f"under a {through[1]} (/{untrusted.safe(through[0])})"
        elif f is not None:
            out[p] = f.data if f.kind in ("file", "hardlink") else f"a {f.kind}"
        else:
            other = [q for pattern in overlays_mod.stand_in_patterns(p) for q in fs.glob(pattern)]
            other += [q for q, kind in fs.kinds(overlays_mod.package_shadows([p])).items() if kind]
            out[p] = f"the module as /{untrusted.safe(sorted(other)[0])}" if other else None
    return out


def overlay_inputs(project: Path, base: OpenBase) -> tuple[list, list, list]:
    """Registered overlays, the required ones applied exactly to the base bytes, and the stale
    bytecode to delete."""
    overlays = base.overlays if base.overlays is not None else overlays_mod.load(Project(project).overlays_yaml)
    targets = [o.target for o in overlays if o.baked]
    applied = overlays_mod.apply_all(overlays, base.fs.read(targets))
    present = [p for pattern in overlays_mod.shadow_patterns(targets) for p in base.fs.glob(pattern)]
    for folder, found in base.fs.read(overlays_mod.package_shadows(targets)).items():
        # a package (a folder with an __init__, or a link, which might lead to one) comes before NAME.py;
        # a folder without one is a namespace portion, which does not. A layer may give the __init__
        # without an entry for its folder (the engines make it): the __init__ alone decides
        kind = found.kind if found is not None else "dir"
        if kind == "symlink" or base.fs.glob(glob.escape(folder) + "/__init__.*"):
            raise IntegrityError(f"the base holds /{untrusted.safe(folder)} ({kind}) beside the overlaid "
                                 f"/{untrusted.safe(folder)}.py: Python would import that package, and the overlay "
                                 f"would never run; the base is refused")
    return overlays, applied, overlays_mod.stale_bytecode(targets, present)


def lock(opts: Options, log=print) -> overlays_mod.Lock:
    """`invoke lock`: apply every required overlay to the base, prove it, and pin both hashes. A lock
    is only written for overlaid bytes whose proof says FIXED: the build would refuse any other."""
    project = opts.project.resolve()
    base = open_base(project, opts.base, log)
    _, applied, _ = overlay_inputs(project, base)
    overlay_proofs(base, applied, log)
    for a in applied:
        if a.original is not None:
            overlays_mod.store_stock(project / "overlays", a.original)
    document = overlays_mod.Lock.of(str(base.spec.image), [a.lock_entry() for a in applied])
    overlays_mod.write_lock(opts.lock_path, document)
    return document


def overlay_proofs(base: OpenBase, applied: list, log=print, signed: prove_mod.SignedVerdicts | None = None,
                   reprove: bool = False) -> tuple[dict, list]:
    """Each baked overlay's proof on the base's stock target and on the overlaid one (cached by
    their inputs, or signed verdicts from `signed`); refuses unless the stock target proves BROKEN
    and the overlaid one FIXED. Returns ({overlay: what its proofs said}, [each verdict's record])."""
    specs = [a.overlay.proof for a in applied if a.overlay.proof and a.overlay.proof.script]
    reads = base_files(base, [r for spec in specs for r in spec.reads])
    jobs = {}
    for a in applied:
        if a.overlay.proof and a.overlay.proof.script:
            jobs[(a.overlay.id, "stock")] = (a.overlay.proof, a.original, reads)
            jobs[(a.overlay.id, "overlaid")] = (a.overlay.proof, a.result, reads)
    if jobs:
        log(f"proving {len(jobs) // 2} overlays on stock and overlaid bytes (cached by their inputs)")
    verdicts = prove_mod.run_many(jobs, signed=signed, reprove=reprove)
    out = {}
    for a in applied:
        spec = a.overlay.proof
        stock, overlaid = verdicts.get((a.overlay.id, "stock")), verdicts.get((a.overlay.id, "overlaid"))
        judged = gate.judge(spec, stock, overlaid)
        if not judged.proven:
            raise (IntegrityError if judged.has_proof else InputError)(judged.message(a.overlay.id))
        if spec.script is None:
            out[a.overlay.id] = {"hardware": spec.hardware}
            continue
        assert stock is not None and overlaid is not None  # judged proven by its script: both sides ran
        out[a.overlay.id] = {"script": str(spec.script.name), "code_sha256": spec.code_sha256,
                             "stock": stock.verdict, "overlaid": overlaid.verdict, "reason": overlaid.reason}
    return out, [(overlay, side, verdicts[(overlay, side)]) for overlay, side in sorted(verdicts)]


def verdict_records(verdicts: list, remote: RegistryStore | None) -> tuple[tuple[Verdict, ...], list[Callable[[], object]]]:
    """Each verdict as the record names it, and the pushes of those proven here (to `remote`, the
    push target, where the sign job signs what the record names and later builds take them)."""
    records, pushes = [], []
    for overlay, side, v in verdicts:
        artifact = Reference.parse(v.artifact) if v.artifact else None
        if remote is not None and v.origin == "proven":
            artifact, push_one = prove_mod.verdict_artifact(remote, v)
            pushes.append(push_one)
        records.append(Verdict(overlay, side, v.key, v.verdict, v.origin, artifact))
    return tuple(records), pushes


DIST_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,198}[A-Za-z0-9])?")  # PEP 508's, capped
# where DIST_INFO's * may lead: a plain name per folder (a vendored dist-info lies deeper, setuptools/_vendor/)
DIST_INFO_PATH = re.compile(r"usr/local/lib/python3\.[0-9]{1,3}/dist-packages/(?:[A-Za-z0-9_][A-Za-z0-9._+-]{0,250}/){0,16}"
                            r"[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.dist-info/METADATA")
DIST_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,127}")  # PEP 440's characters and legacy ones
METADATA_LIMIT = 4 << 20  # a METADATA file is kilobytes: its headers are all we parse


def python_distributions(fs: BaseFilesystem) -> list[Distribution]:
    """Name and version of each Python distribution installed in the base, from its dist-info. They
    go into the SBOM and the signed record: a missing, non-ASCII or odd one refuses the base in one
    line, before anything is pushed."""
    found = fs.read(fs.glob(DIST_INFO), limit=METADATA_LIMIT)  # past it: its size, its bytes never held
    dists = []
    for path, f in sorted(found.items()):
        if not DIST_INFO_PATH.fullmatch(path):  # the glob's * takes any character, and the path is signed
            raise IntegrityError(f"the base's /{untrusted.safe(path)} is no dist-info folder's METADATA an installer "
                                 f"writes (folders named with letters, digits and ._+-): the base is refused (its SBOM "
                                 f"would name that path)")
        if f and f.kind in ("file", "hardlink") and f.size > METADATA_LIMIT:
            raise IntegrityError(f"the base's /{untrusted.safe(path)} is {f.size} bytes, past "
                                 f"{METADATA_LIMIT}: not a METADATA file; refused")
        if f and f.data:
            meta = email.parser.BytesParser().parsebytes(f.data, headersonly=True)
            who, fields = supplier(meta, path), {}
            for field, pattern in (("Name", DIST_NAME), ("Version", DIST_VERSION)):
                value = meta.get(field)
                if not isinstance(value, str) or not pattern.fullmatch(value):
                    said = "none" if value is None else repr(untrusted.safe(value, limit=80))
                    raise IntegrityError(f"the base's /{untrusted.safe(path)} has {field}: {said}, not a distribution "
                                         f"{field.lower()}: the base is refused (its SBOM could not name it)")
                fields[field.lower()] = value
            assert f.sha256 is not None  # a regular file read with its bytes
            dists.append(Distribution(fields["name"], fields["version"], "/" + path, f.sha256, who))
    return dists


def supplier(meta, path: str) -> str | None:
    """Who a METADATA says supplies the distribution: its Author, else its Maintainer, else the name
    (or address) of the first Author-email or Maintainer-email; None where it names no one."""
    for field in ("Author", "Maintainer", "Author-email", "Maintainer-email"):
        value = meta.get(field)
        if isinstance(value, str) and value.strip():
            value = " ".join(value.split())
            if field.endswith("email"):
                first = value.split(",")[0].strip()
                value = first.split("<")[0].strip().strip('"') or first.strip("<>")
            if len(value) > 200 or not value.isprintable():
                raise IntegrityError(f"the base's /{untrusted.safe(path)} has an {field} that is not one printable "
                                     f"line of at most 200 characters: the base is refused (its SBOM names it)")
            return value
    return None


def folders_are_folders(base: OpenBase, paths: list[str]) -> None:
    """Each folder our layers write into is a folder in the base, or absent: where the base has a link
    (or a file) above a path we write, Docker's overlay2 would make a folder over it in our layer,
    hiding all the link led to, while containerd would write where it points. Refused instead."""
    above = sorted({str(a).lstrip("/") for p in paths for a in PurePosixPath(p).parents if str(a) != "/"})
    for folder, found in base.fs.read(above).items():
        if found is not None and found.kind != "dir":
            raise IntegrityError(f"the base gives /{untrusted.safe(folder)} as {found.kind}, and this build writes "
                                 f"into it: the engines would unpack our layer differently over it; the base is "
                                 f"refused")


def check_attestable(rec: BuildRecord, subject: Reference) -> None:
    """Make now, from the record, what `invoke attest` will sign: a record that would not read back,
    cannot give its SBOM, provenance or VEX, or gives one a registry would not serve back (past 4 MiB
    signed), fails here, before anything is pushed or tagged."""
    import base64

    from ..oci.transport import DOCUMENT_LIMIT
    from ..trust import attest

    try:
        BuildRecord.from_json(rec.to_json())  # what `invoke attest` will read
        statements = attest.statements(subject, rec)
    except (InputError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise IntegrityError(f"the build record cannot give its SBOM, provenance and VEX ({type(e).__name__}: "
                             f"{untrusted.safe(e)}): nothing pushed") from None
    for predicate, body in statements.items():
        signed = len(base64.b64encode(body)) + 4096  # the DSSE envelope: the payload in base64, a signature
        if signed > DOCUMENT_LIMIT:
            raise IntegrityError(f"the {attest.NAMES[predicate]} would be about {signed} bytes signed, past the {DOCUMENT_LIMIT} a "
                                 f"registry serves back: nothing pushed (is some text of the base huge?)")


def overlay_records(project: Path, overlays: list, applied: list, proofs: dict, fs: BaseFilesystem,
                    dists: list[Distribution]) -> tuple[OverlayRecord, ...]:
    """Every registered overlay (baked or not) with its hashes, and for a baked one the distribution
    whose RECORD lists its target (the SBOM puts the file in that package, and says the RECORD's
    sha256 is no longer the file's)."""
    by_id = {a.overlay.id: a for a in applied}
    # audit records' targets too: the VEX names the distribution for them as well
    owned_by = inventory.owners(fs, [d.metadata for d in dists], [o.target for o in overlays])
    # an audit record's probe, run on this base: the VEX says not_affected only where it holds
    probed = [o for o in overlays if not o.baked and o.probe]
    files = probe_files(fs, [c["path"] for o in probed for c in o.probe])  # as rebase reads them
    audits = {o.id: dict(zip(("holds", "detail"), overlays_mod.probe_holds(o, files), strict=True)) for o in probed}
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


def write_layers(specs: list, epoch: int, blobs: Path) -> list:
    """One layer per (files, comment, deletions), None skipped, in order, compressed concurrently
    (zlib lets go of the GIL), or taken from the gzip cache where the same tar was compressed before."""
    specs = [s for s in specs if s is not None]
    kept = cache_dir("gzip")
    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(lambda s: write_layer(s[0], epoch, blobs, s[1], deletions=s[2], kept=kept), specs))


def checked_overlays(project: Path, opts: Options, opened: OpenBase, log=print,
                     signed: prove_mod.SignedVerdicts | None = None) -> tuple[list, list, list, tuple[dict, list]]:
    """Registered overlays applied to the base, held to the lock and the stored stock bytes, and
    proven: (overlays, applied, stale bytecode, (proofs, verdicts))."""
    overlays, applied, stale = overlay_inputs(project, opened)
    locked = overlays_mod.read_lock(opts.lock_path)
    overlays_mod.verify_against_lock(applied, locked, str(opened.spec.image), opts.lock_path)
    overlays_mod.check_stock(project / "overlays", locked, opts.lock_path)
    return overlays, applied, stale, overlay_proofs(opened, applied, log, signed, opts.reprove)


def push_target(opts: Options) -> Reference | None:
    target = Reference.parse(opts.push) if opts.push else None
    if target and target.digest:
        raise InputError(f"--push {opts.push!r}: give REGISTRY/REPO[:TAG]; the digest is computed")
    return target


def write_outputs(derived: Derived, opts: Options, target: Reference | None, registries: dict, blob_cache: Path,
                  log=print) -> tuple[Reference | None, list, object]:
    """Push and/or write the layout: (pushed name, outputs for the record, push stats)."""
    outputs, stats, name = [], None, None
    if target:
        log(f"pushing to {target}")
        name, stats = push(derived, target, registries)
        outputs.append({"kind": "registry", "reference": str(name), "tag": target.tag})
    if opts.layout:
        path = write_layout(derived, Path(opts.layout), (target.tag if target else None) or "latest", blob_cache)
        outputs.append({"kind": "oci-layout", "path": str(path), "digest": str(derived.digest)})
    return name, outputs, stats


def base_record(opened: OpenBase, dists: list) -> BaseRecord:
    """The base as read, with what its SBOM names: its Pythons, its OS and its dpkg packages (a base
    with dpkg packages and no os-release is refused: scanners could not say whose packages they are)."""
    base, pinned = opened.image, opened.spec
    os_found = inventory.operating_system(opened.fs)
    debs = tuple(DebPackage.from_json(d, f"the base's dpkg package {i}")
                 for i, d in enumerate(inventory.debian_packages(opened.fs)))
    if debs and os_found is None:
        raise IntegrityError("the base has dpkg packages but no /etc/os-release or /usr/lib/os-release: its SBOM "
                             "could not name their distribution; the base is refused")
    return BaseRecord(pinned.image.name, pinned.image, str(base.ref), pinned.platform, base.index_digest,
                      base.manifest_digest, base.manifest_media_type, len(base.manifest_bytes),
                      base.config_descriptor, tuple(base.layers), tuple(dists),
                      OperatingSystem.from_json(os_found) if os_found else None, debs)


def build(opts: Options, log=print) -> tuple[Reference, BuildRecord]:
    """inputs -> base -> checked overlays -> kernels -> tuning -> layers -> config + manifest ->
    outputs -> build record."""
    project = opts.project.resolve()
    started = datetime.now(UTC)
    revision, status = _git_started(project, "rev-parse", "HEAD"), _git_started(project, "status", "--porcelain")
    epoch = source_date_epoch(project)  # the three git processes run at once
    revision, dirty = revision(), bool(status())  # untracked files count: they can change the image
    spec = image_mod.load_spec(Project(project).image_yaml)
    target = push_target(opts)
    opened = open_base(project, opts.base, log)
    toolchain = hip_compile.toolchain_image(opts.toolchain, opened.spec.source)  # refused before the proofs run
    registries = {opened.spec.source.registry: opened.registry}
    remote = RegistryStore(Reference(target.registry, target.repository), registries.get(target.registry) or
                           registries.setdefault(target.registry, Registry(target.registry))) if target else None
    trust = opts.kernel_trust(remote.registry) if remote else None
    signed = prove_mod.SignedVerdicts(remote, trust, log) if remote and trust else None
    dists = python_distributions(opened.fs)
    overlays, applied, stale, (proofs, verdicts) = checked_overlays(project, opts, opened, log, signed)
    verdict_list, verdict_pushes = verdict_records(verdicts, remote)
    overlay_files = tuple(FileEntry(a.overlay.target, a.result) for a in applied)

    recipe = hip_mod.served(hip_mod.load(project / "hip"), {a.overlay.id for a in applied}, log)
    compiled = hip_compile.compile_recipe(recipe, toolchain, cache_dir(create=True) / "hip", log, remote, trust,
                                      opts.recompile, defer_push=True)
    kernel_files = hip_mod.files(recipe, compiled.artifacts)
    tables = tuning_mod.load(Project(project).tuning)
    table_files = tuning_mod.files(tables)
    spec = dataclasses.replace(spec, env=spec.env + tuple(tuning_mod.env(tables).items()))

    manifest_entry = image_mod.in_image_manifest(kernel_files + table_files + overlay_files + spec.files)
    # and the __pycache__ beside each overlay, where Python looks for its bytecode (a link there would hide
    # the stale bytecode from our globs, which read the folder itself)
    caches = [str(PurePosixPath(f.path).parent / "__pycache__" / "-") for f in overlay_files]
    folders_are_folders(opened, [f.path for f in kernel_files + table_files + overlay_files + spec.files +
                                 (manifest_entry,)] + list(stale) + caches)
    blobs = opts.out_dir / "blobs"
    layers = write_layers([
        (kernel_files, "kernels for " + recipe.arch + ": " + ", ".join(a.name for a in compiled.artifacts), ()),
        (table_files, "AITER tuning tables: " + ", ".join(t.name for t in tables), ()) if table_files else None,
        (overlay_files, "overlays: " + ", ".join(a.overlay.id for a in applied), tuple(stale)) if overlay_files
        else None,
        (spec.files + (manifest_entry,), "entrypoint, self-check and in-image manifest", ())], epoch, blobs)

    base = opened.image
    notes = image_mod.image_annotations(opened.spec.image.name, base, spec, revision, epoch)
    config = image_mod.derive_config(base, layers, spec, epoch, notes)
    config_desc = Descriptor.of(image_mod.OCI_CONFIG, config)
    manifest = image_mod.derive_manifest(base, config_desc, layers, notes)
    derived = Derived(base, opened.registry, manifest, config, config_desc, tuple(layers))
    write_blob(blobs / "sha256" / config_desc.digest.hex, config)
    write_blob(blobs / "sha256" / derived.digest.hex, manifest)

    rec = BuildRecord(
        source=Source(record.source_repository(project, _git), revision, dirty, epoch),
        inputs=tuple(Hashed(str(p.relative_to(project)), hashlib.sha256(p.read_bytes()).hexdigest())
                     for p in input_files(project)),
        base=base_record(opened, dists),
        files=tuple(FileRecord(f.path, f.sha256, len(f.data), oct(f.mode), i)
                    for i, layer in enumerate(layers) for f in layer.files),
        deleted=tuple(Deleted(d, i, "an extension module Python would import instead of an overlaid module"
                              if d.endswith(".so") else "stale bytecode of an overlaid module")
                      for i, layer in enumerate(layers)
                      for d in layer.deletions),
        overlays=overlay_records(project, overlays, applied, proofs, opened.fs, dists),
        verdicts=verdict_list,
        artifacts=tuple(ArtifactRecord.from_json(a.record(), f"artifacts[{i}]")
                        for i, a in enumerate(compiled.artifacts)),
        kernels=Kernels.from_json(compiled.record()),
        tuning=tuple(Tuning(t.name, t.path, t.sha256, t.rows, t.env, t.source.name) for t in tables),
        layers=tuple(LayerRecord(layer.descriptor, layer.diff_id, layer.comment) for layer in layers),
        config=config_desc,
        manifest=ManifestRecord(derived.digest, image_mod.OCI_MANIFEST, len(manifest), notes),
        image=ImageSpec(spec.repository.name, dict(spec.env), tuple(spec.entrypoint), tuple(spec.cmd)),
        outputs=(),
        push=None,
        overlays_lock=LockPin(str(opts.lock_path), str(opened.spec.image),
                              hashlib.sha256(opts.lock_path.read_bytes()).hexdigest()),
        builder=record.builder(),
        tools=record.tools(),
        started=started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        finished=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),  # again once pushed
        layer_downloads=opened.fs.cache.downloads,
    )
    # everything that can fail has run before the first push (a push writes the tag)
    check_attestable(rec, (target or spec.repository).with_digest(derived.digest))
    for push_one in ([compiled.push] if compiled.push else []) + verdict_pushes:
        push_one()
    pushed, outputs, stats = write_outputs(derived, opts, target, registries, opened.fs.cache.root / "blobs", log)
    rec = dataclasses.replace(rec, outputs=tuple(outputs), push=vars(stats) if stats else None,
                              finished=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                              layer_downloads=opened.fs.cache.downloads)
    try:
        record_file.write(opts.out_dir / "build-record.json", rec)
    except EnvironmentProblem as e:  # the one write after the push: say what is out there already
        if not (pushed or opts.layout):
            raise
        done = f"{pushed} is pushed{f' and tagged {target.tag}' if target and target.tag else ''}" if pushed \
            else f"the layout {opts.layout} is written"
        raise EnvironmentProblem(f"{done}, but its build record is not: {e}. Run the same build again once there "
                                 f"is room: it pushes nothing new and writes the record") from None
    return pushed or spec.repository.with_digest(derived.digest), rec
