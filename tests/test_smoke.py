"""The MI300X smoke gate. There is no MI300X here: `invoke smoke` must say so and stop. What does
not need the GPU is tested for real: the log watcher on recorded vLLM log streams, the HTTP checks
against a local server standing in for vLLM, and the container launch on the real Docker engine."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bakery.errors import SmokeFailure
from bakery.release import smoke, smoke_log, smoke_report, smoke_spec
from support import ROOT, dev_policy, docker, invoke, last_line

LOGS = ROOT / "tests" / "data" / "vllm-logs"
SPEC = smoke_spec.load_spec(ROOT / "provenance" / "smoke.yaml")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def replay(name: str, speculative: bool = True, deadline: float = 900, clock=None) -> smoke_log.LogWatcher:
    watcher = smoke_log.LogWatcher(speculative, deadline, **({"clock": clock} if clock else {}))
    for line in (LOGS / name).read_text().splitlines():
        watcher.feed(line)
    return watcher


def test_no_mi300x_here_says_so_in_one_line(tmp_path):
    snapshot = tmp_path / SPEC.revision
    snapshot.mkdir()
    result = invoke(ROOT, "smoke", "127.0.0.1:5000/x/y@sha256:" + "a" * 64, "--model-dir", str(snapshot))
    assert result.returncode == 6
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "error: no MI300X here: /dev/kfd does not exist (no AMD GPU driver on this host); "
        "run invoke smoke on an MI300X host"]


def test_gfx942_detection_reads_kfd_topology(tmp_path):
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    node = tmp_path / "nodes" / "1"
    node.mkdir(parents=True)
    (node / "properties").write_text("cpu_cores_count 0\ngfx_target_version 90402\n")
    assert smoke.mi300x_present(str(kfd), str(tmp_path / "nodes")) is None
    (node / "properties").write_text("gfx_target_version 90401\n")  # MI300A-class, not gfx942
    assert "no node" in (smoke.mi300x_present(str(kfd), str(tmp_path / "nodes")) or "")


def test_host_facts_from_kfd_topology(tmp_path):
    """What the signed result says the host is. No MI300X here: the tree is written by hand in KFD's
    sysfs format, with an MI300X's numbers (gfx_target_version 90402; 1216 SIMDs, 4 per CU: 304 CUs)
    after a CPU node, as KFD lists them."""
    nodes = tmp_path / "nodes"
    for n, props in (("0", "cpu_cores_count 96\nsimd_count 0\ngfx_target_version 0\n"),
                     ("1", "cpu_cores_count 0\nsimd_count 1216\nsimd_per_cu 4\ngfx_target_version 90402\n"),
                     ("2", "cpu_cores_count 0\nsimd_count 1216\nsimd_per_cu 4\ngfx_target_version 90402\n")):
        (nodes / n).mkdir(parents=True)
        (nodes / n / "properties").write_text(props)
    (tmp_path / "amdgpu-version").write_text("6.10.5\n")
    (tmp_path / "rocm-version").write_text("6.4.1-120\n")
    facts = smoke.host_facts(str(nodes), str(tmp_path / "amdgpu-version"), str(tmp_path / "rocm-version"))
    assert {k: facts[k] for k in ("gpus", "gfx_arch", "compute_units", "driver_version", "rocm_version")} == \
        {"gpus": 2, "gfx_arch": "gfx942", "compute_units": 304, "driver_version": "6.10.5", "rocm_version": "6.4.1-120"}
    (nodes / "1" / "properties").write_text("simd_count 440\nsimd_per_cu 4\ngfx_target_version 90010\n")
    assert smoke.host_facts(str(nodes), "/nonexistent", "/nonexistent")["gfx_arch"] == "gfx90a"  # MI250X
    none = smoke.host_facts(str(tmp_path / "nowhere"), "/nonexistent", "/nonexistent")
    assert none["gpus"] == 0 and none["gfx_arch"] is None and none["rocm_version"] == "no ROCm install on the host"


# -- the log watcher on recorded streams -------------------------------------------------------------

def test_healthy_start_in_order_with_benign_aiter_lines():
    watcher = replay("healthy.log")
    assert watcher.healthy
    assert [s[0] for s in watcher.seen] == [n for n, _ in smoke_log.HEALTH]


def test_without_speculation_the_dspark_line_is_not_needed():
    assert replay("no-speculation.log", speculative=False).healthy
    with pytest.raises(SmokeFailure, match="'GPU KV cache sized' came before 'DSpark draft loaded'"):
        replay("no-speculation.log", speculative=True)


@pytest.mark.parametrize("log, message", [
    ("hsa-error-graph-capture.log", "HSA error while waiting for graph capture finished: .*OUT_OF_RESOURCES"),
    ("traceback.log", "Python traceback while waiting for DSpark draft loaded"),
    ("oom.log", "out of memory while waiting for"),
    ("http-500.log", "HTTP 5xx"),
])
def test_real_problems_fail_fast(log, message):
    with pytest.raises(SmokeFailure, match=message):
        replay(log)


def test_deadline():
    clock = FakeClock()
    watcher = replay("stalled.log", deadline=600, clock=clock)
    clock.now = 599
    watcher.check_deadline()
    clock.now = 601
    with pytest.raises(SmokeFailure, match="not healthy after 600s: still waiting for 'model loaded'"):
        watcher.check_deadline()


# -- HTTP checks against a stand-in for vLLM ------------------------------------------------------------

class StandInVllm:
    """NOT vLLM: a local server answering the OpenAI routes the smoke uses, with canned outputs."""

    def __init__(self, answers: dict, fail_completions: bool | bytes = False):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": SPEC.model}]})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if isinstance(outer.fail_completions, bytes):  # the served image's own words, as they come
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(outer.fail_completions)))
                    self.end_headers()
                    return self.wfile.write(outer.fail_completions)
                if outer.fail_completions:
                    return self._send(500, {"error": "boom"})
                prompt = req["prompt"]
                text = next((v for k, v in answers.items() if prompt.startswith(k)), "x")
                self._send(200, {"choices": [{"text": text}], "usage": {"prompt_tokens": len(prompt.split())}})

        self.fail_completions = fail_completions
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


ANSWERS = {"Calculate 17 * 23": " 391", "The capital": " Paris.", "def fib": " return n", "Translate": " Das Wetter",
           "List three": " 101, 103, 107"}


def spec_with_expected(answers=ANSWERS) -> smoke_spec.SmokeSpec:
    return dataclasses.replace(SPEC, regression=tuple(
        dataclasses.replace(case, expected=next(v for k, v in answers.items() if case.prompt.startswith(k)))
        for case in SPEC.regression))


def test_http_checks_pass_and_report(tmp_path):
    server = StandInVllm(ANSWERS)
    spec = spec_with_expected()
    http = smoke.http_checks(smoke.Service(server.url, spec.model), spec, record=False)
    assert http.arithmetic == "391" and http.prefill["prompt_tokens"] > 4000
    assert {r["status"] for r in http.regression} == {"same"}
    assert smoke_report.verdict(True, http, 199_900_000_000, spec).result == "PASSED"
    over = smoke_report.verdict(True, http, 201_000_000_000, spec)
    assert (over.result, over.failed) == ("FAILED", ("vram",))
    assert smoke_report.verdict(False, None, 1, spec).failed == ("health", "http", "regression")


def test_http_checks_fail_on_wrong_answer_5xx_or_changed_output():
    spec = spec_with_expected()
    with pytest.raises(SmokeFailure, match="answered '392', not 391"):
        smoke.Service(StandInVllm({**ANSWERS, "Calculate 17 * 23": " 392"}).url, spec.model).arithmetic()
    with pytest.raises(SmokeFailure, match="HTTP 500"):
        smoke.Service(StandInVllm(ANSWERS, fail_completions=True).url, spec.model).arithmetic()
    changed = smoke.http_checks(smoke.Service(StandInVllm({**ANSWERS, "The capital": " Lyon."}).url, spec.model),
                                spec, record=False)
    assert [r["status"] for r in changed.regression].count("differs") == 1
    assert smoke_report.verdict(True, changed, 1, spec).failed == ("regression",)
    # nothing recorded yet (the committed state): not a pass until recorded on MI300X
    unrecorded = smoke.http_checks(smoke.Service(StandInVllm(ANSWERS).url, SPEC.model), SPEC, record=False)
    assert {r["status"] for r in unrecorded.regression} == {"unrecorded"}
    judged = smoke_report.verdict(True, unrecorded, 1, SPEC)
    assert judged.result == "FAILED" and judged.compared == 0


def test_a_served_images_error_text_is_one_inert_line():
    """The image under test answers a 5xx in words of its choosing: a line of them starting with
    `::` is a workflow command on GitHub (the smoke job's log), an escape sequence acts on a terminal."""
    hostile = b"boom\n::error::the smoke passed\x1b[2J\xe2\x80\xae"
    with pytest.raises(SmokeFailure) as failed:
        smoke.Service(StandInVllm(ANSWERS, fail_completions=hostile).url, SPEC.model).arithmetic()
    said = str(failed.value)
    assert "HTTP 500" in said and "the smoke passed" in said, said  # the control: its words are there, quoted
    assert "\n" not in said and "\x1b" not in said and "\u202e" not in said, said


def test_a_recording_run_is_recorded_never_passed():
    recording = smoke.http_checks(smoke.Service(StandInVllm(ANSWERS).url, SPEC.model), SPEC, record=True)
    judged = smoke_report.verdict(True, recording, 1, SPEC)
    assert (judged.result, judged.failed, judged.compared) == ("RECORDED", (), 0)
    compared = smoke.http_checks(smoke.Service(StandInVllm(ANSWERS).url, SPEC.model), spec_with_expected(),
                                 record=False)
    judged = smoke_report.verdict(True, compared, 1, SPEC)
    assert judged.result == "PASSED" and judged.compared == len(SPEC.regression)


def test_vram_from_rocm_smi_json(tmp_path):
    fake = tmp_path / "rocm-smi"  # stands in for rocm-smi: prints its --json layout
    fake.write_text('#!/bin/sh\necho \'{"card0": {"VRAM Total Memory (B)": "205822885888", '
                    '"VRAM Total Used Memory (B)": "199912345678"}}\'\n')
    fake.chmod(0o755)
    assert smoke.vram_used_bytes((str(fake),)) == 199912345678
    with pytest.raises(SmokeFailure, match="cannot read VRAM"):
        smoke.vram_used_bytes(("/nonexistent/rocm-smi",))


# -- the launch, on the real engine ---------------------------------------------------------------------

def test_production_launch_on_the_fixture_image(project, registry, fixture_base, tmp_path):
    """Real Docker, real derived image. /dev/kfd and /dev/dri do not exist here: /dev/null stands in
    for them so the engine accepts the device list; nothing GPU-like happens. This sandbox may not
    raise memlock to unlimited, so the test keeps the host's limit (production asks for unlimited)."""
    import resource

    from docker.types import Ulimit
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/smoke:1")
    image = last_line(built)
    docker("pull", "-q", image)
    snapshot = tmp_path / "snapshots" / SPEC.revision
    snapshot.mkdir(parents=True)
    stand_in = ["/dev/null:/dev/kfd:rwm", "/dev/null:/dev/dri-render:rwm"]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    report = smoke.run(image, SPEC, snapshot, port=18000, devices=stand_in, require_hardware=False,
                       vram=lambda: 0, log=lambda m: None,
                       stand_ins={"ulimits": [Ulimit(name="memlock", soft=soft, hard=hard)]})
    assert report.result == "FAILED" and "health" in report.verdict.failed
    # the entrypoint ran: self-check passed, then `vllm serve` is absent from the fixture
    assert report.failure and "container exited (code 127) before 'model loaded'" in report.failure
    assert "vllm: not found" in report.failure
    written = report.to_json()  # as signed: what the run did not reach is absent, not null
    assert written["failure"] == report.failure and "http_ok" not in written and "health_ok" not in written
    assert set(written) == {"image", "model", "revision", "host", "started", "run", "workflow_run", "health",
                            "vram_high_water_bytes", "vram_limit_bytes", "finished", "result", "passed", "failed",
                            "regression_compared", "failure"}
    options = smoke.launch_options(image, SPEC, snapshot, 18000, stand_in)
    assert options["volumes"][str(snapshot)] == {"bind": "/models/DeepSeek-V4-Flash-0731", "mode": "ro"}
    assert options["cap_add"][0] == "IPC_LOCK" and options["ulimits"][0].hard == -1
    with pytest.raises(Exception, match="is not revision"):
        smoke.launch_options(image, SPEC, tmp_path, 18000)


def test_smoke_attestation_gates_verify(tmp_path, registry, fixture_base, fixture_lock):
    """A passing report signed onto the digest satisfies --require-smoke; a failing one does not."""
    from bakery.oci.refs import Reference
    from bakery.oci.store import RegistryStore
    from bakery.trust import keys, sign
    from support import copy_project

    project = copy_project(tmp_path / "p", fixture_lock)
    env = {"BAKERY_KEY_PASSWORD": "pw"}
    for role in ("release", "smoke"):
        assert invoke(project, "keygen", "--role", role, "--out", str(tmp_path / "k"), env=env).returncode == 0
    ref = last_line(invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/smoked:1"))
    assert invoke(project, "attest", ref, "--key", str(tmp_path / "k" / "release.key"), env=env).returncode == 0
    policy = dev_policy(tmp_path / "policy.yaml", fixture_base)
    keyargs = ["--key", str(tmp_path / "k" / "release.pub"), "--smoke-key", str(tmp_path / "k" / "smoke.pub")]
    args = ["verify", ref, *keyargs, "--policy", str(policy), "--require-smoke"]
    none = invoke(project, *args)
    assert none.returncode == 5 and "FAIL a passing MI300X smoke attestation signed by a smoke key, its regression outputs compared (none attached" in none.stdout
    import os

    os.environ.update(env)
    try:
        signer = sign.Signer(keys.load_private(tmp_path / "k" / "smoke.key"))
        release_signer = sign.Signer(keys.load_private(tmp_path / "k" / "release.key"))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    r = Reference.parse(ref)
    spec_bytes = (project / "provenance" / "smoke.yaml").read_bytes()
    failing = {"image": ref, "result": "FAILED", "passed": ["health"], "failed": ["vram"]}
    smoke_report.attach_report(RegistryStore(r), r, failing, spec_bytes, signer)
    assert invoke(project, *args).returncode == 5
    promote = ["promote", ref, "--tag", "v0.0.1", *keyargs, "--policy", str(policy)]
    refused = invoke(project, *promote)
    assert refused.returncode == 5 and "a passing MI300X smoke attestation" in refused.stderr
    # a PASSED that compared nothing (what a first recording run used to sign) is refused
    hollow = {"image": ref, "result": "PASSED", "passed": ["health", "http", "regression", "vram"], "failed": [],
              "regression_compared": 0}
    smoke_report.attach_report(RegistryStore(r), r, hollow, spec_bytes, signer)
    refused = invoke(project, *args)
    assert refused.returncode == 5 and "(result PASSED, 0 outputs compared)" in refused.stdout
    passing = {"image": ref, "result": "PASSED", "passed": ["health", "http", "regression", "vram"], "failed": [],
               "regression_compared": 4, "host": {"gfx_arch": "gfx942", "compute_units": 304}}
    # the build's release key may not vouch for the MI300X result: only a smoke key may
    smoke_report.attach_report(RegistryStore(r), r, passing, spec_bytes, release_signer)
    refused = invoke(project, *args)
    assert refused.returncode == 5 and "test-result/v0.1 signed by 0 of 1 required smoke key(s)" in refused.stdout
    smoke_report.attach_report(RegistryStore(r), r, passing, spec_bytes, signer)
    ok = invoke(project, *args)
    assert ok.returncode == 0, ok.stdout
    promoted = invoke(project, *promote)
    assert promoted.returncode == 0, promoted.stderr
    from bakery.oci.registry import Registry

    assert Registry(registry).get_manifest(Reference(registry, r.repository, "v0.0.1"))[2] == r.digest
    # the release workflow's promote asks for its own run's result: a PASSED of another run (one put
    # back over this run's FAILED, say) is refused, this run's is taken
    this_run = ["promote", ref, "--tag", "v0.0.2", *keyargs, "--policy", str(policy), "--smoke-run", "o/r#2"]
    other = invoke(project, *this_run)
    assert other.returncode == 5 and "the smoke result is from workflow run o/r#2 (it says None" in other.stderr
    smoke_report.attach_report(RegistryStore(r), r, {**passing, "workflow_run": "o/r#1"}, spec_bytes, signer)
    other = invoke(project, *this_run)
    assert other.returncode == 5 and "(it says o/r#1: a result of another run" in other.stderr
    smoke_report.attach_report(RegistryStore(r), r, {**passing, "workflow_run": "o/r#2"}, spec_bytes, signer)
    assert invoke(project, *this_run).returncode == 0
    # the SBOM and provenance attestations survived the smoke attestation being added
    assert "ok   SBOM (SPDX 2.3) attestation present and signed" in ok.stdout
    with pytest.raises(Exception, match="is about"):
        smoke_report.attach_report(RegistryStore(r), r, {**passing, "image": "other@sha256:" + "1" * 64}, spec_bytes, signer)


@pytest.mark.parametrize("edit, says", [
    (("vram_limit_bytes: 200500000000", "vram_limit_bytes: null"), "vram_limit_bytes must be a int"),
    (("health_deadline_s: 900", "health_deadline_s: true"), "health_deadline_s must be a int"),
    (("temperature: 0.0", "temperature: hot"), "regression[3]: temperature must be a number"),
    (("seed: 1,", "seed: 1, colour: red,"), "regression[0]: unknown key(s) colour"),
    (("seed: 2,", "seed: null,"), "regression[1]: seed must be a int"),
    (("max_tokens: 24, temperature: 1.0", "max_tokens: true, temperature: 1.0"), "regression[2]: max_tokens must be a int"),
])
def test_a_smoke_spec_of_another_shape_is_one_input_error(tmp_path, edit, says):
    """Checked on load, as a typed value: before, a null limit was a TypeError at the end of an MI300X
    run and a word for a temperature a ValueError."""
    from bakery.errors import InputError

    text = (ROOT / "provenance" / "smoke.yaml").read_text()
    assert edit[0] in text
    (tmp_path / "smoke.yaml").write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(InputError) as e:
        smoke_spec.load_spec(tmp_path / "smoke.yaml")
    assert says in str(e.value)
    assert SPEC.regression[0].expected is None and SPEC.vram_limit_bytes == 200_500_000_000  # the control
