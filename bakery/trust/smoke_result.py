"""The signed smoke result: the in-toto test-result predicate `invoke smoke` writes (predicate) and
`invoke verify` reads back (SmokeResult.read), one model for both. The report inside is the gate's
(release/smoke_report.py SmokeReport.to_json()); what verify judges of it is typed here once. A
field may be absent (an older gate's result, or a hollow one): verify's checks say what each needs.
One present with the wrong type is refused, as the provenance's are."""

from __future__ import annotations

from dataclasses import dataclass

from .policy import SMOKE_SPEC
from .statement import Shape

AB_PATHS = ("dspark", "native")  # the serving paths the acceptance gate's A/B compares
REFERENCE_KINDS = ("seed-stack", "promoted", "endpoint")  # what the candidate may be compared with


def predicate(report: dict, spec_sha256: str) -> dict:
    """The test-result predicate of a gate's report: its verdict and checks, the sha256 of the smoke
    spec it ran and, where one was used, of the approval file, and the report whole."""
    configuration = [{"name": SMOKE_SPEC, "digest": {"sha256": spec_sha256}}]
    approvals = (report.get("ab") or {}).get("approvals_sha256")
    if approvals:
        configuration.append({"name": "approvals", "digest": {"sha256": approvals}})
    return {"result": report["result"], "passedTests": report["passed"], "failedTests": report["failed"],
            "warnedTests": [], "configuration": configuration, "report": report}


@dataclass(frozen=True)
class Host:
    """What the smoke's host said it is (release/smoke.py host_facts)."""
    gfx_arch: str | None
    compute_units: int | None
    driver_version: str | None
    rocm_version: str | None


@dataclass(frozen=True, eq=False)
class SmokeResult:
    """A test-result predicate as verify judges it."""
    result: str | None  # the predicate's verdict: PASSED passes
    report_result: str | None  # the report's own, which must say the same
    spec_sha256: str | None  # of the smoke spec it ran (configuration)
    compared: dict[str, int]  # A/B path -> outputs compared, where the A/B ran
    reference_kind: str | None  # what the candidate was compared with
    launched: dict[str, bool]  # side -> whether the gate launched its servers itself
    host: Host
    workflow_run: str | None  # REPO#RUN_ID of the release run it was part of
    finished: str
    run: int | None  # this runner's count of smoke runs: orders its results
    report: dict  # the report as signed (what verify prints of it)
    document: dict  # the predicate as signed

    @classmethod
    def read(cls, doc, what: str = "the smoke result") -> SmokeResult:
        shape = Shape(what)
        obj, typed = shape.obj, shape.typed

        def rows(value, where: str) -> list[dict]:
            return [obj(v, where) for v in shape.rows(value, where)]

        doc = obj(doc, "the predicate")
        report = obj(doc.get("report"), "the report")
        ran = [typed(obj(c.get("digest"), "a configuration digest").get("sha256"), str, "a configuration sha256")
               for c in rows(doc.get("configuration"), "the configuration")
               if typed(c.get("name"), str, "a configuration name") == SMOKE_SPEC]
        compared = {typed(r.get("path"), str, "an A/B path"): typed(r.get("compared"), int, "an A/B count")
                    for r in rows(obj(report.get("ab"), "the A/B").get("paths"), "the A/B paths")}
        host = obj(report.get("host"), "the host")
        return cls(
            typed(doc.get("result"), str, "the result"), typed(report.get("result"), str, "the report's result"),
            next(iter(ran), None),
            {path: n for path, n in compared.items() if path is not None and n is not None},
            typed(obj(report.get("reference"), "the reference").get("kind"), str, "the reference's kind"),
            {side: typed(v, bool, f"launched {side}") for side, v in obj(report.get("launched"), "launched").items()},
            Host(typed(host.get("gfx_arch"), str, "the host's gfx_arch"),
                 typed(host.get("compute_units"), int, "the host's compute_units"),
                 typed(host.get("driver_version"), str, "the host's driver_version"),
                 typed(host.get("rocm_version"), str, "the host's rocm_version")),
            typed(report.get("workflow_run"), str, "the workflow run"),
            typed(report.get("finished"), str, "finished") or "",
            typed(report.get("run"), int, "the run"), report, doc)

    @property
    def passed(self) -> bool:
        return self.result == "PASSED" and self.report_result == "PASSED"

    @property
    def ran_ab(self) -> bool:
        """Whether the gate ran its A/B against a reference on every path, each path's outputs compared."""
        return self.reference_kind in REFERENCE_KINDS and all(self.compared.get(p, 0) > 0 for p in AB_PATHS)

    @property
    def launched_both(self) -> bool:
        """The gate launched the candidate and the reference itself (no --endpoint on either side)."""
        return self.launched.get("candidate") is True and self.launched.get("reference") is True

    @property
    def summary(self) -> str:
        def shown(value, unsaid: str = "?"):
            return unsaid if value is None else value

        host = self.host
        return (f"{self.result} on {shown(host.gfx_arch, 'an unnamed GPU')}, {shown(host.compute_units)} CUs, "
                f"driver {shown(host.driver_version)}, ROCm {shown(host.rocm_version)}")
