"""The A/B comparison of the acceptance gate: the candidate's raw completions against the reference's,
request by request, and the approval file that lets a reviewed difference through. Pure code: the
HTTP side is gate.py."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .. import schema, untrusted
from ..errors import InputError


@dataclass(frozen=True)
class Completion:
    """One raw /v1/completions answer: its text and, where the server lists them, its tokens."""
    path: str
    temperature: float
    seed: int
    text: str
    tokens: tuple[str, ...] | None

    @property
    def key(self) -> tuple[str, float, int]:
        return self.path, self.temperature, self.seed


@dataclass(frozen=True)
class Difference:
    """Where one candidate output first leaves the reference's."""
    path: str
    temperature: float
    seed: int
    token: int  # the index of the first differing token (of characters where a side lists no tokens)
    candidate: str  # the candidate's token there ("" past its end)
    reference: str
    output: str  # sha256:<hex> of the candidate's whole text: what an approval names

    @property
    def key(self) -> tuple[str, float, int]:
        return self.path, self.temperature, self.seed

    def line(self) -> str:
        return (f"seed {self.seed} on the {self.path} path at temperature {self.temperature:g}: token {self.token} "
                f"is {untrusted.safe(repr(self.candidate), limit=40)}, the reference's {untrusted.safe(repr(self.reference), limit=40)} "
                f"(output {self.output})")

    def to_json(self) -> dict:
        return {"path": self.path, "temperature": self.temperature, "seed": self.seed, "token": self.token,
                "candidate": self.candidate, "reference": self.reference, "output": self.output}


def first_difference(candidate: Completion, reference: Completion) -> Difference | None:
    """None if the two are the same bytes (and the same tokens, where both list them)."""
    same_tokens = candidate.tokens is None or reference.tokens is None or candidate.tokens == reference.tokens
    if candidate.text == reference.text and same_tokens:
        return None
    if candidate.tokens is not None and reference.tokens is not None:
        mine, theirs = candidate.tokens, reference.tokens
    else:
        mine, theirs = tuple(candidate.text), tuple(reference.text)
    index = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return Difference(candidate.path, candidate.temperature, candidate.seed, index,
                      mine[index] if index < len(mine) else "", theirs[index] if index < len(theirs) else "",
                      output_digest(candidate.text))


def output_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class PathResult:
    """One path's A/B: how many outputs were compared, which differ, and how far they agree."""
    path: str
    compared: int
    differing: tuple[Difference, ...]
    approved: tuple[Difference, ...]  # of differing, those the approval file lists
    mean_agreeing_tokens: float  # over the differing: tokens before the first difference

    @property
    def unapproved(self) -> tuple[Difference, ...]:
        return tuple(d for d in self.differing if d not in self.approved)

    def to_json(self) -> dict:
        return {"path": self.path, "compared": self.compared, "differing": len(self.differing),
                "approved": len(self.approved), "unapproved": len(self.unapproved),
                "divergence": round(len(self.differing) / self.compared, 4) if self.compared else None,
                "mean_agreeing_tokens": self.mean_agreeing_tokens,
                "first_differences": [d.to_json() for d in self.differing[:10]]}


def compare(candidate: list[Completion], reference: list[Completion], paths: tuple[str, ...],
            approvals: Approvals | None = None) -> tuple[PathResult, ...]:
    """Each path's outputs, candidate against reference, by (path, temperature, seed). Both sides must
    have answered the same requests: a missing one is an error, not a pass."""
    theirs = {c.key: c for c in reference}
    mine = {c.key: c for c in candidate}
    if set(mine) != set(theirs):
        missing = sorted(set(mine) ^ set(theirs))[0]
        raise InputError(f"the A/B sides answered different requests (seed {missing[2]} on the {missing[0]} path "
                         f"at temperature {missing[1]:g} is on one side only)")
    results = []
    for path in paths:
        keys = sorted(k for k in mine if k[0] == path)
        differing = tuple(d for d in (first_difference(mine[k], theirs[k]) for k in keys) if d is not None)
        approved = tuple(d for d in differing if approvals is not None and approvals.lists(d))
        mean = round(sum(d.token for d in differing) / len(differing), 1) if differing else float(0)
        results.append(PathResult(path, len(keys), differing, approved, mean))
    return tuple(results)


@dataclass(frozen=True)
class Approvals:
    """A committed, reviewed list of A/B differences the gate lets through; its sha256 is signed. Each
    names the candidate's output it approves: another difference on the same seed is not approved."""
    path: Path
    sha256: str
    entries: frozenset[tuple[str, float, int, str]]  # (path, temperature, seed, output sha256:<hex>)

    def lists(self, difference: Difference) -> bool:
        return (*difference.key, difference.output) in self.entries


APPROVAL_KEYS = {"approved": list}
ENTRY_KEYS = {"path": str, "seed": int, "temperature": (int, float), "output": str, "reason": str}


def load_approvals(path: Path) -> Approvals:
    """provenance/smoke-approvals.yaml (or the file given): each approved difference, with why."""
    raw = schema.load_yaml(path, APPROVAL_KEYS)
    entries = set()
    for i, entry in enumerate(raw["approved"] or []):
        where = f"{path}: approved[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where} must be a mapping")
        schema.check_keys(entry, ENTRY_KEYS, where)
        if any(entry[k] is None or isinstance(entry[k], bool) for k in ENTRY_KEYS) or not entry["reason"].strip():
            raise InputError(f"{where}: path, seed, temperature, output and a reason are each needed")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", entry["output"]):
            raise InputError(f"{where}: output is the approved output's sha256:<64 hex> (the gate prints it with "
                             f"the difference), not {untrusted.safe(entry['output'], limit=80)!r}")
        entries.add((entry["path"], float(entry["temperature"]), entry["seed"], entry["output"]))
    return Approvals(path, hashlib.sha256(path.read_bytes()).hexdigest(), frozenset(entries))
