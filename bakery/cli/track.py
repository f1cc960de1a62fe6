"""invoke track and bump: keeping upstream's nightlies, and moving the pin onto one with proofs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import NOTHING_NEW, InputError
from ..project import Project

if TYPE_CHECKING:  # imported by the commands when they run
    from ..release.track.bump import Bump


@dataclass(frozen=True)
class Bumped:
    """A bump's outcome: nothing new (result None), or one nightly tried, reported at report."""
    result: Bump | None
    report: Path | None = None
    kits: Path | None = None
    ledger: Path | None = None

    @property
    def exit_code(self) -> int:
        return NOTHING_NEW if self.result is None else self.result.code


def bump(project: Path, ledger=None, nightly=None, report=None, out=None, log=lambda m: None) -> Bumped:
    from ..release.track.bump import bump as run_bump
    from ..release.track.report import report as run_report

    where = Project(project)
    out_dir = Path(out) if out else where.out
    ledger_path = Path(ledger) if ledger else where.ledger
    result = run_bump(project, ledger_path, out_dir, nightly, log=log)
    if result is None:
        return Bumped(None)
    report_path = Path(report) if report else where.out / "track" / "report.md"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(run_report(result, out_dir / "rebase"))
    return Bumped(result, report_path, out_dir / "rebase", where.ledger.relative_to(project))


@dataclass(frozen=True)
class Tracked:
    ledger: Path
    kept: int  # nightlies in the ledger
    changed: bool


def listing(project: Path, ledger=None) -> list[str]:
    """`invoke track --list`: the ledger, newest first, with what each nightly would need."""
    from ..base import spec as base_mod
    from ..release.track.ledger import listing as run_listing, load_ledger

    pinned = base_mod.load_spec(Project(project).base_yaml).image.pin
    return run_listing(load_ledger(Path(ledger) if ledger else Project(project).ledger), pinned)


def track(project: Path, from_=None, mirror=None, tags="*", ledger=None, log=lambda m: None) -> Tracked:
    """Mirror and record every matching nightly (the bump, if wanted, is the caller's next call)."""
    from ..base import spec as base_mod
    from ..release.track.tracker import track as run_track

    if not (from_ and mirror):
        raise InputError("name the upstream and your mirror: invoke track --from REGISTRY/REPO --mirror "
                         "REGISTRY/REPO (or --list to print the ledger)")
    ledger_path = Path(ledger) if ledger else Project(project).ledger
    platform = base_mod.load_spec(Project(project).base_yaml).platform
    kept, changed = run_track(project, from_, mirror, tags, ledger_path, platform, log=log)
    return Tracked(ledger_path, len(kept.nightlies), changed)
