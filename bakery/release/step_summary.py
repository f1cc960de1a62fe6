"""What the acceptance gate decided, for people: lines for the terminal and verify, and a Markdown
page for the run's summary on GitHub ($GITHUB_STEP_SUMMARY). Read from a report as to_json() gives
it, or as a signed one is read back (untrusted: every value is shown inert, and a missing one as ?)."""

from __future__ import annotations

from .. import untrusted


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _rows(report: dict, key: str) -> list[dict]:
    value = report.get(key) if isinstance(report, dict) else None
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _ab_rows(report: dict) -> list[dict]:
    ab = report.get("ab") if isinstance(report, dict) else None
    return _rows(ab, "paths") if isinstance(ab, dict) else []


def _t(value, sink: str = "terminal", limit: int = 160) -> str:
    return "?" if value is None else untrusted.safe(value, sink=sink, limit=limit)


def lines(report: dict) -> list[str]:
    """One line per A/B path and per check: what verify prints of a signed result, and `invoke smoke` of its run."""
    ref = _mapping(report.get("reference"))
    out = [f"smoke {_t(report.get('result'))} against the {_t(ref.get('kind'))} reference "
           f"{_t(ref.get('image') or '(servers started elsewhere)')}; "
           f"{'same base' if report.get('same_base') else 'another base'}; "
           f"{_launched(report)}"]
    approvals = (report.get("ab") or {}).get("approvals_sha256") if isinstance(report.get("ab"), dict) else None
    for row in _ab_rows(report):
        out.append(f"  A/B {_t(row.get('path'))}: {_t(row.get('compared'))} compared, {_t(row.get('differing'))} differ, "
                   f"{_t(row.get('approved'))} approved" + (f" (approvals sha256:{_t(approvals)})" if approvals else ""))
    for check in _rows(report, "checks"):
        mark = "ok  " if check.get("ok") is True else "FAIL"
        out.append(f"  {mark} {_t(check.get('name'), limit=60)}: {_t(check.get('detail'))}")
    return out


def _launched(report: dict) -> str:
    """Which sides the gate started itself; a side at endpoints was started by someone else."""
    launched = _mapping(report.get("launched"))
    sides = [side for side in ("candidate", "reference") if launched.get(side) is True]
    if not sides:
        return "launched no container (both sides at endpoints started elsewhere)"
    return f"launched the {' and the '.join(sides)}" + ("" if len(sides) == 2 else
                                                         f" (the {'reference' if sides == ['candidate'] else 'candidate'} "
                                                         f"at endpoints started elsewhere)")


def _bar(figure, threshold, width: int = 20) -> str:
    """A small chart: the figure against its threshold, the threshold at the bar's middle."""
    if not isinstance(figure, (int, float)) or not isinstance(threshold, (int, float)) or threshold <= 0:
        return ""
    filled = max(0, min(width, round(width / 2 * figure / threshold)))
    return "`" + "█" * filled + "░" * (width - filled) + "`"


def smoke(report: dict) -> str:
    """The Markdown page: candidate, reference, the A/B per path, each figure against its threshold
    with a bar, the needles, and the verdict."""
    md = "markdown"
    ref = _mapping(report.get("reference"))
    out = [f"## MI300X acceptance gate: {_t(report.get('result'), md)}", "",
           f"- candidate: `{_t(report.get('image'), md)}`",
           f"- reference: {_t(ref.get('kind'), md)} `{_t(ref.get('image') or 'servers started elsewhere', md)}` "
           f"({'same base: every output must match' if report.get('same_base') else 'another base: divergence reported'})",
           f"- the gate {_t(_launched(report), md)}; "
           f"budget {_t(report.get('budget_s'), md)} s", "",
           "| A/B path | compared | differ | approved | first difference |", "|---|---|---|---|---|"]
    for row in _ab_rows(report):
        first = _rows(row, "first_differences")[:1]
        where = (f"seed {_t(first[0].get('seed'), md)}, token {_t(first[0].get('token'), md)}" if first else "")
        out.append(f"| {_t(row.get('path'), md)} | {_t(row.get('compared'), md)} | {_t(row.get('differing'), md)} | "
                   f"{_t(row.get('approved'), md)} | {where} |")
    out += ["", "| check | figure | threshold | chart | ok |", "|---|---|---|---|---|"]
    for check in _rows(report, "checks"):
        name = str(check.get("name"))
        chart = _bar(check.get("figure"), check.get("threshold")) if name.startswith(("speed:", "tool-calls:")) else ""
        out.append(f"| {_t(name, md, 60)} | {_t(check.get('figure'), md)} | {_t(check.get('threshold'), md)} | {chart} | "
                   f"{'✅' if check.get('ok') is True else '❌ ' + _t(check.get('detail'), md, 120)} |")
    return "\n".join(out) + "\n\n"
