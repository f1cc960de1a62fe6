"""Every table and line the tasks print: one place, so output stays the same when code moves.
Anything a registry writer, a base or a rebuilt revision chose is shown inert (untrusted.safe)."""

from __future__ import annotations

from ..untrusted import safe


def lines(rows) -> str:
    return "\n".join(rows)


def lock_entries(lock) -> list[str]:
    return [f"  {e.id:<45} base {(e.base_sha256 or 'new file')[:12]}  result {e.result_sha256[:12]}"
            for e in lock.overlays]


def proven(p) -> str:
    """`invoke prove`: a kit's one verdict, or the table of every overlay's proof."""
    if p.kit is not None:
        return f"ours.py: {p.kit.verdict} ({p.kit.reason})"
    rows, device = p.rows, p.device
    width = max(len(r.overlay.id) for r in rows)
    checks = max(len(r.overlay.proof.script.name) if r.overlay.proof.script else 8 for r in rows) + len(device) + 3
    out = [f"{'overlay':<{width}}  {'stock':<13} {'overlaid':<13} {'check':<{checks}} {'seconds':>7}  detail"]
    for r in rows:
        script = r.overlay.proof.script
        over = r.stock.verdict if script is None else (r.overlaid.verdict if r.overlaid else "(audit)")
        ran_on = r.stock.measured.get("ran_on", device)  # the fence's model and SwiGLU's torch run on the CPU
        check = f"{script.name} ({ran_on})" if script else "hardware"
        seconds = r.stock.seconds + (r.overlaid.seconds if r.overlaid else 0)
        detail = r.overlay.proof.hardware if script is None else (r.overlaid.reason if r.overlaid else r.stock.reason)
        out.append(f"{r.overlay.id:<{width}}  {r.stock.verdict:<13} {over:<13} {check:<{checks}} {seconds:>7.1f}  "
                   f"{safe(detail)}")
    return lines(out)


def rebased(r) -> str:
    width = max(len(row.overlay.id) for row in r.rows)
    out = [f"{'overlay':<{width}}  {'status':<34} {'required':<8}  detail"]
    out += [f"{row.overlay.id:<{width}}  {row.status:<34} {'yes' if row.overlay.baked else 'no':<8}  {safe(row.detail)}"
            for row in r.rows]
    return lines(out)


def rebased_next(r) -> str:
    return f"lock written for {r.base}: now set image: in image/base.yaml to it and commit overlays/ and the lock"


def tracked(t) -> str:
    return f"{t.ledger}: {t.kept} nightlies kept" + ("" if t.changed else " (unchanged)")


def bumped(b) -> str:
    if b.result is None:
        return "nothing new: every kept nightly newer than the pin has been tried"
    n = b.result.nightly
    if b.result.carried:
        return (f"bumped to {n.label()} {n.digest} (vLLM {n.vllm}): every overlay carried and proven; review and "
                f"commit image/base.yaml, overlays/ and {b.ledger}; report: {b.report}")
    return (f"{n.label()} {n.digest} (vLLM {n.vllm}) needs porting; pin, lock and patches unchanged; kits in "
            f"{b.kits}; report: {b.report}")


def attested(ref, written: dict) -> list[str]:
    """What `invoke attest` wrote, for the log."""
    from ..oci import store

    out = []
    if "bundle" in written.get("formats", ()):
        out.append(f"bundles     the signature and each attestation, as referrers listed via {written['bundles']}")
    if "tag" in written.get("formats", ()):
        out += [f"signature   {store.signature_tag(ref.digest, 'sig')} -> {written['signature']}",
                f"attestations {store.signature_tag(ref.digest, 'att')} -> {written['attestations']}"]
    if written.get("kernels"):
        out.append(f"kernel artifact {written['kernels']['artifact']} signed -> {written['kernels']['signature']}")
    out += [f"proof verdict {v['artifact']} signed -> {v['signature']}" for v in written.get("verdicts") or []]
    return out


def attached(ref, kind: str, digest) -> str:
    from ..oci import store

    return f"{kind} attached: {store.signature_tag(ref.digest, 'att')} -> {digest}"


def node_policy(p) -> list[str]:
    """The files written, and what nodes cannot check, for the log."""
    out = [f"  {name}" for name in p.files]
    if p.unenforced:
        out.append(f"note: nodes check the release signature only, not {p.unenforced}: run `invoke verify` (or "
                   f"`invoke deploy`, which does) on a digest before nodes may pull it")
    return out


def verified(v) -> str:
    """Each check and the summary; a check may quote what a registry writer chose."""
    report = v.report
    out = [f"{'ok  ' if ok else 'FAIL'} {safe(what, limit=2000)}" for ok, what in report.checks]
    out += [f"{k}: {safe(', '.join(map(str, val)) if isinstance(val, list) else val, limit=2000)}"
            for k, val in report.summary.items()]
    if report.smoke is not None:
        from bakery.release import step_summary

        out += step_summary.lines(report.smoke)
    return lines(out)


def reproduced(r) -> str:
    """A match in one line, or each differing layer and file (the rebuilt revision's paths, inert)."""
    if r.matches:
        return f"reproduced {r.ref}: the rebuild of {r.plan.repository}@{r.plan.revision[:12]} is byte-identical"
    out = []
    for d in r.diffs:
        out.append(f"layer {d['layer']} differs: original {safe(d['original'])}, rebuilt {safe(d['rebuilt'])}")
        out += [f"  {safe(f['path'])}: original {safe(f['original'] or '(absent)')}, "
                f"rebuilt {safe(f['rebuilt'] or '(absent)')}" for f in d["files"]]
        if "same_as_layer" in d:
            out.append(f"  the same rebuilt layer as layer {d['same_as_layer']}")
        if d.get("more_files"):
            out.append(f"  and {d['more_files']:,} more files differ")
    return lines(out)


def reproduced_attestation(r) -> str | None:
    if r.attested_as is None:
        return None
    return f"attested the rebuild ({'match' if r.matches else 'other bytes'}) as rebuilder {r.attested_as[:12]}"


def rebuild_attested(ref, digest) -> str:
    return f"attested: the rebuild of {ref.digest} gave {digest} ({'match' if digest == ref.digest else 'other bytes'})"


def smoked_log(s) -> list[str]:
    from bakery.release import step_summary

    out = list(step_summary.lines(s.result.to_json()))
    if s.summary:
        out.append(f"wrote the run's summary to {s.summary}")
    if s.attested and s.attested.startswith("envelope "):
        out.append(f"smoke attestation ({s.result.result}) signed into {s.attested.removeprefix('envelope ')}: "
                   f"attach it with `invoke attach`")
    elif s.attested:
        out.append(f"smoke attestation ({s.result.result}) attached to {s.ref}")
    return out


def smoked(s) -> str:
    """The verdict, the reference, and the A/B count per path."""
    report = s.result.to_json()
    paths = ", ".join(f"{r['path']} {r['compared'] - r['differing']}/{r['compared']} same"
                      for r in (report["ab"] or {}).get("paths", []))
    return f"{report['result']} {s.ref} against {report['reference']['kind']}" + (f" ({paths})" if paths else "")


def compiled(c) -> tuple[list[str], str]:
    """(the log lines, stdout): each output's sha256 and where it goes."""
    if c.verified:
        return [], lines(f"{sha}  {name}  byte-identical when compiled again" for sha, name in c.outputs)
    log = [f"kernels {c.origin}" + (f"; artifact {c.artifact}" if c.artifact else "")]
    log += [f"  {a.name}: {a.arch}, kernels {', '.join(a.code_objects[0]['kernels'])}; {a.toolchain}"
            for a in c.artifacts]
    return log, lines(f"{sha}  {dest}" for sha, dest in c.outputs)


def disk(d) -> str:
    if d.cached:
        name, tag = d.cached
        return (f"ok: {name}:{tag[:20]}... holds the kernels, signed by a release key; nothing will be compiled, "
                f"no toolchain file taken out")
    return (f"ok: the toolchain's files of {d.toolchain} take {d.needed / 2**30:.1f} GiB ({d.how}) at {d.where}; "
            f"{d.free / 2**30:.1f} GiB free there")


def rehearsed(r) -> str:
    out = [r.outcome.table()]
    if r.outcome.image:
        out.append(f"candidate: {r.outcome.image}")
    return lines(out)


def pruned(p) -> list[str]:
    """The plan as a table (each manifest: kept or deleted, what it is, its size, why), then the total."""
    rows = [f"{'':<7} {'kind':<11} {'MB':>8}  {'manifest':<40} why"]
    for d in p.decisions:
        s = d.stored
        rows.append(f"{'keep' if d.keep else 'delete':<7} {s.kind:<11} {s.bytes / 1e6:>8.1f}  "
                    f"{(s.repo + '@' + s.digest.hex[:12]):<40} {s.label()}: {d.why}")
    gone = sum(1 for d in p.decisions if not d.keep)
    done = f"deleted {p.deleted}" if p.deleted is not None else "a dry run: --apply deletes them"
    freed = (f"{p.reclaimable / 1e6:.1f} MB of blobs no kept manifest reaches, " +
             ("removed" if p.deleted is not None else "removed with --apply")) if p.layout else \
        f"up to {p.reclaimable / 1e6:.1f} MB freed once the registry collects garbage"
    rows.append(f"{len(p.decisions)} manifests: {len(p.decisions) - gone} kept, {gone} to delete ({done}); {freed}")
    return rows
