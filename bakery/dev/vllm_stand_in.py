"""NOT vLLM: an OpenAI-compatible server that stands in for one decode path of the image on an MI300X,
which this machine does not have. It answers the routes the acceptance gate and `vllm bench serve`
use, deterministically: a completion's tokens are a hash of (path, prompt, temperature, seed, index),
so two stand-ins of one path answer the same bytes, as two servers of one image on one host should.
It can be told to drift one token of one seed, to slow down, or to serve a short context. Asked
for a chat completion with tools, it answers a BFCL case with the tool calls BFCL's own possible
answers hold (bfcl_answers: it knows the answers, as no model does), and can be told to drop some.

    python -m bakery.dev.vllm_stand_in --port 8001 --path dspark [--drift SEED:TEMPERATURE:TOKEN] [--slow S]
        [--tool-answers FILE [--drop-tool-calls N]]

PACE (seconds before each streamed token, plus PACE_PER_STREAM for each stream being served) makes
vLLM's benchmark client measure a steady server rather than this machine's load: at 5 ms and 0.8 ms,
one stream decodes about 170 tok/s, 8 streams about 700 tok/s in all, 64 about 1,100 (the seed's
figures are 168.6, 542 and 830); PREFILL (seconds a prompt token, before a streamed answer) at 50 us
prefills 20,000 tok/s (the seed's 6,988).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
         "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
         "xray", "yankee", "zulu")


@dataclass
class Behaviour:
    """What the stand-in does: its path, and the faults it was told to show."""
    model: str
    path: str = "dspark"
    drift: tuple[int, float, int] | None = None  # (seed, temperature, token index): that token differs
    slow_s: float = 0.0  # added before each token: a slower server
    pace_s: float = 0.0  # added before each streamed token: a steady decode rate for vLLM's benchmark client
    pace_per_stream_s: float = 0.0  # and this much more per stream being served: a batch's cost
    prefill_s_per_token: float = 0.0  # before a streamed answer's first token, per prompt token
    streams: int = 0
    max_context: int = 1 << 20  # prompt tokens (words) it accepts
    tool_answers: dict = field(default_factory=dict)  # answer_key() -> [{name, arguments}]
    drop_tool_calls: int = 0  # the first this many cases asked are answered in words, with no tool call
    counters: dict = field(default_factory=lambda: {"drafts": 0, "accepted": 0, "proposed": 0})
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tokens(self, prompt: str, temperature: float, seed: int | None, n: int) -> list[str]:
        out = []
        for i in range(n):
            h = hashlib.sha256(f"{self.path}\0{prompt}\0{temperature}\0{seed if temperature else 0}\0{i}".encode())
            out.append(" " + WORDS[h.digest()[0] % len(WORDS)])
        if self.drift and self.drift[:2] == (seed, temperature) and self.drift[2] < n:
            out[self.drift[2]] = " drifted"
        return out

    def answer(self, prompt: str, temperature: float, seed: int | None, n: int) -> list[str]:
        if prompt.startswith("Calculate 17 * 23"):
            return [" 391"]
        if "The secret code of vault" in prompt:
            found = re.findall(r"The secret code of vault (\d+) is (\d+)\.", prompt)
            return [f"vault {k}: {code}\n" for k, code in found][:n]
        return self.tokens(prompt, temperature, seed, n)

    def tool_call(self, messages: list, tools: list) -> list[dict] | None:
        asked = next((m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"), "")
        names = [t.get("function", {}).get("name", "") for t in tools if isinstance(t, dict)]
        calls = self.tool_answers.get(answer_key(str(asked), names))
        with self.lock:
            if calls is not None and self.drop_tool_calls > 0:
                self.drop_tool_calls -= 1
                return None
        return calls

    def count(self, produced: int) -> None:
        if self.path != "dspark":
            return
        with self.lock:  # DSpark-7: a draft per step, about three of its seven tokens accepted
            drafts = max(1, produced // 4)
            self.counters["drafts"] += drafts
            self.counters["proposed"] += 7 * drafts
            self.counters["accepted"] += produced - drafts


def answer_key(question: str, tool_names: list[str]) -> str:
    return question + "\0" + ",".join(sorted(tool_names))


def bfcl_answers(python: str, ids: tuple[str, ...]) -> dict:
    """{answer_key: tool calls} for BFCL cases, from BFCL's own data in the venv of `python`
    (bakery/release/bfcl.py): each call's name as the OpenAI style sends it (dots made underscores),
    each parameter's first possible value (one whose only value is "" left out)."""
    where = subprocess.run([python, "-I", "-c", "import importlib.util; "
                            "print(importlib.util.find_spec('bfcl_eval').submodule_search_locations[0])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    wanted, out = set(ids), {}
    for name in ("BFCL_v4_simple_python.json", "BFCL_v4_multiple.json"):
        with open(f"{where}/data/{name}") as q, open(f"{where}/data/possible_answer/{name}") as a:
            truth = {row["id"]: row["ground_truth"] for row in map(json.loads, a)}
            for case in map(json.loads, q):
                if case["id"] not in wanted:
                    continue
                names = [f["name"].replace(".", "_") for f in case["function"]]
                calls = []
                for call in truth[case["id"]]:
                    (function, params), = call.items()
                    args = _first_of_each(params)
                    calls.append({"name": function.replace(".", "_"), "arguments": json.dumps(args)})
                out[answer_key(next(m["content"] for m in case["question"][0] if m["role"] == "user"), names)] = calls
    return out


def _first_of_each(options: dict) -> dict:
    """Each parameter's first possible value (a dict's own values chosen alike); "" means it may be left out."""
    chosen = {}
    for name, values in options.items():
        value = next((v for v in values if v != ""), None)
        if value is not None:
            chosen[name] = _first_of_each(value) if isinstance(value, dict) else value
    return chosen


def server(behaviour: Behaviour, port: int = 0) -> ThreadingHTTPServer:
    """The stand-in, listening on 127.0.0.1:port (0: any free port); serve_forever() runs it."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _json(self, code: int, body) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/v1/models":
                return self._json(200, {"object": "list", "data": [{"id": behaviour.model, "object": "model"}]})
            if self.path == "/metrics":
                c = behaviour.counters
                text = (f"vllm:spec_decode_num_drafts_total{{model_name=\"{behaviour.model}\"}} {c['drafts']}\n"
                        f"vllm:spec_decode_num_draft_tokens_total{{model_name=\"{behaviour.model}\"}} {c['proposed']}\n"
                        f"vllm:spec_decode_num_accepted_tokens_total{{model_name=\"{behaviour.model}\"}} {c['accepted']}\n"
                        if behaviour.path == "dspark" else "")
                data = ("# stand-in, not vLLM\n" + text).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return self.wfile.write(data)
            return self._json(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/v1/chat/completions":
                calls = behaviour.tool_call(body.get("messages") or [], body.get("tools") or [])
                message = {"role": "assistant", "content": None if calls else "I cannot call a tool for that.",
                           "tool_calls": [{"id": f"call-{i}", "type": "function", "function": call}
                                          for i, call in enumerate(calls or [])]}
                return self._json(200, {"id": "chatcmpl-stand-in", "object": "chat.completion",
                                        "model": behaviour.model, "choices": [
                                            {"index": 0, "message": message,
                                             "finish_reason": "tool_calls" if calls else "stop"}]})
            if self.path != "/v1/completions":
                return self._json(404, {"error": "not found"})
            prompt, n = body.get("prompt", ""), int(body.get("max_tokens") or 16)
            temperature, seed = float(body.get("temperature", 1.0)), body.get("seed")
            prompt_tokens = len(prompt.split())
            if prompt_tokens > behaviour.max_context:
                return self._json(400, {"error": {"message": f"prompt of {prompt_tokens} tokens exceeds the context"}})
            tokens = behaviour.answer(prompt, temperature, seed, n)
            behaviour.count(len(tokens))
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                     "total_tokens": prompt_tokens + len(tokens)}
            if not body.get("stream"):
                time.sleep(behaviour.slow_s * len(tokens))
                choice = {"index": 0, "text": "".join(tokens), "finish_reason": "length"}
                if body.get("logprobs") is not None:
                    choice["logprobs"] = {"tokens": tokens, "token_logprobs": [0.0] * len(tokens)}
                return self._json(200, {"id": "cmpl-stand-in", "object": "text_completion", "model": behaviour.model,
                                        "choices": [choice], "usage": usage})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def event(obj) -> None:
                data = f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            # each token is due at a time fixed from the stream's start: a late wake-up (a busy machine)
            # makes one token late, not every token after it, so the client measures the pace
            due = time.monotonic() + behaviour.prefill_s_per_token * prompt_tokens
            with behaviour.lock:
                behaviour.streams += 1
            try:
                for token in tokens:
                    due += behaviour.slow_s + behaviour.pace_s + behaviour.pace_per_stream_s * behaviour.streams
                    time.sleep(max(0.0, due - time.monotonic()))
                    event({"id": "cmpl-stand-in", "object": "text_completion", "model": behaviour.model,
                           "choices": [{"index": 0, "text": token, "finish_reason": None}]})
            finally:
                with behaviour.lock:
                    behaviour.streams -= 1
            event({"id": "cmpl-stand-in", "object": "text_completion", "model": behaviour.model,
                   "choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage})
            event("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

    class Server(ThreadingHTTPServer):
        request_queue_size = 256  # a 64-stream burst connects at once: socketserver's backlog of 5 drops SYNs
        daemon_threads = True

    return Server(("127.0.0.1", port), Handler)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="deepseek-ai/DeepSeek-V4-Flash-0731")
    parser.add_argument("--path", choices=("dspark", "native"), default="dspark")
    parser.add_argument("--drift", help="SEED:TEMPERATURE:TOKEN: that token of that output differs")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds added before each token")
    parser.add_argument("--pace", type=float, default=0.005, help="seconds before each streamed token")
    parser.add_argument("--pace-per-stream", type=float, default=0.0008, help="and this more per stream served")
    parser.add_argument("--prefill", type=float, default=0.00005, help="seconds per prompt token before streaming")
    parser.add_argument("--tool-answers", help="a JSON file of bfcl_answers(): the tool calls it serves")
    parser.add_argument("--drop-tool-calls", type=int, default=0, help="the first N cases asked get no tool call")
    args = parser.parse_args(argv)
    drift = None
    if args.drift:
        seed, temperature, token = args.drift.split(":")
        drift = (int(seed), float(temperature), int(token))
    answers = json.loads(open(args.tool_answers).read()) if args.tool_answers else {}
    server(Behaviour(args.model, args.path, drift, args.slow, args.pace, args.pace_per_stream, args.prefill,
                     tool_answers=answers, drop_tool_calls=args.drop_tool_calls), args.port).serve_forever()


if __name__ == "__main__":
    main()
