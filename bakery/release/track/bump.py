"""`invoke bump`: the newest untried nightly through `invoke rebase`, read from the mirror; carried,
it moves the pin."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from ... import untrusted
from ...base import spec as base_mod
from ...errors import BUMPED, PORTING, InputError
from ...files import rewrite
from ...oci.refs import Digest
from ...project import Project
from .ledger import CARRIED, NEEDS_PORTING, Ledger, Nightly, Tried, load_ledger, newest_first, write_ledger


def pending(ledger: Ledger, pinned: Digest) -> Nightly | None:
    """The nightly a bump stopped between its record and its last write left marked `pinning` (it is
    finished), else the newest kept nightly newer than the pin and not yet tried; None: nothing new.
    One that was pinned and then rolled back by hand stays tried: the mark lasts only that moment."""
    pin = ledger.find(pinned)
    if pin is not None and pin.tried is not None and pin.tried.pinning:
        return pin  # stopped after it moved the pin, before its record said so: finished first
    newer = [n for n in newest_first(ledger) if n is not pin and (pin is None or n.order > pin.order) and
             (n.tried is None or n.tried.pinning)]
    return newer[0] if newer else None


def with_outcome(ledger: Ledger, chosen: Nightly, tried: Tried, pinned: bool = False) -> Ledger:
    """The ledger with `chosen` tried so. `pinned`: its pin has moved, its lock with it, so a bump of
    an older nightly stopped before its pin (marked `pinning`, overtaken by this newer one) has
    nothing left to finish: its mark is cleared, else it would be pinned the day the pin is rolled
    back below it by hand. Until then a mark stays: that bump's lock may be what the checkout holds."""
    def settled(n: Nightly) -> Nightly:
        if n is chosen:
            return replace(n, tried=tried)
        if pinned and n.tried is not None and n.tried.pinning and n.order <= chosen.order:
            return replace(n, tried=replace(n.tried, pinning=False))
        return n
    return replace(ledger, nightlies=tuple(settled(n) for n in ledger.nightlies))


@dataclass(frozen=True)
class Bump:
    nightly: Nightly
    upstream: str
    rows: list  # rebase.RebaseRow, overlays then audit records
    carried: bool
    proof_log: list[str]
    previous: str  # the pin before

    @property
    def code(self) -> int:
        return BUMPED if self.carried else PORTING


def bump(project: Path, ledger_path: Path, out: Path, nightly: str | None = None, log=print) -> Bump | None:
    """Try the newest untried nightly (or the one named) on the mirror's copy with `rebase`; carried:
    pin it in image/base.yaml. The ledger records the outcome either way."""
    from ...bake.options import Options
    from .. import rebase as rebase_mod

    ledger = load_ledger(ledger_path)
    spec_path = Project(project).base_yaml
    spec = base_mod.load_spec(spec_path)
    if nightly:
        chosen = ledger.find(Digest.parse(nightly.rsplit("@", 1)[-1]))
        if chosen is None:
            raise InputError(f"{nightly} is not in {ledger_path}: `invoke track --list` shows the kept nightlies")
    else:
        chosen = pending(ledger, spec.image.pin)
        if chosen is None:
            return None
    target = f"{ledger.upstream}@{chosen.digest}"
    log(f"trying {chosen.label()} {chosen.digest} (vLLM {chosen.vllm}), read from {ledger.mirror}")
    proof_log: list[str] = []

    def both(line: str) -> None:  # proof reasons come from the base's code: no control characters
        line = plain(line, 400)
        proof_log.append(line)
        log(line)

    recorded: list[Nightly] = []  # the chosen nightly as the ledger last got it

    def record(rows: list, carried: bool, pinning: bool = False, pinned: bool = False) -> None:
        """The outcome in the ledger; carried, before the checkout changes (the lock, then the pin), marked
        `pinning` until the pin has moved, so a bump stopped in between is finished by the next.
        Finishing, the first try's statuses stay."""
        statuses = {r.overlay.id: str(r.status) for r in rows}
        again = carried and chosen.tried is not None and chosen.tried.outcome == CARRIED
        tried = replace(chosen.tried, pinning=pinning) if again and chosen.tried else \
            Tried(CARRIED if carried else NEEDS_PORTING, statuses, pinning)
        recorded[:] = [replace(chosen, tried=tried)]
        write_ledger(ledger_path, with_outcome(ledger, chosen, tried, pinned))

    # retire=False: a base whose own code "proves" a fix runs inside that proof; retiring an overlay
    # takes a person (invoke rebase), never an unattended bump
    rows, carried = rebase_mod.rebase(Options(project, target, out=out, base_mirror=ledger.mirror), log=both,
                                      retire=False, before_commit=lambda rows: record(rows, True, pinning=True))
    if carried:
        pin(spec_path, target, ledger.mirror, chosen)
        record(rows, True, pinned=True)  # from now on a pin elsewhere (a rollback) is a person's choice
    else:
        record(rows, False)
    return Bump(recorded[0], ledger.upstream, rows, carried, proof_log, str(spec.image))


def pin(spec_path: Path, image: str, mirror: str, nightly: Nightly | None = None) -> None:
    """Set image: and mirror: in base.yaml, its comments kept but the one naming the versions."""
    text = spec_path.read_text()
    if nightly is not None:
        text = re.sub(r"(?m)^# vLLM .*\n", f"# vLLM {nightly.vllm}, AITER {nightly.aiter}: nightly {nightly.label()}, "
                      f"pinned by invoke bump.\n", text, count=1)
    text = re.sub(r"(?m)^image: .*$", f"image: {image}", text, count=1)
    text = re.sub(r"(?m)^mirror: .*$", f"mirror: {mirror}", text, count=1) if re.search(r"(?m)^mirror:", text) \
        else text.rstrip("\n") + f"\nmirror: {mirror}\n"
    rewrite(spec_path, text.encode())


def plain(text: str, limit: int) -> str:
    """One line of someone else's text, inert on a terminal, at most about limit long."""
    return untrusted.safe(text, "terminal", limit)
