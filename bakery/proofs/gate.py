"""The one rule a required overlay is held to before it is locked, baked or carried: its proof says
BROKEN on the base's stock target and FIXED on the overlaid one (a proof that cannot tell the two
apart proves nothing), or it is marked `hardware:` with the reason only hardware can tell."""

from __future__ import annotations

from dataclasses import dataclass

from .runner import BROKEN, FIXED

HARDWARE_ONLY = "hardware-only"  # what a table shows for a proof that runs nowhere here


@dataclass(frozen=True)
class Judgement:
    """Whether an overlay's proofs let it be baked, and why not in one line."""
    proven: bool
    why: str = ""  # one line, when not proven
    has_proof: bool = True  # False: overlays.yaml gives it no proof at all (an input to fix)

    def message(self, overlay_id: str) -> str:
        return f"overlay {overlay_id!r}{': ' if self.has_proof else ' '}{self.why}"


def judge(spec, stock, overlaid) -> Judgement:
    """spec: the overlay's ProofSpec (or None); stock, overlaid: its proof's Verdicts on each side."""
    if spec is None:
        return Judgement(False, "has no proof: give it proof: {script: ...} in overlays.yaml, or "
                                "{hardware: WHY} where only hardware can tell", has_proof=False)
    if spec.script is None:
        return Judgement(True)
    if overlaid.verdict != FIXED:
        return Judgement(False, f"its proof says {overlaid.verdict} on the overlaid target ({overlaid.reason}); "
                                f"run `invoke prove` for the table")
    if stock.verdict != BROKEN:
        return Judgement(False, f"its proof says {stock.verdict} on the base's stock target ({stock.reason}): "
                         + ("upstream fixed it, run `invoke rebase` to record that and stop baking the overlay"
                            if stock.verdict == FIXED else "the proof cannot show the defect is there; run "
                                                           "`invoke prove`"))
    return Judgement(True)
