"""What one acceptance-gate run found, judged and signed: what each server answered, the A/B per
path, the quality and speed figures against their thresholds, the verdict over every check, the
report as it is written and signed, and its in-toto test-result statement. Plain code but for
attach_report, which pushes the signed statement."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError
from ..trust.policy import SIGNATURE_FORMATS
from ..trust.provenance import TEST_RESULT_PREDICATE as TEST_RESULT
from .ab import Approvals, PathResult
from .smoke_spec import SmokeSpec, SpeedGate


@dataclass
class ServerRun:
    """One server of one side on one path: launched by the gate (a container) or started elsewhere
    (an endpoint), and what it answered. Filled in stage by stage; failure: the stage that stopped it."""
    side: str  # candidate | reference
    path: str  # dspark | native
    serves: str  # the image reference, or the endpoint URL
    launched: bool
    healthy: bool = False
    health: tuple[dict, ...] = ()
    failure: str | None = None
    arithmetic: str | None = None
    completions: list = field(default_factory=list)  # ab.Completion
    needles: dict | None = None
    tool_calls: dict | None = None
    speed: list[dict] = field(default_factory=list)  # gate.speed() of each gate
    acceptance: dict | None = None
    vram_high_water_bytes: int | None = None
    vram_error: str | None = None
    seconds: dict = field(default_factory=dict)  # stage -> seconds it took

    def to_json(self) -> dict:
        out = {"side": self.side, "path": self.path, "serves": self.serves, "launched": self.launched,
               "healthy": self.healthy, "health": list(self.health), "arithmetic": self.arithmetic,
               "completions": len(self.completions), "needles": self.needles, "tool_calls": self.tool_calls,
               "speed": self.speed,
               "acceptance": self.acceptance, "vram_high_water_bytes": self.vram_high_water_bytes,
               "seconds": self.seconds}
        if self.failure is not None:
            out["failure"] = self.failure
        if self.vram_error is not None:
            out["vram_error"] = self.vram_error
        return out


@dataclass(frozen=True)
class Reference:
    """What the candidate is compared with: the last promoted digest (verified), the seed-style stack
    (the pinned base with each baked file bind-mounted read-only), or servers started elsewhere."""
    kind: str  # promoted | seed-stack | endpoint
    image: str | None  # the digest it serves, where the gate knows it
    base: str | None  # its base digest: the A/B demands equal bytes only where it is the candidate's

    def to_json(self) -> dict:
        return {"kind": self.kind, "image": self.image, "base": self.base}


@dataclass(frozen=True)
class Check:
    """One named check of the verdict, its figure and threshold where it has them, and why it failed."""
    name: str
    ok: bool
    detail: str
    figure: float | None = None
    threshold: float | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, "figure": self.figure,
                "threshold": self.threshold}


def _speed_checks(spec: SmokeSpec, candidate: list[dict], reference: list[dict]) -> list[Check]:
    gates = {g.name: g for g in spec.speed.gates}
    theirs = {r["name"]: r for r in reference}
    checks = []
    for mine in candidate:
        gate: SpeedGate = gates[mine["name"]]
        figure, floor = mine["figure"], round(gate.threshold(spec.speed.tolerance), 3)
        better = figure >= floor if gate.higher_is_better else figure <= floor
        unit = "s" if gate.kind.endswith("_s") and not gate.kind.endswith("tok_s") else "tok/s"
        checks.append(Check(f"speed:{gate.name}", better, f"{figure:g} {unit} against {floor:g} (the seed's "
                            f"{gate.seed_figure:g} {'less' if gate.higher_is_better else 'plus'} "
                            f"{spec.speed.tolerance:.0%}; {gate.source})", figure, floor))
        errors, asked = mine.get("failed"), mine.get("prompts", gate.prompts)
        if errors != 0 or mine.get("completed") != asked:
            checks.append(Check(f"speed:{gate.name}:errors", False, f"{mine.get('completed')} of {asked} "
                                f"requests completed, {errors if errors is not None else 'an unknown count'} failed"))
        if gate.name in theirs:
            ref = theirs[gate.name]["figure"]
            slack = spec.speed.versus_reference_slack_s
            bound = ref * (1 - spec.speed.versus_reference) if gate.higher_is_better else \
                ref * (1 + spec.speed.versus_reference) + slack
            ok = figure >= bound if gate.higher_is_better else figure <= bound
            checks.append(Check(f"speed:{gate.name}:versus-reference", ok, f"{figure:g} {unit} against the "
                                f"reference's {ref:g} (at most {spec.speed.versus_reference:.0%} worse"
                                + ("" if gate.higher_is_better else f", plus {slack:g} s") + ")", figure,
                                round(bound, 3)))
    return checks


def verdict(spec: SmokeSpec, runs: list[ServerRun], reference: Reference, same_base: bool,
            ab: tuple[PathResult, ...] | None, ab_error: str | None) -> tuple[Check, ...]:
    """Every check of the gate. PASSED needs each to hold, the A/B to have run on every path, and
    every stage to have been reached."""
    checks = [Check(f"serve:{r.side}:{r.path}", r.failure is None, r.failure or f"{r.serves} answered every stage")
              for r in runs]
    served = {(r.side, r.path) for r in runs}
    for side in ("candidate", "reference"):
        for path in spec.paths:
            if (side, path) not in served:
                checks.append(Check(f"serve:{side}:{path}", False, "not reached"))
    if ab is None:
        checks.append(Check("ab", False, ab_error or "the A/B did not run"))
    else:
        for result in ab:
            first = result.unapproved[0].line() if result.unapproved else ""
            if same_base:
                checks.append(Check(f"ab:{result.path}", result.compared > 0 and not result.unapproved,
                                    f"{result.compared} outputs compared, {len(result.differing)} differ "
                                    f"({len(result.approved)} approved)" + (f"; first: {first}" if first else "")))
            else:
                checks.append(Check(f"ab:{result.path}", result.compared > 0,
                                    f"another base: {len(result.differing)} of {result.compared} outputs diverge "
                                    f"(not expected to match; the quality and speed gates decide)"))
    candidate = [r for r in runs if r.side == "candidate"]
    for r in candidate:
        if r.arithmetic is not None:
            checks.append(Check(f"arithmetic:{r.path}", "391" in r.arithmetic, f"17 * 23 answered {r.arithmetic[:40]!r}"))
        if r.needles is not None:
            n = r.needles
            checks.append(Check(f"needles:{r.path}", n["recalled"] == n["needles"],
                                f"{n['recalled']} of {n['needles']} needles recalled at {n['prompt_tokens']} prompt "
                                f"tokens" + (f" (missed at depths {n['missed_depths']})" if n["missed_depths"] else ""),
                                n["recalled"], n["needles"]))
        if r.failure is None or r.tool_calls is not None:
            t = r.tool_calls
            checks.append(Check(f"tool-calls:{r.path}", t is not None and t["matched"] >= spec.tool_calls.threshold,
                                f"{t['matched']} of {t['cases']} BFCL cases matched exactly ({t['harness']}), at least "
                                f"{spec.tool_calls.threshold} needed (the seed: {spec.tool_calls.seed_figure})"
                                if t is not None else "the tool-call stage did not run",
                                t["matched"] if t is not None else None, spec.tool_calls.threshold))
        if r.launched:
            high = r.vram_high_water_bytes
            checks.append(Check(f"vram:{r.path}", high is not None and high <= spec.vram_limit_bytes,
                                f"high-water {high} of {spec.vram_limit_bytes} bytes" if high is not None
                                else f"not read: {r.vram_error}", high, spec.vram_limit_bytes))
    mine = next((r for r in candidate if r.path == "dspark" and r.speed), None)
    theirs = next((r for r in runs if r.side == "reference" and r.path == "dspark" and r.speed), None)
    if "dspark" in spec.paths:
        if mine is None:
            checks.append(Check("speed", False, "the speed stage did not run on the candidate's dspark path"))
        else:
            checks += _speed_checks(spec, mine.speed, theirs.speed if theirs else [])
            accepted = (mine.acceptance or {}).get("accepted_per_draft") or 0.0
            ref_accepted = ((theirs.acceptance if theirs else None) or {}).get("accepted_per_draft")
            checks.append(Check("dspark-acceptance", accepted > 0 and (ref_accepted is None or accepted >= ref_accepted
                                * (1 - spec.speed.versus_reference)),
                                f"{accepted:g} accepted tokens per draft" + (f" against the reference's {ref_accepted:g}"
                                                                             if ref_accepted is not None else ""),
                                accepted, ref_accepted))
    return tuple(checks)


@dataclass(frozen=True)
class SmokeReport:
    """What one `invoke smoke` run found. Written beside the run and signed, as to_json() gives it,
    into the test-result attestation (verify reads a signed one as the untrusted JSON it is)."""
    image: str
    model: str
    revision: str
    host: dict  # host_facts()
    started: str
    run: int  # this runner's count of smoke runs: orders its results
    workflow_run: str | None
    reference: Reference
    same_base: bool
    launched_container: bool  # False: every server was an --endpoint started elsewhere
    servers: tuple[ServerRun, ...]
    ab: tuple[PathResult, ...] | None
    approvals: Approvals | None
    checks: tuple[Check, ...]
    budget_s: int
    finished: str

    @property
    def result(self) -> str:
        return "PASSED" if self.checks and all(c.ok for c in self.checks) else "FAILED"

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def to_json(self) -> dict:
        return {"image": self.image, "model": self.model, "revision": self.revision, "host": self.host,
                "started": self.started, "run": self.run, "workflow_run": self.workflow_run,
                "finished": self.finished, "result": self.result, "reference": self.reference.to_json(),
                "same_base": self.same_base, "launched_container": self.launched_container,
                "launched": {side: bool(runs) and all(r.launched for r in runs) for side, runs in (
                    ("candidate", [r for r in self.servers if r.side == "candidate"]),
                    ("reference", [r for r in self.servers if r.side == "reference"]))},
                "budget_s": self.budget_s,
                "ab": None if self.ab is None else {"paths": [r.to_json() for r in self.ab],
                                                    "approvals_sha256": self.approvals.sha256 if self.approvals else None},
                "checks": [c.to_json() for c in self.checks],
                "passed": [c.name for c in self.checks if c.ok], "failed": [c.name for c in self.failed],
                "servers": [s.to_json() for s in self.servers]}


def workflow_run() -> str | None:
    """The GitHub Actions run this smoke is part of (REPO#RUN_ID), signed with the result: the
    promote job of the same run asks for it, so a result of an earlier run put back is refused."""
    import os

    repo, run = os.environ.get("GITHUB_REPOSITORY"), os.environ.get("GITHUB_RUN_ID")
    return f"{repo}#{run}" if repo and run else None


def statement(ref, report: dict, spec_bytes: bytes) -> bytes:
    """The smoke report (SmokeReport.to_json()) as an in-toto test-result statement about the digest,
    naming the sha256 of the spec it ran (verify compares it with the pinned one) and, where one was
    used, of the approval file; the host's GPU facts and every figure are in the report."""
    import hashlib

    from ..trust import smoke_result
    from ..trust.statement import Statement

    if report.get("image") != str(ref):
        raise InputError(f"the smoke report is about {report.get('image')}, not {ref}")
    predicate = smoke_result.predicate(report, hashlib.sha256(spec_bytes).hexdigest())
    return Statement.about(ref, TEST_RESULT, predicate).raw


def attach_report(store, ref, report: dict, spec_bytes: bytes, signer,
                  formats: tuple[str, ...] = SIGNATURE_FORMATS) -> None:
    """Sign the smoke report onto the digest as an in-toto test-result attestation."""
    from ..trust import attest

    attest.attach(store, ref, {TEST_RESULT: statement(ref, report, spec_bytes)}, signer, formats)
