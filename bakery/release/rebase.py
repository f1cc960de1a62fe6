"""`invoke prove` and `invoke rebase`: decide with each overlay's proof, not with patch text.

prove: every overlay's proof on the base's stock target and on the overlaid one.
rebase: per required overlay, the new base's stock first (FIXED there: fixed upstream), then every
way to carry the overlay (exact, offset, known port, 3-way merge from the stock bytes the lock
names, kept in overlays/stock/), each proven on the new base; the first that proves FIXED wins.
The lock, the patches and the stock bytes are written only when every required overlay is carried.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from ..bake.opened import base_files, open_base, probe_files
from ..bake.options import Options
from ..errors import BakeryError, InputError
from ..files import rewrite
from ..inputs import overlays as overlays_mod, patch as patch_mod
from ..inputs.overlays import Overlay
from ..project import Project
from ..proofs import gate, runner as prove


class Outcome(enum.Enum):
    """What rebase made of one overlay on the new base (the value is what it prints)."""
    PROVEN = "proven"  # carried, and its proof says FIXED on the new base
    NOT_PROVEN_HERE = "not proven here"  # carried exactly; its proof needs hardware this host lacks
    FIXED_UPSTREAM = "fixed-upstream"  # the new base's own code proves FIXED
    NEEDS_PORTING = "needs porting"
    TARGET_MOVED = "target moved"
    AUDIT_HOLDS = "audit holds"  # an audit record whose probe still holds
    AUDIT_CHANGED = "audit changed: re-check"
    BY_HAND = overlays_mod.BY_HAND  # an audit record with no probe


@dataclass(frozen=True)
class Status:
    """An outcome and, for one that carried the patch, how (exact, offset, known port, merged)."""
    outcome: Outcome
    how: str | None = None

    def __str__(self) -> str:
        return f"ported ({self.how}), {self.outcome.value}" if self.how else self.outcome.value

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    @property
    def carried(self) -> bool:
        return self.outcome in (Outcome.PROVEN, Outcome.NOT_PROVEN_HERE, Outcome.FIXED_UPSTREAM)


FIXED_UPSTREAM, NEEDS_PORTING, TARGET_MOVED = (Status(Outcome.FIXED_UPSTREAM), Status(Outcome.NEEDS_PORTING),
                                               Status(Outcome.TARGET_MOVED))
AUDIT_HOLDS, AUDIT_CHANGED, BY_HAND = Status(Outcome.AUDIT_HOLDS), Status(Outcome.AUDIT_CHANGED), Status(Outcome.BY_HAND)


@dataclass(frozen=True)
class ProofRow:
    overlay: Overlay
    stock: prove.Verdict
    overlaid: prove.Verdict | None  # None for an audit record (nothing is overlaid)

    @property
    def ok(self) -> bool:
        """A required overlay holds to the proof gate (proofs/gate.py); an audit record bakes nothing."""
        return not self.overlay.baked or gate.judge(self.overlay.proof, self.stock, self.overlaid).proven


def _reads(base, overlays: list[Overlay]) -> dict:
    """The overlays' targets and what their proofs read, from the base."""
    return base_files(base, [o.target for o in overlays] + [r for o in overlays if o.proof for r in o.proof.reads])


def prove_base(opts: Options, log=print) -> list[ProofRow]:
    """`invoke prove`: each overlay's proof on the base's stock target and on the overlaid target."""
    project = opts.project.resolve()
    base = open_base(project, opts.base, log)
    registered = [o for o in overlays_mod.load(Project(project).overlays_yaml) if o.proof]
    files = _reads(base, registered)
    jobs: dict[tuple[str, str], tuple | None] = {}  # None: the patch does not apply
    for o in registered:
        stock = files.get(o.target)
        if stock is None:
            continue
        jobs[(o.id, "stock")] = (o.proof, stock, files)
        if o.baked:
            o = o.for_target(stock)
            try:
                jobs[(o.id, "overlaid")] = (o.proof, patch_mod.apply(o.parsed(), stock)[0], files)
            except patch_mod.PatchConflict as e:
                jobs[(o.id, "overlaid")] = None
                log(f"{o.id}: the patch does not apply to this base ({e}); run `invoke rebase`")
    log(f"running {sum(1 for j in jobs.values() if j and j[0].script)} proofs on {len(registered)} overlays")
    verdicts = prove.run_many({k: j for k, j in jobs.items() if j}, opts.device)
    missing = prove.Verdict(prove.CANNOT, "the target is not in this base")
    no_patch = prove.Verdict(prove.CANNOT, "the patch does not apply to this base: run `invoke rebase`")
    return [ProofRow(o, verdicts.get((o.id, "stock"), missing),
                     (verdicts.get((o.id, "overlaid"), no_patch if (o.id, "overlaid") in jobs else missing)
                      if o.baked else None))
            for o in registered]


# -- rebase ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RebaseRow:
    overlay: Overlay
    status: Status
    detail: str
    result: bytes | None = None  # the overlaid bytes for the new base, when carried
    new_stock: bytes | None = None

    @property
    def carried(self) -> bool:
        return self.status.carried


def _old_stock(project: Path, overlay: Overlay, lock: overlays_mod.Lock | None) -> bytes | None:
    entry = lock.entry(overlay.id) if lock else None
    if entry is None or not entry.base_sha256:
        return None
    return overlays_mod.read_stock(project / "overlays", entry.base_sha256)


def _decide(overlay: Overlay, new: bytes | None, old: bytes | None, files: dict, out: Path, log,
            project: Path) -> RebaseRow:
    """One required overlay on the new base's bytes."""
    if new is None:
        return RebaseRow(overlay, NEEDS_PORTING, "the target is not in the new base (moved or removed upstream?)")
    spec = overlay.proof
    if spec is not None and spec.script is not None:
        stock = prove.run(spec, new, files)
        log(f"  {overlay.id}: stock {stock.verdict} ({stock.reason})")
        if stock.verdict == prove.FIXED:
            return RebaseRow(overlay, FIXED_UPSTREAM, f"the new base's own code proves FIXED by "
                                                      f"{spec.script.name}: {stock.reason}", None, new)
    found, conflicted = overlays_mod.candidates(overlay, new, old)
    tried = []
    for how, result in found:
        if spec is None or spec.script is None:  # nothing here can check it: only bytes a person wrote
            why = (spec.hardware or "no proof runs here") if spec else "the overlay has no proof"
            if how not in (overlays_mod.EXACT, overlays_mod.KNOWN_PORT):
                tried.append(f"{how}: not taken, no proof runs here ({why}), so only the patch or a committed "
                             f"port applied exactly may carry it")
                continue
            log(f"  {overlay.id}: {how}; not proven here ({why})")
            return RebaseRow(overlay, Status(Outcome.NOT_PROVEN_HERE, how), why, result, new)
        verdict = prove.run(spec, result, files)
        log(f"  {overlay.id}: {how} -> {verdict.verdict} ({verdict.reason})")
        if verdict.verdict == prove.FIXED:
            return RebaseRow(overlay, Status(Outcome.PROVEN, how), f"{spec.script.name}: {verdict.reason}", result, new)
        tried.append(f"{how}: {verdict.verdict} by {spec.script.name}")
    where = _write_porting_kit(out / overlay.id, overlay, new, old, conflicted or (found[0][1] if found else None),
                               files, project)
    return RebaseRow(overlay, NEEDS_PORTING, "; ".join(tried + (["merge: conflicts"] if conflicted else []))
                     + f"; edit {where / 'ours.py'}, then run {where / 'prove.sh'}", None, new)


def _write_porting_kit(folder: Path, overlay: Overlay, new: bytes, old: bytes | None, draft: bytes | None,
                       files: dict, project: Path) -> Path:
    """out/rebase/<id>/: the new stock file, ours (a draft to edit: the merge with its conflict
    markers, or the best candidate), the old stock, the other files the proof reads, and the
    command that re-runs the proof."""
    folder.mkdir(parents=True, exist_ok=True)
    read_names = [f"{i}-{Path(r).name}" for i, r in enumerate(overlay.proof.reads if overlay.proof else ())]
    for r, name in zip(overlay.proof.reads if overlay.proof else (), read_names, strict=True):  # numbered: names repeat
        if files.get(r) is not None:
            (folder / "reads").mkdir(exist_ok=True)
            (folder / "reads" / name).write_bytes(files[r])
    (folder / "stock.py").write_bytes(new)
    (folder / "ours.py").write_bytes(draft if draft is not None else new)
    if old is not None:
        (folder / "old-stock.py").write_bytes(old)
    # ours.py is the new base's code with our edits: it runs only in the sandbox, through bakery
    (folder / "prove.sh").write_text(
        "#!/bin/sh\n# re-run the overlay's proof on ours.py after editing it (in bakery's sandbox: it is the\n"
        "# new base's code); then save it as the patch with\n"
        f"#   diff -u stock.py ours.py, paths a/{overlay.relative} b/{overlay.relative}\n"
        f"kit=$(cd \"$(dirname \"$0\")\" && pwd)\n"
        f"cd {shlex.quote(str(project))} && exec {shlex.quote(sys.executable)} -m invoke prove --kit \"$kit\"\n")
    (folder / "prove.sh").chmod(0o755)
    return folder


def prove_kit(project: Path, folder: Path) -> prove.Verdict:
    """`invoke prove --kit out/rebase/ID`: the overlay's proof on the kit's ours.py (the new base's
    code with a person's edits), with the files the kit kept of the new base, in the sandbox."""
    folder = folder.resolve()
    registered = {o.id: o for o in overlays_mod.load(Project(project).overlays_yaml)}
    overlay = registered.get(folder.name)
    if overlay is None or not (folder / "ours.py").is_file():
        raise InputError(f"{folder} is not a porting kit of this project (out/rebase/OVERLAY-ID/ with ours.py)")
    spec = overlay.proof
    if spec is None or spec.script is None:
        raise InputError(f"{overlay.id} has no proof that runs here ({spec.hardware if spec else 'none registered'}): "
                         f"check ours.py on the hardware")
    reads = {}  # one not kept is missing: the proof says so (CANNOT-PROVE)
    for i, path in enumerate(spec.reads):
        kept = folder / "reads" / f"{i}-{Path(path).name}"
        if kept.is_file():
            reads[path] = kept.read_bytes()
    return prove.run(spec, (folder / "ours.py").read_bytes(), reads)


def rebase(opts: Options, log=print, retire: bool = True, before_commit=None) -> tuple[list, bool]:
    """`invoke rebase --base NEW@DIGEST`: rows for every overlay; lock only if all required carried.
    retire=False: an overlay the new base's own code proves fixed is not retired but left for a
    person (it stops the re-lock, as needs porting does). before_commit(rows): called once all are
    carried, before the first file of the checkout is written."""
    project = opts.project.resolve()
    base = open_base(project, opts.base, log, opts.base_mirror)
    registered = overlays_mod.load(Project(project).overlays_yaml)
    required = [o for o in registered if o.baked]
    files = _reads(base, required)
    try:
        old_lock = overlays_mod.read_lock(opts.lock_path)
    except BakeryError as e:  # no lock yet, or an unreadable one: rebase then works without the old side
        old_lock = None
        if opts.lock_path.exists():
            log(f"warning: the old lock is not used ({e}); overlays are carried without its stock bytes")
    out = opts.out_dir / "rebase"
    rows = []
    for n, o in enumerate(required, 1):
        log(f"[{n}/{len(required)}] {o.id}")
        old = _old_stock(project, o, old_lock)
        new = files.get(o.target)
        rows.append(_moved(base, o, old) if new is None else _decide(o, new, old, files, out, log, project))
    ok = all(r.carried and (retire or r.status != FIXED_UPSTREAM) for r in rows)
    audit = audit_rows(base, registered)
    if ok:
        if before_commit is not None:
            before_commit(rows + audit)
        _commit(project, opts, str(base.spec.image), rows, old_lock, log)
    return rows + audit, ok


def _moved(base, overlay: Overlay, old: bytes | None) -> RebaseRow:
    """The target is not at its path in the new base: where did it go? The files of the same name
    under the same package, the one most like the old stock bytes first. Nothing is carried: the
    overlay must be registered at its new path (a person checks it is the same code)."""
    path = overlay.target
    package = re.match(r"(.*?-packages/[^/]+/)", path)
    pattern = (package.group(1) if package else path.rsplit("/", 1)[0] + "/") + "*/" + path.rsplit("/", 1)[1]
    candidates = [p if p.startswith("/") else "/" + p for p in base.fs.glob(pattern.lstrip("/"))]
    found = base_files(base, candidates)
    like = sorted(((difflib.SequenceMatcher(None, old or b"", data, autojunk=False).quick_ratio(), p)
                   for p, data in found.items() if data is not None), reverse=True)
    if not like:
        return RebaseRow(overlay, TARGET_MOVED, f"{path} is not in the new base, nor any file of its name under "
                                                f"{pattern.rsplit('*', 1)[0]} (removed upstream?)")
    (ratio, where), others = like[0], [p for _, p in like[1:]]
    return RebaseRow(overlay, TARGET_MOVED, f"{path} is not in the new base; a file of its name is at {where}"
                     + (f" ({ratio:.0%} like the old stock)" if old else "")
                     + (f", others at {', '.join(others)}" if others else "")
                     + ": if it is the same code, set target: to it in overlays.yaml and run invoke rebase again")


def audit_rows(base, registered: list[Overlay]) -> list[RebaseRow]:
    """The audit records (no patch baked): each probe run on the new base; what stays by hand says so."""
    records = [o for o in registered if not o.baked]
    files = probe_files(base.fs, [c["path"] for o in records for c in o.probe])
    rows = []
    for o in records:
        by_hand = f"; by hand: {o.by_hand}" if o.by_hand else ""
        if not o.probe:
            rows.append(RebaseRow(o, BY_HAND, f"recorded {o.status}, no probe{by_hand or '; see overlays.yaml'}"))
            continue
        holds, detail = overlays_mod.probe_holds(o, files)
        rows.append(RebaseRow(o, AUDIT_HOLDS if holds else AUDIT_CHANGED, f"{o.status}: {detail}{by_hand}"))
    return rows


def _commit(project: Path, opts: Options, base_ref: str, rows: list[RebaseRow], old_lock, log) -> None:
    """Everything proven: rewrite the patches against the new base (the old one stays as a port of
    the old bytes), mark what upstream fixed, keep the stock bytes, write the lock."""
    folder = project / "overlays"
    entries = []
    for row in rows:
        o = row.overlay
        old = old_lock.entry(o.id) if old_lock else None
        old_sha = old.base_sha256 if old else None
        assert row.new_stock is not None  # every row here was carried or fixed upstream: it has the new bytes
        new_sha = overlays_mod.store_stock(folder, row.new_stock)
        if row.status == FIXED_UPSTREAM:
            _mark_fixed_upstream(folder / "overlays.yaml", o.id, base_ref)
            log(f"  {o.id}: fixed upstream in {base_ref}: recorded as already-upstream, no longer baked")
            continue
        assert row.result is not None  # carried: the overlaid bytes for the new base
        patch_bytes = patch_mod.unified_diff(row.new_stock, row.result, o.relative)
        if row.status.how != overlays_mod.EXACT and o.for_target(row.new_stock) is o:
            assert o.patch_path is not None and o.patch_bytes is not None  # a carried overlay bakes a patch
            if old_sha and not any(sha == old_sha for sha, _, _ in o.ports):
                port = folder / overlays_mod.PORTS / o.id / f"{old_sha}.patch"
                port.parent.mkdir(parents=True, exist_ok=True)
                rewrite(port, o.patch_bytes)  # the old base's patch stays, chosen by its bytes
            rewrite(o.patch_path, patch_bytes)  # whole or not at all: a kill here is finished by a rerun
            o = dataclasses.replace(o, patch_bytes=patch_bytes)
        chosen = o.for_target(row.new_stock)
        entries.append(overlays_mod.Applied(chosen, new_sha, row.result, row.new_stock).lock_entry())
    overlays_mod.write_lock(opts.lock_path, overlays_mod.Lock.of(base_ref, entries))


def _mark_fixed_upstream(registry: Path, overlay_id: str, base_ref: str) -> None:
    """Edit the one entry in place (comments and layout of overlays.yaml stay as they are)."""
    text = registry.read_text()
    start = text.index(f"  - id: {overlay_id}\n")
    end = text.find("\n  - id: ", start + 1)
    end = len(text) if end < 0 else end
    block = re.sub(r"\n    status: required\n", f"\n    status: already-upstream\n    note: >-\n      fixed upstream in "
                   f"{base_ref} (its own code proves FIXED; found by invoke rebase)\n", text[start:end], count=1)
    rewrite(registry, (text[:start] + block + text[end:]).encode())
