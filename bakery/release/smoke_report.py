"""What one smoke run found, judged and signed: the HTTP checks' answers, the verdict over every
check, the report as it is written and signed, and its in-toto test-result statement. Plain code
but for attach_report, which pushes the signed statement."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError
from ..trust.provenance import TEST_RESULT_PREDICATE as TEST_RESULT
from .smoke_spec import SmokeSpec


@dataclass(frozen=True)
class HttpChecks:
    """What the service answered after a healthy start."""
    models: str
    arithmetic: str
    prefill: dict  # prompt_tokens, seconds, tokens_per_s
    regression: tuple[dict, ...]  # prompt, seed, text, status: same | differs | unrecorded | recorded


@dataclass(frozen=True)
class Verdict:
    result: str  # PASSED | FAILED | RECORDED
    passed: tuple[str, ...]
    failed: tuple[str, ...]
    compared: int  # regression outputs compared with a committed expectation


def verdict(healthy: bool, http: HttpChecks | None, vram_high_water: int | None, spec: SmokeSpec) -> Verdict:
    """PASSED only if every check holds and every regression output was compared with a committed
    expectation (and matched); a recording run is RECORDED, never PASSED."""
    cases = http.regression if http else ()
    recorded = any(r["status"] == "recorded" for r in cases)
    regression_ok = bool(cases) and (all(r["status"] == "recorded" for r in cases) if recorded
                                     else all(r["status"] == "same" for r in cases))
    checks = [("health", healthy), ("http", http is not None), ("regression", regression_ok),
              ("vram", vram_high_water is not None and vram_high_water <= spec.vram_limit_bytes)]
    passed, failed = tuple(n for n, ok in checks if ok), tuple(n for n, ok in checks if not ok)
    result = "FAILED" if failed else "RECORDED" if recorded else "PASSED"
    return Verdict(result, passed, failed, sum(1 for r in cases if r["status"] in ("same", "differs")))


@dataclass(frozen=True)
class SmokeReport:
    """What one `invoke smoke` run found. Written beside the run and signed, as to_json() gives it,
    into the test-result attestation (verify reads a signed one as the untrusted JSON it is). A part
    the run did not reach (the HTTP checks after a failed start, say) is absent from the JSON."""
    image: str
    model: str
    revision: str
    host: dict  # host_facts()
    started: str
    run: int  # this runner's count of smoke runs: orders its results
    workflow_run: str | None
    health: tuple[dict, ...]  # each health signal seen: signal, seconds, line
    healthy: bool
    http: HttpChecks | None
    failure: str | None
    vram_high_water_bytes: int | None
    vram_limit_bytes: int
    vram_error: str | None
    finished: str
    verdict: Verdict

    @property
    def result(self) -> str:
        return self.verdict.result

    def to_json(self) -> dict:
        out = {"image": self.image, "model": self.model, "revision": self.revision, "host": self.host,
               "started": self.started, "run": self.run, "workflow_run": self.workflow_run,
               "health": list(self.health), "vram_high_water_bytes": self.vram_high_water_bytes,
               "vram_limit_bytes": self.vram_limit_bytes, "finished": self.finished, "result": self.verdict.result,
               "passed": list(self.verdict.passed), "failed": list(self.verdict.failed),
               "regression_compared": self.verdict.compared}
        if self.healthy:
            out["health_ok"] = True
        if self.http:
            out.update(models=self.http.models, arithmetic=self.http.arithmetic, prefill=self.http.prefill,
                       regression=list(self.http.regression), http_ok=True)
        if self.failure is not None:
            out["failure"] = self.failure
        if self.vram_error is not None:
            out["vram_error"] = self.vram_error
        return out


def workflow_run() -> str | None:
    """The GitHub Actions run this smoke is part of (REPO#RUN_ID), signed with the result: the
    promote job of the same run asks for it, so a result of an earlier run put back is refused."""
    import os

    repo, run = os.environ.get("GITHUB_REPOSITORY"), os.environ.get("GITHUB_RUN_ID")
    return f"{repo}#{run}" if repo and run else None


def statement(ref, report: dict, spec_bytes: bytes) -> bytes:
    """The smoke report (SmokeReport.to_json()) as an in-toto test-result statement about the digest,
    naming the sha256 of the spec it ran (verify compares it with the pinned one) and the host's GPU
    facts (in the report)."""
    import hashlib

    from ..trust import policy, provenance

    if report.get("image") != str(ref):
        raise InputError(f"the smoke report is about {report.get('image')}, not {ref}")
    predicate = {"result": report["result"], "passedTests": report["passed"], "failedTests": report["failed"],
                 "warnedTests": [], "configuration": [{"name": policy.SMOKE_SPEC,
                                                      "digest": {"sha256": hashlib.sha256(spec_bytes).hexdigest()}}],
                 "report": report}
    return provenance.statement(ref, TEST_RESULT, predicate)


def attach_report(store, ref, report: dict, spec_bytes: bytes, signer) -> None:
    """Sign the smoke report onto the digest as an in-toto test-result attestation."""
    from ..trust import attest

    attest.attach(store, ref, {TEST_RESULT: statement(ref, report, spec_bytes)}, signer)
