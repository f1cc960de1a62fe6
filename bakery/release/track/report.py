"""The bump's pull request (or issue) body, in Markdown: someone else's text kept inert."""

from __future__ import annotations

import re
from pathlib import Path

from ... import untrusted
from .bump import Bump, plain


def report(result: Bump, kits: Path) -> str:
    """The pull request's (or issue's) body: what was tried, each overlay's verdict, what changed."""
    from ..rebase import AUDIT_CHANGED, FIXED_UPSTREAM

    n = result.nightly
    required = [r for r in result.rows if r.overlay.baked]
    retired = [r.overlay.id for r in required if r.status == FIXED_UPSTREAM]
    head = (f"Nightly {n.label()}: overlays carried and proven" if result.carried
            else f"Nightly {n.label()}: overlays need porting" if any(not r.carried for r in required)
            else f"Nightly {n.label()}: an overlay may be fixed upstream, confirm by hand")
    lines = [f"# {head}", "", "| | |", "| --- | --- |",
             f"| upstream | `{result.upstream}@{n.digest}` |", f"| tags | {escaped(n.label())} |",
             f"| created | {n.created} |", f"| vLLM | {escaped(n.vllm)} |", f"| AITER | {escaped(n.aiter)} |",
             f"| mirrored | `{n.mirrored}` |", f"| previous pin | `{result.previous}` |", "",
             "## Overlays (`invoke rebase`, each proven on the new base)", "",
             "| overlay | required | status | verdict and reason |", "| --- | --- | --- | --- |"]
    audits = [r for r in result.rows if not r.overlay.baked]
    lines += [f"| {r.overlay.id} | yes | {r.status} | {escaped(r.detail)} |" for r in required]  # statuses are ours
    lines += [f"| {r.overlay.id} | no (audit) | {r.status} | {escaped(r.detail)} |" for r in audits]
    changed = [r for r in audits if r.status == AUDIT_CHANGED]
    lines += ["", "## Audit records that changed", ""]
    lines += [f"- **{r.overlay.id}**: {escaped(r.detail)}" for r in changed] or ["none"]
    porting = [r for r in required if not r.carried]
    lines += ["", "## Porting kits", ""]
    lines += [f"- `{kits / r.overlay.id}/`: edit `ours.py`, then run `prove.sh`" for r in porting
              if (kits / r.overlay.id).is_dir()] or ["none"]
    fence = "`" * max(3, 1 + max((len(run) for line in result.proof_log for run in re.findall(r"`+", line)), default=0))
    quiet = lambda line: re.sub(r"([@#])(?=\w)", "\\1\u200b", plain(line, 400))  # noqa: E731 (no mentions, no links)
    if retired and not result.carried:
        lines += ["", "## Fixed upstream? Confirm by hand", "",
                  f"The new base's own code proves {', '.join(retired)} fixed. An unattended bump never retires an "
                  f"overlay on that word (the base's code runs inside its own proof): check the upstream change, "
                  f"then run `invoke rebase --base {result.upstream}@{n.digest}`, which retires it."]
    lines += ["", "## Proofs as they ran", "", fence, *map(quiet, result.proof_log), fence, ""]
    if result.carried:
        lines += ["This change pins the nightly in `image/base.yaml` (read from the mirror), re-locks `overlays/` "
                  "and records the outcome in `image/nightlies.yaml`; nothing else. Merging it moves the pin; a "
                  "release (a `v*` tag) then builds, signs and smoke-tests it.", ""]
    text = "\n".join(lines)
    return text if len(text) <= REPORT_LIMIT else text[:REPORT_LIMIT] + "\n\n(report cut at its size limit)\n"


REPORT_LIMIT = 60000  # a pull request's body holds 65536 characters


def escaped(text: object) -> str:
    """A Markdown table cell of someone else's text: no row breaks, no HTML, no code, no mentions or
    issue links, URL-shaped ones included (a `Closes #1` in a PR body would close an issue on merge)."""
    return untrusted.safe(text, "markdown", 600)
