"""provenance/smoke.yaml, the smoke gate's spec: the model and revision, how the service starts,
what a healthy one may use, and the regression prompts with their outputs recorded on an MI300X.
Checked on load: a spec of another shape is one InputError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError

SPEC_KEYS = {"model": str, "revision": str, "model_mount": str, "speculative": bool, "health_deadline_s": int,
             "shm_size": str, "vram_limit_bytes": int, "prefill_min_tokens": int, "regression": list}
CASE_KEYS = {"prompt": str, "seed": int, "max_tokens": int, "temperature": float, "expected": str}


@dataclass(frozen=True)
class Case:
    """One regression prompt; expected: the output recorded on an MI300X (None: not recorded yet)."""
    prompt: str
    seed: int
    max_tokens: int
    temperature: float = 0.0
    expected: str | None = None


@dataclass(frozen=True)
class SmokeSpec:
    """provenance/smoke.yaml: the model, how the service starts, and what a healthy one shows."""
    model: str
    revision: str
    model_mount: str
    speculative: bool
    health_deadline_s: int
    shm_size: str
    vram_limit_bytes: int
    prefill_min_tokens: int
    regression: tuple[Case, ...]


def load_spec(path: Path) -> SmokeSpec:
    raw = schema.load_yaml(path, SPEC_KEYS)
    for key, kind in SPEC_KEYS.items():  # load_yaml lets null through for any key; a spec has none
        if raw[key] is None or (kind is int and isinstance(raw[key], bool)):
            raise InputError(f"{path}: {key} must be a {kind.__name__}")
    cases = []
    for i, case in enumerate(raw["regression"]):
        where = f"{path}: regression[{i}]"
        if not isinstance(case, dict):
            raise InputError(f"{where} must be a mapping")
        temperature = case.get("temperature", 0.0)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
            raise InputError(f"{where}: temperature must be a number")
        case = {**case, "temperature": float(temperature)}
        schema.check_keys(case, CASE_KEYS, where, required={"prompt", "seed", "max_tokens"})
        for key in ("prompt", "seed", "max_tokens"):  # check_keys lets null through, and a bool is an int
            if case[key] is None or isinstance(case[key], bool):
                raise InputError(f"{where}: {key} must be a {CASE_KEYS[key].__name__}")
        cases.append(Case(**case))
    return SmokeSpec(**{**raw, "regression": tuple(cases)})
