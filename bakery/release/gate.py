"""The acceptance gate's HTTP stages against one serving path of one side (the candidate or the
reference), each under its deadline: the A/B sweep of raw completions, the arithmetic check, needle
recall at long context, and the speed figures and DSpark's acceptance (from /metrics) measured by
vLLM's own benchmark client (`vllm bench serve`). What the answers are judged against is smoke_report.py."""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import requests

from .. import untrusted
from ..errors import SmokeFailure
from .ab import Completion
from .smoke_spec import ABSpec, NeedleSpec, SpeedGate


class Deadline:
    """A stage's time left; past it the stage fails, naming itself."""

    def __init__(self, stage: str, seconds: float, clock=time.monotonic):
        self.stage, self.clock, self.end = stage, clock, clock() + seconds

    def left(self) -> float:
        left = self.end - self.clock()
        if left <= 0:
            raise SmokeFailure(f"the {self.stage} stage ran past its deadline (provenance/smoke.yaml budget_s)")
        return left

    @contextlib.contextmanager
    def bounding(self):
        """A request cut off by the time left fails as the stage's deadline, not as the server's."""
        try:
            yield
        except SmokeFailure:
            self.left()
            raise


class Service:
    """The OpenAI-compatible API of one running server; any 5xx fails the gate."""

    def __init__(self, base_url: str, model: str):
        self.base, self.model = base_url.rstrip("/"), model

    def _post(self, path: str, body: dict, timeout: float = 600) -> dict:
        try:
            resp = requests.post(self.base + path, json=body, timeout=timeout)
        except requests.RequestException as e:
            raise SmokeFailure(f"{self.base}{path}: {untrusted.safe(e, limit=200)}") from None
        said = untrusted.safe(resp.text, limit=200)  # the served image's text: one inert line in our error
        if resp.status_code >= 500:
            raise SmokeFailure(f"HTTP {resp.status_code} from {path}: {said}")
        if resp.status_code != 200:
            raise SmokeFailure(f"{path} answered HTTP {resp.status_code}: {said}")
        try:
            return resp.json()
        except ValueError:
            raise SmokeFailure(f"{path} answered no JSON: {said}") from None

    def models(self) -> str:
        try:
            resp = requests.get(self.base + "/v1/models", timeout=60)
            ids = [m.get("id") for m in resp.json().get("data", [])] if resp.status_code == 200 else None
        except (requests.RequestException, ValueError, AttributeError) as e:
            raise SmokeFailure(f"{self.base}/v1/models: {untrusted.safe(e, limit=200)}") from None
        if ids is None:
            raise SmokeFailure(f"/v1/models answered HTTP {resp.status_code}")
        if self.model not in ids:
            raise SmokeFailure(f"/v1/models lists {untrusted.safe(ids, limit=200)}, not {self.model}")
        return self.model

    def complete(self, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None,
                 timeout: float = 600) -> dict:
        # logprobs 0: the sampled tokens come back listed, so a difference is named by its token
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "logprobs": 0}
        if seed is not None:
            body["seed"] = seed
        return self._post("/v1/completions", body, timeout)

    def metrics(self) -> str:
        try:
            resp = requests.get(self.base + "/metrics", timeout=60)
        except requests.RequestException as e:
            raise SmokeFailure(f"{self.base}/metrics: {untrusted.safe(e, limit=200)}") from None
        if resp.status_code != 200:
            raise SmokeFailure(f"/metrics answered HTTP {resp.status_code}")
        return resp.text


def _choice(out: dict, what: str) -> dict:
    try:
        choice = out["choices"][0]
        if not isinstance(choice.get("text"), str):
            raise TypeError
        return choice
    except (KeyError, IndexError, TypeError, AttributeError):
        raise SmokeFailure(f"{what}: the answer has no choices[0].text") from None


def _tokens(choice: dict) -> tuple[str, ...] | None:
    tokens = (choice.get("logprobs") or {}).get("tokens") if isinstance(choice.get("logprobs"), dict) else None
    return tuple(tokens) if isinstance(tokens, list) and all(isinstance(t, str) for t in tokens) else None


def sweep(service: Service, ab: ABSpec, path: str, deadline: Deadline, progress=lambda done, total: None) -> list[Completion]:
    """Every A/B request, one at a time, in the spec's order."""
    asked = ab.requests()
    out = []
    for i, (temperature, seed, prompt) in enumerate(asked):
        with deadline.bounding():
            answer = service.complete(prompt, ab.max_tokens, temperature, seed, timeout=deadline.left())
        choice = _choice(answer, f"seed {seed} on the {path} path")
        out.append(Completion(path, temperature, seed, choice["text"], _tokens(choice)))
        progress(i + 1, len(asked))
    deadline.left()
    return out


def arithmetic(service: Service) -> str:
    text = _choice(service.complete("Calculate 17 * 23. Answer with the number only.", 32), "17 * 23")["text"]
    if "391" not in text:
        raise SmokeFailure(f"'Calculate 17 * 23' at temperature 0 answered {untrusted.safe(text.strip(), limit=80)}, "
                           f"not 391")
    return text.strip()


FILLER = "The grass is green and the sky is blue and the sun is warm today. "  # about one token a word


def needle_prompt(spec: NeedleSpec, rng: random.Random) -> tuple[str, dict[int, str]]:
    """A prompt of about spec.prompt_tokens tokens with one needle (a vault's code) at each depth,
    and the codes it hides."""
    words_per_filler = len(FILLER.split())
    fillers = spec.prompt_tokens // words_per_filler
    codes = {k: f"{rng.randrange(10**6):06d}" for k in range(1, len(spec.depths) + 1)}
    at = {min(fillers - 1, int(depth * fillers)): k for k, depth in zip(codes, spec.depths, strict=True)}
    parts = []
    for i in range(fillers):
        parts.append(FILLER)
        if i in at:
            parts.append(f"The secret code of vault {at[i]} is {codes[at[i]]}. ")
    question = "\nList the secret code of every vault mentioned above, one per line, as 'vault N: CODE'.\n"
    return "".join(parts) + question, codes


def needles(service: Service, spec: NeedleSpec, path: str, deadline: Deadline) -> dict:
    """Every needle recalled from a prompt of at least spec.prompt_tokens tokens."""
    prompt, codes = needle_prompt(spec, random.Random(f"needles-{path}"))
    start = time.monotonic()
    with deadline.bounding():
        out = service.complete(prompt, 16 * len(codes) + 32, 0.0, timeout=deadline.left())
    text = _choice(out, f"the needle prompt on the {path} path")["text"]
    tokens = (out.get("usage") or {}).get("prompt_tokens", 0)
    if not isinstance(tokens, int) or tokens < spec.prompt_tokens:
        raise SmokeFailure(f"the needle prompt on the {path} path was {untrusted.safe(tokens)} tokens, not the "
                           f"{spec.prompt_tokens} the spec asks for")
    found = {k for k, code in codes.items() if re.search(rf"\b{code}\b", text)}
    return {"path": path, "prompt_tokens": tokens, "needles": len(codes), "recalled": len(found),
            "missed_depths": [d for k, d in zip(codes, spec.depths, strict=True) if k not in found],
            "seconds": round(time.monotonic() - start, 1)}


# -- speed, with vLLM's benchmark client ---------------------------------------------------------------

@dataclass(frozen=True)
class BenchClient:
    """How `vllm bench serve` is run: argv up to `serve` (on an MI300X: the image under test, by
    docker run), and the tokenizer it loads, as that client sees the path."""
    argv: tuple[str, ...]
    tokenizer: str
    result_dir: Path  # where the client's --result-dir is, as this host sees it
    result_dir_arg: str  # the same folder as the client sees it

    def args(self, gate: SpeedGate, base_url: str, model: str, filename: str, prompts: int | None = None,
             input_len: int | None = None, output_len: int | None = None) -> list[str]:
        return [*self.argv, "--backend", "vllm", "--base-url", base_url, "--endpoint", "/v1/completions",
                "--model", model, "--tokenizer", self.tokenizer, "--dataset-name", "random",
                "--random-input-len", str(input_len or gate.input_len), "--random-output-len",
                str(output_len or gate.output_len), "--num-prompts", str(prompts or gate.prompts),
                "--max-concurrency", str(gate.concurrency), "--ignore-eos", "--seed", "0", "--disable-tqdm",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", self.result_dir_arg,
                "--result-filename", filename]


def _bench(client: BenchClient, argv: list[str], filename: str, timeout: float, what: str) -> dict:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"the speed stage's {what} ran past its deadline (provenance/smoke.yaml budget_s)") from None
    except OSError as e:
        raise SmokeFailure(f"cannot run vllm bench serve ({argv[0]}): {e}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SmokeFailure(f"vllm bench serve failed for {what} (exit {done.returncode}): "
                           f"{untrusted.safe(tail[0], limit=200)}")
    try:
        return json.loads((client.result_dir / filename).read_text())
    except (OSError, ValueError) as e:
        raise SmokeFailure(f"vllm bench serve left no result for {what}: {e}") from None


def _figure(gate: SpeedGate, result: dict) -> float:
    try:
        if gate.kind == "decode_median_tok_s":
            return round(1000.0 / float(result["median_tpot_ms"]), 1)
        if gate.kind == "output_tok_s":
            return round(float(result["output_throughput"]), 1)
        if gate.kind == "prefill_tok_s":
            return round(float(result["total_input_tokens"]) / (float(result["mean_ttft_ms"]) / 1000.0)
                         / float(result["completed"]), 1)
        return round(float(result["median_ttft_ms"]) / 1000.0, 3)  # ttft_behind_prefill_s
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise SmokeFailure(f"vllm bench serve's result for {gate.name} lacks a figure: {e}") from None


def speed(client: BenchClient, gate: SpeedGate, base_url: str, model: str, deadline: Deadline) -> dict:
    """One speed gate's figure, and whether every request completed."""
    name = f"{gate.name}-{uuid.uuid4().hex[:8]}.json"
    if gate.kind == "ttft_behind_prefill_s":
        # a cold long prefill first (its own client), then the short requests queued behind it
        long_name = f"long-{name}"
        cold = client.args(gate, base_url, model, long_name, prompts=1, output_len=1)
        with tempfile.TemporaryFile() as sink:
            long_run = subprocess.Popen(cold, stdout=sink, stderr=sink)
            try:
                time.sleep(min(2.0, deadline.left()))
                result = _bench(client, client.args(gate, base_url, model, name, input_len=32), name,
                                deadline.left(), gate.name)
                long_run.wait(timeout=deadline.left())
            finally:
                if long_run.poll() is None:
                    long_run.kill()
                    long_run.wait()
    else:
        result = _bench(client, client.args(gate, base_url, model, name), name, deadline.left(), gate.name)
    completed, failed = result.get("completed"), result.get("failed", 0)
    return {"name": gate.name, "figure": _figure(gate, result), "completed": completed,
            "failed": failed if isinstance(failed, int) else None, "acceptance": _acceptance(result)}


def _acceptance(result: dict) -> dict | None:
    """DSpark's accepted tokens per draft over the run, as the client read them from /metrics."""
    drafts, accepted = result.get("spec_decode_num_drafts"), result.get("spec_decode_accepted_tokens")
    if not isinstance(drafts, (int, float)) or not isinstance(accepted, (int, float)) or drafts <= 0:
        return None
    return {"drafts": drafts, "accepted_tokens": accepted, "accepted_per_draft": round(accepted / drafts, 3)}
