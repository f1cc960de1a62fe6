"""The acceptance gate's HTTP stages against one serving path of one side (the candidate or the
reference), each under its deadline: the A/B sweep of raw completions, the arithmetic check, needle
recall at long context, BFCL's tool calls, and the speed figures and DSpark's acceptance (from /metrics) measured by
vLLM's own benchmark client (`vllm bench serve`). What the answers are judged against is smoke_report.py."""

from __future__ import annotations

import contextlib
import json
import math
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
from . import bfcl
from .ab import Completion
from .smoke_spec import ABSpec, NeedleSpec, SpeedGate, ToolCallSpec


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
        except (ValueError, RecursionError):  # a hostile server's nesting is no crash of the gate
            raise SmokeFailure(f"{path} answered no JSON we read: {said}") from None

    def models(self) -> str:
        try:
            resp = requests.get(self.base + "/v1/models", timeout=60)
            ids = [m.get("id") for m in resp.json().get("data", [])] if resp.status_code == 200 else None
        except (requests.RequestException, ValueError, AttributeError, RecursionError) as e:
            raise SmokeFailure(f"{self.base}/v1/models: {untrusted.safe(type(e).__name__, limit=40)}: "
                               f"{untrusted.safe(e, limit=200)}") from None
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

    def chat(self, messages: list, tools: list, temperature: float, timeout: float = 600) -> dict:
        return self._post("/v1/chat/completions", {"model": self.model, "messages": messages, "tools": tools,
                                                    "temperature": temperature}, timeout)

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


def tool_calls(service: Service, harness: bfcl.Harness, spec: ToolCallSpec, path: str, deadline: Deadline) -> dict:
    """BFCL's cases through the server's own tool parser, one at a time, each answer's tool calls
    judged by BFCL's checker: how many match exactly, and which did not."""
    start = time.monotonic()
    cases = harness.cases(spec.cases, timeout=deadline.left())
    answers: dict[str, list[dict] | None] = {}
    for case in cases:
        with deadline.bounding():
            out = service.chat(case["messages"], case["tools"], spec.temperature, timeout=deadline.left())
        choices = out.get("choices") if isinstance(out, dict) else None
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        answers[case["id"]] = bfcl.tool_calls(first.get("message"))
    judged = harness.score(answers, timeout=deadline.left())
    if not isinstance(judged, dict) or set(judged) != set(spec.cases):
        raise SmokeFailure(f"BFCL's checker did not judge each of the {len(spec.cases)} cases on the {path} path")
    matched = [c for c in spec.cases if isinstance(judged[c], dict) and judged[c].get("valid") is True]
    missed = [{"id": c, "error": untrusted.safe(judged[c].get("error_type") if isinstance(judged[c], dict) else None,
                                                limit=80)} for c in spec.cases if c not in matched]
    return {"path": path, "harness": spec.harness, "cases": len(spec.cases), "matched": len(matched),
            "threshold": spec.threshold, "missed": missed[:12], "seconds": round(time.monotonic() - start, 1)}


# -- speed, with vLLM's benchmark client ---------------------------------------------------------------

@dataclass(frozen=True)
class BenchClient:
    """How `vllm bench serve` is run: argv up to `serve`, and the tokenizer it loads, as that client
    sees the path. On an MI300X: the reference's image (vLLM's own client, not the candidate's: the
    candidate would measure itself) by docker run, its container named in argv as {name}, removed
    after each run whatever happens."""
    argv: tuple[str, ...]
    tokenizer: str
    result_dir: Path  # where the client's --result-dir is, as this host sees it
    result_dir_arg: str  # the same folder as the client sees it

    def args(self, gate: SpeedGate, base_url: str, model: str, filename: str, name: str, prompts: int | None = None,
             input_len: int | None = None, output_len: int | None = None, rate: float | None = None) -> list[str]:
        return [*(a.replace("{name}", name) for a in self.argv), "--backend", "vllm", "--base-url", base_url,
                "--endpoint", "/v1/completions", "--model", model, "--tokenizer", self.tokenizer,
                "--dataset-name", "random", "--random-input-len", str(input_len or gate.input_len),
                "--random-output-len", str(output_len or gate.output_len), "--num-prompts", str(prompts or gate.prompts),
                "--max-concurrency", str(gate.concurrency), "--ignore-eos", "--seed", "0", "--disable-tqdm",
                "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", self.result_dir_arg,
                "--result-filename", filename, *(("--request-rate", str(rate)) if rate else ())]

    def remove(self, name: str) -> None:
        """The client's container, if it runs in one: gone, whether the client ended or was cut off
        (killing `docker run` leaves its container running)."""
        if any("{name}" in a for a in self.argv):
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


RESULT_LIMIT = 4 << 20  # a saved result is a few KiB


def _result(client: BenchClient, filename: str, what: str) -> dict:
    """The client's saved result: a regular file (never through a link the client made), bounded,
    its numbers finite (JSON's Infinity and NaN are refused)."""
    import os
    import stat

    def finite(text: str):
        raise ValueError(f"{text} is no figure")

    try:
        fd = os.open(client.result_dir / filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > RESULT_LIMIT:
                raise ValueError("not a regular file of a few KiB")
            result = json.loads(f.read(RESULT_LIMIT + 1), parse_constant=finite)
        if not isinstance(result, dict):
            raise ValueError("not a JSON object")
        return result
    except (OSError, ValueError, RecursionError) as e:
        raise SmokeFailure(f"vllm bench serve left no usable result for {what}: {untrusted.safe(e, limit=200)}") from None


def _bench(client: BenchClient, argv: list[str], filename: str, name: str, timeout: float, what: str) -> dict:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SmokeFailure(f"the speed stage's {what} ran past its deadline (provenance/smoke.yaml budget_s)") from None
    except OSError as e:
        raise SmokeFailure(f"cannot run vllm bench serve ({argv[0]}): {e}") from None
    finally:
        client.remove(name)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        raise SmokeFailure(f"vllm bench serve failed for {what} (exit {done.returncode}): "
                           f"{untrusted.safe(said[0], limit=200)}")
    return _result(client, filename, what)


def _figure(gate: SpeedGate, result: dict) -> float:
    try:
        if gate.kind == "decode_median_tok_s":
            figure = 1000.0 / float(result["median_tpot_ms"])
        elif gate.kind == "output_tok_s":
            figure = float(result["output_throughput"])
        elif gate.kind == "prefill_tok_s":
            figure = float(result["total_input_tokens"]) / (float(result["mean_ttft_ms"]) / 1000.0) / float(
                result["completed"])
        else:  # ttft_behind_prefill_s
            figure = float(result["median_ttft_ms"]) / 1000.0
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise SmokeFailure(f"vllm bench serve's result for {gate.name} lacks a figure: {e}") from None
    if not math.isfinite(figure) or figure < 0:
        raise SmokeFailure(f"vllm bench serve's result for {gate.name} is no figure ({figure})")
    return round(figure, 3 if gate.kind == "ttft_behind_prefill_s" else 1)


def _behind_a_cold_prefill(client: BenchClient, gate: SpeedGate, service: Service, base_url: str, model: str,
                           filename: str, name: str, deadline: Deadline) -> dict:
    """Short requests, arriving over about four seconds, measured by the client, while a cold prefill of
    gate.input_len tokens (a fresh nonce: nothing cached) is served: the long one is sent the moment
    the client starts its main run, so the shorts queue behind it."""
    import threading

    words = " ".join(f"item{i}" for i in range(gate.input_len))
    cold = threading.Thread(target=lambda: _quietly(service.complete, f"[{uuid.uuid4()}] {words}", 1, 0.0, None,
                                                    deadline.left()), daemon=True)
    argv = client.args(gate, base_url, model, filename, name, prompts=max(gate.prompts, 8), input_len=32,
                       rate=max(gate.prompts, 8) / 4)
    with tempfile.TemporaryFile() as errors:
        try:
            run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)
        except OSError as e:
            raise SmokeFailure(f"cannot run vllm bench serve ({argv[0]}): {e}") from None
        watchdog = threading.Timer(max(0.0, deadline.end - deadline.clock()), run.kill)  # reads have no timeout
        watchdog.start()
        try:
            assert run.stdout is not None  # a pipe, asked for above
            for line in run.stdout:
                if b"Starting main benchmark run" in line:
                    cold.start()
                    break
            run.stdout.read()
            code = run.wait()
        finally:
            watchdog.cancel()
            if run.poll() is None:
                run.kill()
                run.wait()
            client.remove(name)
        deadline.left()  # killed by the watchdog: the deadline's failure, not the client's
        if not cold.is_alive() and cold.ident is None:
            raise SmokeFailure(f"vllm bench serve never started its main run for {gate.name} (exit {code})")
        if code != 0:
            errors.seek(0)
            said = errors.read().decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise SmokeFailure(f"vllm bench serve failed for {gate.name} (exit {code}): "
                               f"{untrusted.safe(said[0], limit=200)}")
    cold.join(timeout=max(0.0, min(60.0, deadline.end - deadline.clock())))
    return _result(client, filename, gate.name)


def _quietly(fn, *args) -> None:
    """A background request whose own failure the gate does not judge (the shorts' TTFT is the figure)."""
    try:
        fn(*args)
    except SmokeFailure:
        pass


def speed(client: BenchClient, gate: SpeedGate, service: Service, deadline: Deadline) -> dict:
    """One speed gate's figure, and whether every request completed."""
    tag = uuid.uuid4().hex[:8]
    filename, name = f"{gate.name}-{tag}.json", f"bakery-bench-{tag}"
    if gate.kind == "ttft_behind_prefill_s":
        result = _behind_a_cold_prefill(client, gate, service, service.base, service.model, filename, name, deadline)
        prompts = max(gate.prompts, 8)
    else:
        result = _bench(client, client.args(gate, service.base, service.model, filename, name), filename, name,
                        deadline.left(), gate.name)
        prompts = gate.prompts
    completed, failed = result.get("completed"), result.get("failed", 0)
    ok_count = isinstance(failed, int) and not isinstance(failed, bool)
    return {"name": gate.name, "figure": _figure(gate, result), "completed": completed, "prompts": prompts,
            "failed": failed if ok_count else None, "acceptance": _acceptance(result)}


def _acceptance(result: dict) -> dict | None:
    """DSpark's accepted tokens per draft over the run, as the client read them from /metrics."""
    drafts, accepted = result.get("spec_decode_num_drafts"), result.get("spec_decode_accepted_tokens")
    if not isinstance(drafts, (int, float)) or not isinstance(accepted, (int, float)) or drafts <= 0:
        return None
    return {"drafts": drafts, "accepted_tokens": accepted, "accepted_per_draft": round(accepted / drafts, 3)}
