"""invoke prove and rebase: the overlays' proofs on a base, and carrying them to a new one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..bake.options import Options
from ..errors import InputError, NotCarried, NotProven

if TYPE_CHECKING:  # imported by the commands when they run
    from ..proofs.runner import Verdict


@dataclass(frozen=True)
class Proven:
    """What `invoke prove` found: each overlay's row on a base, or a porting kit's one verdict."""
    rows: tuple = ()  # rebase.ProofRow, a script-less proof shown as hardware-only
    device: str = "cpu"
    kit: Verdict | None = None  # of a kit's ours.py

    def check(self) -> None:
        """Raise unless everything is proven (the table is printed first, then this)."""
        from ..proofs.runner import FIXED

        if self.kit is not None:
            if self.kit.verdict != FIXED:
                raise NotProven("ours.py is not proven FIXED: edit it and run prove.sh again")
            return
        bad = [r.overlay.id for r in self.rows if not r.ok]
        if bad:
            raise NotProven(f"not proven (a required overlay must be BROKEN on stock and FIXED overlaid): "
                            f"{', '.join(bad)}")


def hardware_only(row):
    """A proof marked `hardware:` runs nowhere here: its row says so instead of a verdict."""
    if row.overlay.proof.script is not None:
        return row
    from ..proofs.gate import HARDWARE_ONLY

    return dataclasses.replace(row, stock=dataclasses.replace(row.stock, verdict=HARDWARE_ONLY))


def prove(project: Path, base: str | None, device: str, kit: str | None, log) -> Proven:
    from ..proofs.runner import DEVICES
    from ..release.rebase import prove_base, prove_kit

    if kit:
        return Proven(kit=prove_kit(project, Path(kit)))
    if device not in DEVICES:
        raise InputError(f"--device {device}: say cpu or cuda")
    rows = prove_base(Options(project, base, device=device), log=log)
    return Proven(tuple(hardware_only(r) for r in rows), device)


@dataclass(frozen=True)
class Rebased:
    rows: tuple  # rebase.RebaseRow
    ok: bool
    base: str

    def check(self) -> None:
        if not self.ok:
            raise NotCarried("not every required overlay is carried and proven on the new base; lock, patches and "
                             "overlays.yaml left unchanged. Port the ones marked `needs porting` (see their folder) "
                             "and run again")


def rebase(project: Path, base: str, lock: str | None, out: str | None, log) -> Rebased:
    from ..release.rebase import rebase as run

    rows, ok = run(Options.from_flags(project, base=base, lock=lock, out=out), log=log)
    return Rebased(tuple(rows), ok, base)
