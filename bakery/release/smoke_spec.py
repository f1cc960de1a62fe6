"""provenance/smoke.yaml, the MI300X acceptance gate's spec: the model and revision, how the service
starts, the two decode paths, the A/B sweep against a reference, the needles, the speed gates with
the figures they come from, and each stage's deadline. Checked on load: a spec of another shape is
one InputError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError

# dspark: the image's command as built (DSpark-7 speculative decoding); native: the same command
# with its --speculative-config left out. A server runs one path at a time.
PATHS = ("dspark", "native")
SPECULATIVE_FLAG = "--speculative-config"
STAGES = ("ab", "quality", "speed")  # each with its deadline; a start has health_deadline_s

SPEC_KEYS = {"model": str, "revision": str, "model_mount": str, "health_deadline_s": int, "shm_size": str,
             "vram_limit_bytes": int, "paths": list, "ab": dict, "needles": dict, "tool_calls": dict,
             "speed": dict, "budget_s": dict}
AB_KEYS = {"seeds": int, "max_tokens": int, "temperatures": list, "prompts": list}
NEEDLE_KEYS = {"prompt_tokens": int, "depths": list}
TOOL_CALL_KEYS = {"harness": str, "temperature": float, "threshold": int, "seed_figure": str, "cases": list}
BFCL_CATEGORIES = ("simple_python", "multiple")  # bfcl_harness.py's: single-turn, AST-checked
SPEED_KEYS = {"tolerance": float, "versus_reference": float, "versus_reference_slack_s": float, "gates": list}
GATE_KEYS = {"name": str, "kind": str, "concurrency": int, "prompts": int, "input_len": int, "output_len": int,
             "seed_figure": float, "source": str}
# what each kind of speed gate reads from `vllm bench serve`'s saved result, and whether more is better
GATE_KINDS = {"decode_median_tok_s": True, "output_tok_s": True, "prefill_tok_s": True, "ttft_behind_prefill_s": False}


@dataclass(frozen=True)
class ABSpec:
    """The raw /v1/completions sweep: seeds x max_tokens at each temperature, one request at a time,
    on each path; seed i is sent prompts[i % len(prompts)]."""
    seeds: int
    max_tokens: int
    temperatures: tuple[float, ...]
    prompts: tuple[str, ...]

    def requests(self) -> list[tuple[float, int, str]]:
        """(temperature, seed, prompt) of every request of one path, in the order they are sent."""
        return [(t, seed, self.prompts[seed % len(self.prompts)]) for t in self.temperatures
                for seed in range(self.seeds)]


@dataclass(frozen=True)
class NeedleSpec:
    """A long prompt with a needle at each depth (a fraction of the prompt); every one must be recalled."""
    prompt_tokens: int
    depths: tuple[float, ...]


@dataclass(frozen=True)
class ToolCallSpec:
    """BFCL cases sent through the image's own tool parser, one at a time; at least `threshold` of
    them must be exact matches by BFCL's checker."""
    harness: str  # the bfcl-eval pin requirements/bfcl.txt holds
    temperature: float
    threshold: int
    seed_figure: str  # what the seed deployment scored, as published
    cases: tuple[str, ...]  # BFCL ids


@dataclass(frozen=True)
class SpeedGate:
    """One figure from vLLM's benchmark client, its load, and the published figure it is held to."""
    name: str
    kind: str  # a GATE_KINDS key
    concurrency: int
    prompts: int
    input_len: int
    output_len: int
    seed_figure: float
    source: str

    @property
    def higher_is_better(self) -> bool:
        return GATE_KINDS[self.kind]

    def threshold(self, tolerance: float) -> float:
        """The seed's figure less (or, for a time, plus) the tolerance."""
        return self.seed_figure * (1 - tolerance if self.higher_is_better else 1 + tolerance)


@dataclass(frozen=True)
class SpeedSpec:
    tolerance: float  # how far under the seed's published figure a figure may be
    versus_reference: float  # how far under the reference's figure on the same host
    versus_reference_slack_s: float  # and, for a time, this much more in seconds: jitter, not speed
    gates: tuple[SpeedGate, ...]


@dataclass(frozen=True)
class SmokeSpec:
    """provenance/smoke.yaml: the model, how the service starts, and what the gate asks of it."""
    model: str
    revision: str
    model_mount: str
    health_deadline_s: int
    shm_size: str
    vram_limit_bytes: int
    paths: tuple[str, ...]
    ab: ABSpec
    needles: NeedleSpec
    tool_calls: ToolCallSpec
    speed: SpeedSpec
    budget_s: dict  # stage -> seconds, each of STAGES

    @property
    def budget_total_s(self) -> int:
        """The whole gate's budget: a start and the A/B sweep on each server (candidate and reference,
        each path), the quality stages on the candidate's paths, speed on the dspark path of both."""
        per_server = self.health_deadline_s + self.budget_s["ab"]
        return 2 * len(self.paths) * per_server + len(self.paths) * self.budget_s["quality"] + 2 * self.budget_s["speed"]


def _number(value, where: str, kind=float, low: float = 0, high: float | None = None):
    """A number of the kind in [low, high]: YAML's bools and nulls are not numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise InputError(f"{where} must be a{'n integer' if kind is int else ' number'}")
    if value < low or (high is not None and value > high):
        raise InputError(f"{where} must be between {low} and {high if high is not None else 'any'}, not {value}")
    return kind(value)


def _section(raw: dict, key: str, keys: dict, path: Path) -> dict:
    section = raw[key]
    schema.check_keys(section, keys, f"{path}: {key}")
    for name, value in section.items():
        if value is None:
            raise InputError(f"{path}: {key}.{name} must be a {keys[name].__name__}")
    return section


def _strings(values: list, where: str) -> tuple[str, ...]:
    if not values or not all(isinstance(v, str) and v for v in values):
        raise InputError(f"{where} must be a list of non-empty strings")
    return tuple(values)


def _gate(entry, i: int, path: Path) -> SpeedGate:
    where = f"{path}: speed.gates[{i}]"
    if not isinstance(entry, dict):
        raise InputError(f"{where} must be a mapping")
    schema.check_keys(entry, GATE_KEYS, where)
    if entry["kind"] not in GATE_KINDS:
        raise InputError(f"{where}: kind must be one of {', '.join(GATE_KINDS)}, not {entry['kind']!r}")
    for key in ("name", "source"):
        if not isinstance(entry[key], str) or not entry[key]:
            raise InputError(f"{where}: {key} must be a non-empty string")
    ints = {k: _number(entry[k], f"{where}: {k}", int, 1) for k in ("concurrency", "prompts", "input_len", "output_len")}
    return SpeedGate(entry["name"], entry["kind"], **ints,
                     seed_figure=_number(entry["seed_figure"], f"{where}: seed_figure", float, 1e-9),
                     source=entry["source"])


def _tool_calls(section: dict, path: Path) -> ToolCallSpec:
    import re

    where = f"{path}: tool_calls"
    cases = _strings(section["cases"], f"{where}.cases")
    odd = [c for c in cases if not re.fullmatch(rf"({'|'.join(BFCL_CATEGORIES)})_[0-9]+", c)]
    if odd:
        raise InputError(f"{where}.cases: {odd[0]!r} is not a BFCL id of {' or '.join(BFCL_CATEGORIES)} (e.g. multiple_7)")
    if len(set(cases)) != len(cases):
        raise InputError(f"{where}.cases: each case once")
    if not re.fullmatch(r"bfcl-eval==[0-9][0-9.]*", section["harness"]):
        raise InputError(f"{where}.harness must pin bfcl-eval (bfcl-eval==VERSION, as requirements/bfcl.txt does)")
    return ToolCallSpec(section["harness"], _number(section["temperature"], f"{where}.temperature", float, 0, 2),
                        _number(section["threshold"], f"{where}.threshold", int, 1, len(cases)),
                        _strings([section["seed_figure"]], f"{where}.seed_figure")[0], cases)


def load_spec(path: Path) -> SmokeSpec:
    raw = schema.load_yaml(path, SPEC_KEYS)
    for key, kind in SPEC_KEYS.items():  # load_yaml lets null through for any key; a spec has none
        if raw[key] is None or (kind is int and isinstance(raw[key], bool)):
            raise InputError(f"{path}: {key} must be a {kind.__name__}")
    paths = _strings(raw["paths"], f"{path}: paths")
    if sorted(set(paths)) != sorted(paths) or not set(paths) <= set(PATHS):
        raise InputError(f"{path}: paths must name each of {', '.join(PATHS)} at most once")
    ab = _section(raw, "ab", AB_KEYS, path)
    temperatures = tuple(_number(t, f"{path}: ab.temperatures[{i}]", float, 0, 2)
                         for i, t in enumerate(ab["temperatures"]))
    if not temperatures:
        raise InputError(f"{path}: ab.temperatures must list at least one temperature")
    ab_spec = ABSpec(_number(ab["seeds"], f"{path}: ab.seeds", int, 1), _number(ab["max_tokens"], f"{path}: ab.max_tokens",
                     int, 1), temperatures, _strings(ab["prompts"], f"{path}: ab.prompts"))
    needles = _section(raw, "needles", NEEDLE_KEYS, path)
    depths = tuple(_number(d, f"{path}: needles.depths[{i}]", float, 0, 1) for i, d in enumerate(needles["depths"]))
    if not depths:
        raise InputError(f"{path}: needles.depths must list at least one depth")
    needle_spec = NeedleSpec(_number(needles["prompt_tokens"], f"{path}: needles.prompt_tokens", int, 1), depths)
    tool_spec = _tool_calls(_section(raw, "tool_calls", TOOL_CALL_KEYS, path), path)
    speed = _section(raw, "speed", SPEED_KEYS, path)
    gates = tuple(_gate(g, i, path) for i, g in enumerate(speed["gates"]))
    if len({g.name for g in gates}) != len(gates):
        raise InputError(f"{path}: speed.gates: each name once")
    speed_spec = SpeedSpec(_number(speed["tolerance"], f"{path}: speed.tolerance", float, 0, 1),
                           _number(speed["versus_reference"], f"{path}: speed.versus_reference", float, 0, 1),
                           _number(speed["versus_reference_slack_s"], f"{path}: speed.versus_reference_slack_s",
                                   float, 0, 10), gates)
    budget = raw["budget_s"]
    if set(budget) != set(STAGES):
        raise InputError(f"{path}: budget_s must name each of {', '.join(STAGES)} (seconds)")
    budget = {stage: _number(budget[stage], f"{path}: budget_s.{stage}", int, 1) for stage in STAGES}
    return SmokeSpec(raw["model"], raw["revision"], raw["model_mount"], raw["health_deadline_s"], raw["shm_size"],
                     raw["vram_limit_bytes"], paths, ab_spec, needle_spec, tool_spec, speed_spec, budget)
