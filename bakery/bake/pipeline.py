"""`invoke build`: the stages in order (build), each returning a typed value (bake/stages.py) that
the record takes as it is (bake/record.py): source -> base -> overlays and their proofs -> kernels
-> tuning -> layers, config and manifest -> record -> pushes and outputs. `invoke lock` shares the
overlay stage. docs/architecture.md says where each stage lives."""

from __future__ import annotations

import dataclasses
import glob
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from .. import untrusted
from ..errors import EnvironmentProblem, InputError, IntegrityError
from ..inputs import hip as hip_mod, hip_compile, image as image_mod, overlays as overlays_mod, tuning as tuning_mod
from ..oci.layer import write_blob, write_layer
from ..oci.refs import Descriptor, Reference
from ..oci.registry import Registry
from ..oci.store import RegistryStore
from ..project import Project, cache_dir
from ..proofs import gate, runner as prove_mod
from ..trust import record as record_file
from ..trust.record import BuildRecord, Verdict
from . import record
from .opened import OpenBase, base_files, open_base, python_distributions
from .options import Options
from .publish import Derived, push, write_layout
from .stages import Image, Kernels, Overlays, Tables, Verdicts


def build(opts: Options, log=print) -> tuple[Reference, BuildRecord]:
    """The stages in order; nothing is pushed or tagged before everything that can fail has run."""
    project = opts.project.resolve()
    started = datetime.now(UTC)
    clock = StageClock()
    source = record.read_source(project)
    spec = image_mod.load_spec(Project(project).image_yaml)
    target = opts.push_target()
    with clock("base"):
        opened = open_base(project, opts.base, log)
    toolchain = hip_compile.toolchain_image(opts.toolchain, opened.spec.source)  # refused before the proofs run
    registries = {opened.spec.source.registry: opened.registry}
    remote = RegistryStore(Reference(target.registry, target.repository), registries.get(target.registry) or
                           registries.setdefault(target.registry, Registry(target.registry))) if target else None
    trust = release_trust(opts, remote)
    dists = python_distributions(opened.fs)
    with clock("proofs"):
        overlays = checked_overlays(project, opts, opened, log,
                                    prove_mod.SignedVerdicts(remote, trust, log) if remote and trust else None)
    verdicts = verdict_records(overlays.verdicts, remote)
    with clock("kernels"):
        kernels = compiled_kernels(project, overlays, toolchain, remote, trust, opts.recompile, log)
    tables = Tables.of(tuning_mod.load(Project(project).tuning))
    spec = dataclasses.replace(spec, env=spec.env + tuple(tuning_mod.env(tables.tables).items()))
    with clock("layers"):
        image = derived_image(opened, spec, source.revision, source.source_date_epoch, overlays, kernels, tables,
                              opts.out_dir / "blobs")
    rec = record.assemble(project, opts.lock_path, started, source, opened, dists, overlays, verdicts, kernels,
                          tables, image, spec)
    check_attestable(rec, (target or spec.repository).with_digest(image.derived.digest))
    with clock("push"):
        pushed, rec = publish(rec, image.derived, opts, target, registries, opened,
                              ([kernels.compiled.push] if kernels.compiled.push else []) + verdicts.pushes, log)
    log(clock.summary())
    return pushed or spec.repository.with_digest(image.derived.digest), rec


class StageClock:
    """Where a build's time went, said in its last log line (never in the record: it would no
    longer be the same for the same inputs). base: fetched, hashed, unpacked and checked; proofs:
    the overlays applied and proven (or their verdicts taken); kernels: compiled or taken; layers:
    written; push: the pushes and the outputs; other: the rest."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.spent: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str):
        began = time.monotonic()
        try:
            yield
        finally:
            self.spent[stage] = self.spent.get(stage, 0.0) + time.monotonic() - began

    def summary(self) -> str:
        total = time.monotonic() - self.started
        parts = [f"{stage} {seconds:.2f}s" for stage, seconds in self.spent.items()]
        return f"stage times: {', '.join(parts)}, other {total - sum(self.spent.values()):.2f}s; total {total:.2f}s"


def release_trust(opts: Options, remote: RegistryStore | None):
    """What a kernel artifact or proof verdict in the push target must carry to be taken (none
    without a push target: nothing is taken from a registry then)."""
    if remote is None:
        return None
    from ..trust import policy  # here: a build that takes nothing from a registry reads no policy

    return policy.release_signed(opts.policy_path, opts.project, opts.keys, remote.registry)


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


def verdict_records(verdicts: list, remote: RegistryStore | None) -> Verdicts:
    """Each verdict as the record names it, and the pushes of those proven here (to `remote`, the
    push target, where the sign job signs what the record names and later builds take them)."""
    records, pushes = [], []
    for overlay, side, v in verdicts:
        artifact = Reference.parse(v.artifact) if v.artifact else None
        if remote is not None and v.origin == "proven":
            artifact, push_one = prove_mod.verdict_artifact(remote, v)
            pushes.append(push_one)
        records.append(Verdict(overlay, side, v.key, v.verdict, v.origin, artifact))
    return Verdicts(tuple(records), pushes)


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
    from ..oci.transport import DOCUMENT_LIMIT
    from ..trust import attestations

    try:
        statements = attestations.statements(subject, record_file.read_back(rec))
    except (InputError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise IntegrityError(f"the build record cannot give its SBOM, provenance and VEX ({type(e).__name__}: "
                             f"{untrusted.safe(e)}): nothing pushed") from None
    for predicate, body in statements.items():
        signed = 4 * -(-len(body) // 3) + 4096  # the DSSE envelope: the payload in base64 (4 per 3, padded), a signature
        if signed > DOCUMENT_LIMIT:
            raise IntegrityError(f"the {attestations.NAMES[predicate]} would be about {signed} bytes signed, past the {DOCUMENT_LIMIT} a "
                                 f"registry serves back: nothing pushed (is some text of the base huge?)")


def write_layers(specs: list, epoch: int, blobs: Path) -> list:
    """One layer per (files, comment, deletions), None skipped, in order, compressed concurrently
    (zlib lets go of the GIL), or taken from the gzip cache where the same tar was compressed before."""
    specs = [s for s in specs if s is not None]
    kept = cache_dir("gzip")
    with ThreadPoolExecutor(len(specs)) as pool:
        return list(pool.map(lambda s: write_layer(s[0], epoch, blobs, s[1], deletions=s[2], kept=kept), specs))


def checked_overlays(project: Path, opts: Options, opened: OpenBase, log=print,
                     signed: prove_mod.SignedVerdicts | None = None) -> Overlays:
    """Registered overlays applied to the base, held to the lock and the stored stock bytes, and
    proven."""
    overlays, applied, stale = overlay_inputs(project, opened)
    locked = overlays_mod.read_lock(opts.lock_path)
    overlays_mod.verify_against_lock(applied, locked, str(opened.spec.image), opts.lock_path)
    overlays_mod.check_stock(project / "overlays", locked, opts.lock_path)
    proofs, verdicts = overlay_proofs(opened, applied, log, signed, opts.reprove)
    return Overlays(overlays, applied, stale, proofs, verdicts)


def compiled_kernels(project: Path, overlays: Overlays, toolchain: Reference, remote: RegistryStore | None, trust,
                     recompile: bool, log=print) -> Kernels:
    """hip/'s extensions the applied overlays are served by, from this machine's cache, a signed
    artifact in the push target, or compiled here; their push waits for the build's (defer_push)."""
    recipe = hip_mod.served(hip_mod.load(project / "hip"), {a.overlay.id for a in overlays.applied}, log)
    compiled = hip_compile.compile_recipe(recipe, toolchain, cache_dir(create=True) / "hip", log, remote, trust,
                                          recompile, defer_push=True)
    return Kernels(recipe, compiled, hip_mod.files(recipe, compiled.artifacts))


def derived_image(opened: OpenBase, spec, revision: str, epoch: int, overlays: Overlays, kernels: Kernels,
                  tables: Tables, blobs: Path) -> Image:
    """The layers over the base (kernels, tuning tables, overlays with their stale bytecode deleted,
    the entrypoint and in-image manifest), the config and the manifest; written under `blobs`."""
    overlay_files = overlays.files
    manifest_entry = image_mod.in_image_manifest(kernels.files + tables.files + overlay_files + spec.files)
    # and the __pycache__ beside each overlay, where Python looks for its bytecode (a link there would hide
    # the stale bytecode from our globs, which read the folder itself)
    caches = [str(PurePosixPath(f.path).parent / "__pycache__" / "-") for f in overlay_files]
    folders_are_folders(opened, [f.path for f in kernels.files + tables.files + overlay_files + spec.files +
                                 (manifest_entry,)] + list(overlays.stale) + caches)
    compiled = kernels.compiled
    layers = write_layers([
        (kernels.files, "kernels for " + kernels.recipe.arch + ": " + ", ".join(a.name for a in compiled.artifacts),
         ()),
        (tables.files, "AITER tuning tables: " + ", ".join(t.name for t in tables.tables), ()) if tables.files
        else None,
        (overlay_files, "overlays: " + ", ".join(a.overlay.id for a in overlays.applied), tuple(overlays.stale))
        if overlay_files else None,
        (spec.files + (manifest_entry,), "entrypoint, self-check and in-image manifest", ())], epoch, blobs)
    base = opened.image
    notes = image_mod.image_annotations(opened.spec.image.name, base, spec, revision, epoch)
    config = image_mod.derive_config(base, layers, spec, epoch, notes)
    config_desc = Descriptor.of(image_mod.OCI_CONFIG, config)
    manifest = image_mod.derive_manifest(base, config_desc, layers, notes)
    derived = Derived(base, opened.registry, manifest, config, config_desc, tuple(layers))
    write_blob(blobs / "sha256" / config_desc.digest.hex, config)
    write_blob(blobs / "sha256" / derived.digest.hex, manifest)
    return Image(derived, layers, notes)


def publish(rec: BuildRecord, derived: Derived, opts: Options, target: Reference | None, registries: dict,
            opened: OpenBase, pushes: list[Callable[[], object]], log=print) -> tuple[Reference | None, BuildRecord]:
    """The artifacts' pushes, then the image's (its tag last) and/or the layout, then the record
    with what was written: (the pushed name, the record)."""
    for push_one in pushes:
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
    return pushed, rec


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


