"""The MI300X acceptance gate, without an MI300X. NOT vLLM: bakery/dev/vllm_stand_in.py serves each
path of each side, deterministically by seed, and can be told to drift one token, to slow down. What
is real: vLLM 0.26.0's own benchmark client (`vllm bench serve`) measures the speed figures against
it, the gate's A/B, verdict and signed result, and `invoke smoke` and `invoke verify` as ops run them.
The drills are the issue's: each ends as it must."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from pathlib import Path

import pytest

from bakery.dev import vllm_stand_in
from bakery.errors import InputError, SmokeFailure
from bakery.release import ab, bfcl, gate, smoke, smoke_report, smoke_spec, step_summary
from support import ROOT, invoke

SPEC = smoke_spec.load_spec(ROOT / "provenance" / "smoke.yaml")
MODEL = SPEC.model


# Two stand-ins on one busy 2-core machine differ in speed by noise, not by server: the candidate
# may be this much slower than the reference here (the committed spec says 5%).
NOISE = 0.5


def small(spec: smoke_spec.SmokeSpec = SPEC, gates=("decode-1-stream",), **over) -> smoke_spec.SmokeSpec:
    """The committed spec with short outputs and light loads (the 120 seeds stay), and only the
    speed gates named: seconds, not hours."""
    kept = tuple(dataclasses.replace(g, prompts=min(g.prompts, max(4, g.concurrency)), input_len=min(g.input_len, 2048),
                                     output_len=min(g.output_len, 32 if g.concurrency == 1 else 128))
                 for g in spec.speed.gates if g.name in gates)
    light = dataclasses.replace(spec, ab=dataclasses.replace(spec.ab, max_tokens=24),
                                needles=dataclasses.replace(spec.needles, prompt_tokens=4096),
                                speed=dataclasses.replace(spec.speed, gates=kept, versus_reference=NOISE))
    return dataclasses.replace(light, **over)


class StandIns:
    """One stand-in per (side, path), on loopback; stopped by the fixture."""

    def __init__(self, harness: str, answers: dict):
        self.servers: list = []
        self.harness, self.answers = bfcl.Harness(harness), answers

    def start(self, path: str, **behaviour) -> str:
        """A stand-in of one path, its streamed tokens paced (vllm_stand_in's docstring), so that the
        benchmark client measures the pace, not this machine's load."""
        paced = {"pace_s": 0.005, "pace_per_stream_s": 0.0008, "prefill_s_per_token": 0.00005,
                 "tool_answers": self.answers, **behaviour}
        server = vllm_stand_in.server(vllm_stand_in.Behaviour(MODEL, path, **paced))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    def pair(self, candidate: dict | None = None) -> dict:
        """The gate's servers: reference and candidate, each path; candidate: {path: behaviour}."""
        out = {}
        for path in SPEC.paths:
            out[("reference", path)] = smoke.Endpoint(self.start(path))
            out[("candidate", path)] = smoke.Endpoint(self.start(path, **(candidate or {}).get(path, {})))
        return out


@pytest.fixture
def stand_ins(bfcl_harness):
    s = StandIns(*bfcl_harness)
    yield s
    for server in s.servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def bench(bench_client, tmp_path) -> gate.BenchClient:
    command, tokenizer = bench_client
    results = tmp_path / "bench"
    results.mkdir()
    return gate.BenchClient((str(command),), str(tokenizer), results, str(results))


def run_gate(stand_ins, servers, spec=None, same_base=True, approvals=None, bench=None, kind="endpoint"):
    return smoke.run(f"127.0.0.1:5000/test/cand@sha256:{'c' * 64}", spec or small(), servers,
                     smoke_report.Reference(kind, None, None), same_base, approvals, bench, stand_ins.harness,
                     vram=lambda: 0, log=lambda m: None)


def failed(report) -> dict[str, str]:
    return {c.name: c.detail for c in report.failed}


# -- the A/B, pure --------------------------------------------------------------------------------------

def test_a_difference_is_named_by_its_first_token_or_character():
    def c(text, tokens=None, seed=3):
        return ab.Completion("dspark", 1.0, seed, text, tokens)

    assert ab.first_difference(c(" a b", (" a", " b")), c(" a b", (" a", " b"))) is None
    d = ab.first_difference(c(" a x c", (" a", " x", " c")), c(" a b c", (" a", " b", " c")))
    assert d is not None and (d.token, d.candidate, d.reference) == (1, " x", " b")
    assert f"seed 3 on the dspark path at temperature 1: token 1 is ' x', the reference's ' b' (output " \
           f"sha256:{hashlib.sha256(b' a x c').hexdigest()})" == d.line()
    # the same text cut into other tokens differs (a tokenizer change is a change)
    assert ab.first_difference(c(" ab", (" a", "b")), c(" ab", (" ab",))) is not None
    # no tokens listed: characters; a shorter output differs where it ends
    d = ab.first_difference(c("abc"), c("abcd"))
    assert d is not None and (d.token, d.candidate, d.reference) == (3, "", "d")


def test_both_sides_must_answer_the_same_requests():
    one = [ab.Completion("dspark", 1.0, s, "x", None) for s in range(3)]
    with pytest.raises(InputError, match="seed 2 on the dspark path at temperature 1 is on one side only"):
        ab.compare(one, one[:2], ("dspark",))


def test_approvals_are_checked_on_load(tmp_path):
    f = tmp_path / "approvals.yaml"
    out = "sha256:" + "ab" * 32
    f.write_text(f"approved:\n  - {{path: dspark, seed: 17, temperature: 1.0, output: '{out}', reason: reviewed by ops}}\n")
    loaded = ab.load_approvals(f)
    assert loaded.entries == {("dspark", 1.0, 17, out)} and loaded.sha256 == hashlib.sha256(f.read_bytes()).hexdigest()
    f.write_text(f"approved:\n  - {{path: dspark, seed: 17, temperature: 1.0, output: '{out}', reason: ' '}}\n")
    with pytest.raises(InputError, match=r"approved\[0\]: path, seed, temperature, output and a reason"):
        ab.load_approvals(f)
    f.write_text("approved:\n  - {path: dspark, seed: 17, temperature: 1.0, output: 'seed 17', reason: reviewed}\n")
    with pytest.raises(InputError, match=r"approved\[0\]: output is the approved output's sha256:<64 hex>"):
        ab.load_approvals(f)
    assert ab.load_approvals(ROOT / "provenance" / "smoke-approvals.yaml").entries == frozenset()


def test_the_committed_spec_is_the_seeds_gate():
    """120 seeds x 512 tokens at temperature 1.0 and 0 on both paths, a 256K needle prompt, and the
    seed's published figures, each with its source."""
    assert (SPEC.ab.seeds, SPEC.ab.max_tokens, SPEC.ab.temperatures, SPEC.paths) == (120, 512, (1.0, 0.0),
                                                                                      ("dspark", "native"))
    assert len(SPEC.ab.requests()) == 240 and SPEC.needles.prompt_tokens == 262144
    figures = {g.name: g.seed_figure for g in SPEC.speed.gates}
    assert figures == {"decode-1-stream": 168.6, "aggregate-8-streams": 542.0, "burst-64-streams": 830.0,
                       "fresh-prefill": 6988.0, "ttft-behind-cold-prefill": 0.5}
    assert all(g.source for g in SPEC.speed.gates) and SPEC.budget_total_s == 5 * 3600


def test_a_time_against_the_reference_allows_its_slack_beyond_the_percentage():
    """CI at c0449ba failed the committed spec on 9 ms against the reference's 8: 5% of a few
    milliseconds is scheduling, not speed. A time may be 5% and 20 ms over the reference's."""
    def checks(mine: float, theirs: float) -> dict:
        row = {"name": "ttft-behind-cold-prefill", "completed": 8, "prompts": 8, "failed": 0}
        found = smoke_report._speed_checks(SPEC, [{**row, "figure": mine}], [{**row, "figure": theirs}])
        return {c.name: c for c in found}

    near = checks(0.009, 0.008)["speed:ttft-behind-cold-prefill:versus-reference"]
    assert near.ok and near.threshold == 0.028 and "plus 0.02 s" in near.detail  # 0.0084 + 0.02, to the ms
    assert not checks(0.15, 0.1)["speed:ttft-behind-cold-prefill:versus-reference"].ok  # past 0.125


@pytest.mark.parametrize("edit, says", [
    (("paths: [dspark, native]", "paths: [dspark, turbo]"), "paths must name each of dspark, native"),
    (("seeds: 120", "seeds: true"), "ab.seeds must be an integer"),
    (("temperatures: [1.0, 0.0]", "temperatures: [1.0, hot]"), r"ab.temperatures\[1\] must be a number"),
    (("kind: output_tok_s, concurrency: 8", "kind: vibes, concurrency: 8"), "kind must be one of"),
    (("seed_figure: 542.0", "seed_figure: null"), r"speed.gates\[1\]: seed_figure must be a number"),
    (("budget_s: {ab: 1800, quality: 1800, speed: 1800}", "budget_s: {ab: 1800}"), "budget_s must name each"),
    (("vram_limit_bytes: 200500000000", "vram_limit_bytes: null"), "vram_limit_bytes must be a int"),
    (("depths: [0.05, 0.35, 0.65, 0.95]", "depths: [0.05, 1.5]"), r"needles.depths\[1\] must be between 0 and 1"),
])
def test_a_smoke_spec_of_another_shape_is_one_input_error(tmp_path, edit, says):
    text = (ROOT / "provenance" / "smoke.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "smoke.yaml").write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(InputError, match=says):
        smoke_spec.load_spec(tmp_path / "smoke.yaml")


def test_the_native_path_is_the_image_command_without_its_speculative_config():
    cmd = ["/models/m", "--block-size=256", '--speculative-config={"method": "dspark"}', "--port=8000"]
    assert smoke.path_command(cmd, "dspark") == cmd
    assert smoke.path_command(cmd, "native") == ["/models/m", "--block-size=256", "--port=8000"]
    assert smoke.path_command(["--speculative-config", "{}", "x"], "native") == ["x"]


def test_endpoints_are_one_url_per_path():
    assert smoke.parse_endpoints(["dspark=http://h:1/", "native=http://h:2"], SPEC.paths, "--endpoint") == {
        "dspark": smoke.Endpoint("http://h:1"), "native": smoke.Endpoint("http://h:2")}
    for given, says in ((["dspark=http://h:1"], "missing native"), (["turbo=http://h:1"], "PATH one of"),
                        (["dspark=http://h:1", "dspark=http://h:2"], "dspark named twice"),
                        (["dspark=ftp://h"], "PATH=URL")):
        with pytest.raises(InputError, match=says):
            smoke.parse_endpoints(given, SPEC.paths, "--endpoint")


def test_the_needle_prompt_hides_each_needle_at_its_depth():
    import random

    prompt, codes = gate.needle_prompt(SPEC.needles, random.Random(1))
    words = prompt.split()
    assert len(words) >= SPEC.needles.prompt_tokens and len(codes) == len(SPEC.needles.depths)
    for (k, code), depth in zip(codes.items(), SPEC.needles.depths, strict=True):
        at = prompt.index(f"vault {k} is {code}.") / len(prompt)
        assert abs(at - depth) < 0.01, (k, at, depth)


# -- the drills, against stand-ins ---------------------------------------------------------------------

def test_identical_outputs_pass_with_every_figure_in_the_result(stand_ins, bench):
    report = run_gate(stand_ins, stand_ins.pair(), spec=small(gates=("decode-1-stream", "burst-64-streams")),
                      bench=bench)
    assert report.result == "PASSED", failed(report)
    written = report.to_json()
    tools = next(c for c in written["checks"] if c["name"] == "tool-calls:native")
    assert (tools["figure"], tools["threshold"]) == (90, 72)  # the stand-in serves BFCL's own answers
    assert [(r["path"], r["compared"], r["differing"]) for r in written["ab"]["paths"]] == [
        ("dspark", 240, 0), ("native", 240, 0)]
    names = {c["name"] for c in written["checks"]}
    assert {"ab:dspark", "ab:native", "arithmetic:dspark", "needles:native", "tool-calls:dspark", "dspark-acceptance",
            "speed:decode-1-stream", "speed:burst-64-streams:versus-reference"} <= names
    decode = next(c for c in written["checks"] if c["name"] == "speed:decode-1-stream")
    assert decode["threshold"] == pytest.approx(168.6 * 0.9) and decode["figure"] > decode["threshold"]
    acceptance = next(c for c in written["checks"] if c["name"] == "dspark-acceptance")
    assert acceptance["figure"] > 0  # read by vLLM's client from the stand-in's /metrics
    assert written["launched_container"] is False and "vram:dspark" not in names


def test_one_drifted_token_fails_naming_seed_path_and_token(stand_ins, bench):
    servers = stand_ins.pair({"dspark": {"drift": (17, 1.0, 5)}})
    report = run_gate(stand_ins, servers, bench=bench)
    assert report.result == "FAILED"
    said = failed(report)
    assert set(said) == {"ab:dspark"}, said
    assert "240 outputs compared, 1 differ (0 approved)" in said["ab:dspark"]
    assert "seed 17 on the dspark path at temperature 1: token 5 is ' drifted'" in said["ab:dspark"]
    row = next(r for r in report.to_json()["ab"]["paths"] if r["path"] == "dspark")
    first = row["first_differences"][0]
    assert first == {"path": "dspark", "temperature": 1.0, "seed": 17, "token": 5, "candidate": " drifted",
                     "reference": first["reference"], "output": first["output"]}
    assert f"(output {first['output']})" in said["ab:dspark"]


def test_an_approved_drift_passes_and_the_approval_is_signed(stand_ins, bench, tmp_path):
    """An approval names the output it lets through: the same seed drifted elsewhere is not approved."""
    drifted = run_gate(stand_ins, stand_ins.pair({"dspark": {"drift": (17, 1.0, 5)}}), bench=bench)
    output = drifted.to_json()["ab"]["paths"][0]["first_differences"][0]["output"]
    approvals = tmp_path / "approvals.yaml"
    approvals.write_text(f"approved:\n  - {{path: dspark, seed: 17, temperature: 1.0, output: '{output}', "
                         f"reason: reviewed}}\n")
    loaded = ab.load_approvals(approvals)
    elsewhere = run_gate(stand_ins, stand_ins.pair({"dspark": {"drift": (17, 1.0, 9)}}), approvals=loaded, bench=bench)
    assert elsewhere.result == "FAILED" and "1 differ (0 approved)" in failed(elsewhere)["ab:dspark"]
    report = run_gate(stand_ins, stand_ins.pair({"dspark": {"drift": (17, 1.0, 5)}}), approvals=loaded, bench=bench)
    assert report.result == "PASSED", failed(report)
    from bakery.oci.refs import Reference

    ref = Reference.parse(report.image)
    statement = json.loads(smoke_report.statement(ref, report.to_json(), b"spec"))
    assert {"name": "approvals", "digest": {"sha256": loaded.sha256}} in statement["predicate"]["configuration"]
    assert statement["predicate"]["report"]["ab"]["approvals_sha256"] == loaded.sha256


def test_another_base_reports_divergence_and_lets_quality_and_speed_decide(stand_ins):
    servers = stand_ins.pair({"native": {"drift": (3, 0.0, 0)}})
    report = run_gate(stand_ins, servers, spec=small(gates=()), same_base=False)
    detail = {c.name: c.detail for c in report.checks}
    assert "another base: 1 of 240 outputs diverge" in detail["ab:native"]
    # the A/B does not fail it; no speed stage ran here (no client given), and that alone fails the gate
    assert report.result == "FAILED" and set(failed(report)) == {"speed"}


def test_throughput_under_its_threshold_fails_naming_the_stage(stand_ins, bench):
    spec = small(ab=dataclasses.replace(SPEC.ab, seeds=12, max_tokens=24))  # the stand-in is slow for every request
    report = run_gate(stand_ins, stand_ins.pair({"dspark": {"slow_s": 0.012}}), spec=spec, bench=bench)
    said = failed(report)
    assert report.result == "FAILED" and "speed:decode-1-stream" in said, said
    assert "against 151.74 (the seed's 168.6 less 10%" in said["speed:decode-1-stream"]
    # about 56 tok/s against the reference's 170: far past the noise allowed here
    assert "speed:decode-1-stream:versus-reference" in said
    assert not any(name.startswith("ab:") for name in said)  # slower, not different


def test_tool_calls_under_their_threshold_fail(stand_ins):
    """20 of the 90 BFCL cases answered in words on the candidate's DSpark path: 70 matched, under 72."""
    report = run_gate(stand_ins, stand_ins.pair({"dspark": {"drop_tool_calls": 20}}), spec=small(gates=()))
    said = failed(report)
    assert set(said) == {"tool-calls:dspark", "speed"}, said  # no client given: no speed stage either
    assert said["tool-calls:dspark"].startswith("70 of 90 BFCL cases matched exactly (bfcl-eval==2026.3.23), "
                                                "at least 72 needed"), said
    dspark = next(r for r in report.to_json()["servers"] if r["side"] == "candidate" and r["path"] == "dspark")
    assert dspark["tool_calls"]["missed"][0] == {"id": "simple_python_0", "error": "ast_decoder:no_tool_call"}


def test_bfcl_judges_each_served_answer(bfcl_harness):
    """BFCL's own checker, as the gate runs it (its cases, its AST checker), on answers a server
    could give: the right call, a wrong value, another function, arguments that are no JSON, and
    none. The request is BFCL's own: a dotted name sent as OpenAI allows it, the language hint."""
    harness = bfcl.Harness(bfcl_harness[0])
    [case] = harness.cases(("multiple_0",))
    assert case["messages"] == [{"role": "user", "content": "Can I find the dimensions and properties of a triangle, "
                                 "if I know its three sides are 5 units, 4 units and 3 units long?"}]
    names = [t["function"]["name"] for t in case["tools"]]
    assert "triangle_properties_get" in names and all("." not in n for n in names)
    assert case["tools"][0]["function"]["description"].endswith("Note that the provided function is in Python 3 syntax.")

    def call(name, args):
        return [{"name": name, "arguments": args}]

    judged = harness.score({"multiple_0": call("triangle_properties_get", '{"side1": 5, "side2": 4, "side3": 3}'),
                            "multiple_1": None,
                            "simple_python_0": call("calculate_triangle_area", '{"base": 10, "height": 6}'),
                            "simple_python_1": call("calculate_triangle_area", '{"base": 10, "height": 5}'),
                            "simple_python_2": call("calculate_triangle_area", "{base: 10")})
    assert judged["multiple_0"] == {"valid": True, "error_type": None}
    assert judged["multiple_1"] == {"valid": False, "error_type": "ast_decoder:no_tool_call"}
    assert judged["simple_python_0"] == {"valid": False, "error_type": "value_error:others"}
    assert judged["simple_python_1"] == {"valid": False, "error_type": "simple_function_checker:wrong_func_name"}
    assert judged["simple_python_2"]["valid"] is False and judged["simple_python_2"]["error_type"].startswith(
        "ast_decoder:decoder_failed")


def test_a_hostile_servers_nesting_is_a_miss_or_one_line_not_a_crash(bfcl_harness):
    """Found by the attacker review: an answer nested past Python's recursion limit crashed the gate
    (no report) or the harness (every case lost). Now one case's miss, or the stage's one line."""
    import http.server

    deep = "[" * 200_000 + "]" * 200_000
    judged = bfcl.Harness(bfcl_harness[0]).score({
        "simple_python_0": [{"name": "calculate_triangle_area", "arguments": '{"base": ' + deep + "}"}],
        "simple_python_1": [{"name": "calculate_triangle_area", "arguments": '{"base": 10, "height": 5}'}]})
    assert judged["simple_python_0"] == {"valid": False, "error_type": "ast_decoder:decoder_failed (RecursionError)"}
    assert judged["simple_python_1"] == {"valid": False, "error_type": "simple_function_checker:wrong_func_name"}

    class Nested(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))  # all of it: else the close resets
            body = deep.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Nested)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        service = gate.Service(f"http://127.0.0.1:{server.server_address[1]}", MODEL)
        with pytest.raises(SmokeFailure, match="answered no JSON we read"):
            service.chat([{"role": "user", "content": "x"}], [], 0.0)
    finally:
        server.shutdown()
        server.server_close()


def test_the_tool_call_spec_pins_the_harness_it_runs():
    pinned = next(line.split()[0] for line in (ROOT / "requirements" / "bfcl.txt").read_text().splitlines()
                  if line.startswith("bfcl-eval=="))
    cases = SPEC.tool_calls.cases
    assert SPEC.tool_calls.harness == pinned and len(cases) == 90
    assert sum(c.startswith("simple_python_") for c in cases) == sum(c.startswith("multiple_") for c in cases) == 45


def test_a_missed_needle_or_a_wrong_sum_fails(stand_ins):
    class Forgetful(vllm_stand_in.Behaviour):
        def answer(self, prompt, temperature, seed, n):
            out = super().answer(prompt, temperature, seed, n)
            return out[:-1] if "secret code" in prompt else out

    server = vllm_stand_in.server(Forgetful(MODEL, "native"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stand_ins.servers.append(server)
    service = gate.Service(f"http://127.0.0.1:{server.server_address[1]}", MODEL)
    got = gate.needles(service, small().needles, "native", gate.Deadline("quality", 60))
    assert (got["needles"], got["recalled"], got["missed_depths"]) == (4, 3, [0.95])
    with pytest.raises(SmokeFailure, match="answered HTTP 400: .*exceeds the context"):  # a short context fails
        gate.needles(gate.Service(stand_ins.start("native", max_context=1000), MODEL), small().needles, "native",
                     gate.Deadline("quality", 60))


def test_a_stage_past_its_deadline_fails_and_leaves_no_passed(stand_ins):
    spec = small(budget_s={"ab": 1, "quality": 60, "speed": 60})
    report = run_gate(stand_ins, stand_ins.pair({"dspark": {"slow_s": 0.001}}), spec=spec)
    said = failed(report)
    assert report.result == "FAILED"
    assert "ran past its deadline" in said["serve:candidate:dspark"] and "ab (candidate, dspark path)" in \
        said["serve:candidate:dspark"]


def test_a_server_that_answers_5xx_is_one_inert_line(stand_ins):
    class Hostile(vllm_stand_in.Behaviour):
        def answer(self, prompt, temperature, seed, n):
            raise RuntimeError

    server = vllm_stand_in.server(Hostile(MODEL, "dspark"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stand_ins.servers.append(server)
    service = gate.Service(f"http://127.0.0.1:{server.server_address[1]}", MODEL)
    with pytest.raises(SmokeFailure) as e:
        service.complete("x", 1)
    assert "\n" not in str(e.value)


def test_the_summary_page_shows_a_drift_inert(stand_ins):
    """A drifted token is the candidate's text: on the run's summary page it must not become Markdown
    or a workflow command."""
    hostile = "x | ::error::passed ![i](http://a/b)"
    report = run_gate(stand_ins, stand_ins.pair(), spec=small(gates=()))
    written = report.to_json()
    written["ab"]["paths"][0]["first_differences"] = [{"seed": hostile, "token": 0}]
    written["checks"][0]["detail"] = hostile
    written["checks"][0]["ok"] = False
    page = step_summary.smoke(written)
    # a file, not the log: the runner reads no workflow command in it; Markdown is what must stay inert
    assert "](http" not in page and "![" not in page and "x \\| " in page
    assert page.startswith("## MI300X acceptance gate: FAILED")


# -- as ops run it: invoke smoke, the signed result, invoke verify ---------------------------------------

def test_invoke_smoke_against_endpoints_signs_the_numbers(stand_ins, bench_client, bfcl_harness, tmp_path):
    """The first-release drill: the reference is the seed-style stack named by the build record;
    here both sides are stand-ins at endpoints, so the result says the gate launched no container.
    The committed spec runs whole (120 x 512 per path and side, the 256K needles, every speed gate)."""
    from support import copy_project

    project = copy_project(tmp_path / "p")
    command, tokenizer = bench_client
    servers = stand_ins.pair()
    image = f"127.0.0.1:5000/test/cand@sha256:{'c' * 64}"
    record = _record_of(image, tmp_path / "build-record.json")
    env = {"BAKERY_KEY_PASSWORD": "pw", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    assert invoke(project, "keygen", "--role", "smoke", "--out", str(tmp_path / "k"), env=env).returncode == 0
    args = ["smoke", image, "--reference", "seed-stack", "--record", str(record), "--report", str(tmp_path / "r.json"),
            "--bench-client", str(command), "--tokenizer", str(tokenizer), "--bfcl", bfcl_harness[0], "--attest",
            "--key", str(tmp_path / "k" / "smoke.key"), "--envelope", str(tmp_path / "smoke.dsse")]
    for (side, path), endpoint in servers.items():
        args += ["--endpoint" if side == "candidate" else "--reference-endpoint", f"{path}={endpoint.url}"]
    done = invoke(project, *args, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"PASSED {image} against seed-stack (dspark 240/240 same, native 240/240 same)"
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["reference"]["kind"] == "seed-stack" and written["launched_container"] is False
    page = (tmp_path / "summary.md").read_text()
    assert "| dspark | 240 | 0 | 0 |" in page and "speed:decode-1-stream" in page and "`█" in page
    envelope = json.loads((tmp_path / "smoke.dsse").read_text())
    import base64

    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["predicate"]["result"] == "PASSED"
    assert statement["predicate"]["report"]["ab"]["paths"][0]["compared"] == 240


def _record_of(image: str, where: Path) -> Path:
    """A build record naming the candidate's digest (the committed test record, re-aimed): all the
    seed-stack reference reads of it with endpoints is the digest and the base."""
    doc = json.loads((ROOT / "tests" / "data" / "build-record.json").read_text())
    doc["manifest"]["digest"] = image.split("@", 1)[1]
    where.write_text(json.dumps(doc))
    return where


def test_invoke_smoke_without_an_mi300x_or_endpoints_says_so(tmp_path):
    done = invoke(ROOT, "smoke", f"127.0.0.1:5000/x@sha256:{'c' * 64}", "--reference", "seed-stack",
                  "--model-dir", str(tmp_path))
    assert done.returncode == 6 and "no MI300X here" in done.stderr and "--endpoint PATH=URL" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
