"""The proof gate, in one place (bakery/proofs/gate.py): lock, build, prove and rebase hold a required
overlay to the same rule, with the same words the build used before the gate had one home."""

from __future__ import annotations

from pathlib import Path

import pytest

from bakery.inputs.proof_spec import ProofSpec
from bakery.proofs import gate
from bakery.proofs.runner import BROKEN, CANNOT, FIXED, Verdict

SCRIPTED = ProofSpec(Path("proofs/p.py"))
HARDWARE = ProofSpec(None, hardware="needs an MI300X LDS")


@pytest.mark.parametrize("spec, stock, overlaid, proven, says", [
    (SCRIPTED, Verdict(BROKEN, "bad"), Verdict(FIXED, "good"), True, ""),
    (HARDWARE, None, None, True, ""),
    (None, None, None, False,
     "overlay 'o' has no proof: give it proof: {script: ...} in overlays.yaml, or {hardware: WHY} where only "
     "hardware can tell"),
    (SCRIPTED, Verdict(BROKEN, "bad"), Verdict(CANNOT, "no triton"), False,
     "overlay 'o': its proof says CANNOT-PROVE on the overlaid target (no triton); run `invoke prove` for the table"),
    (SCRIPTED, Verdict(FIXED, "fine"), Verdict(FIXED, "good"), False,
     "overlay 'o': its proof says FIXED on the base's stock target (fine): upstream fixed it, run `invoke rebase` "
     "to record that and stop baking the overlay"),
    (SCRIPTED, Verdict(CANNOT, "?"), Verdict(FIXED, "good"), False,
     "overlay 'o': its proof says CANNOT-PROVE on the base's stock target (?): the proof cannot show the defect "
     "is there; run `invoke prove`"),
])
def test_one_rule_with_one_wording(spec, stock, overlaid, proven, says):
    from bakery.inputs.overlays import Overlay
    from bakery.release.rebase import ProofRow

    judged = gate.judge(spec, stock, overlaid)
    assert judged.proven is proven
    assert (judged.message("o") if not proven else "") == says
    # invoke prove's and rebase's table rows hold to the same rule; an audit record is never held
    def overlay(status: str) -> Overlay:
        return Overlay("o", "/o.py", {}, None, None, "fix", "", status, (), proof=spec)

    assert ProofRow(overlay("required"), stock, overlaid).ok is proven
    assert ProofRow(overlay("not-applicable"), stock, None).ok is True
