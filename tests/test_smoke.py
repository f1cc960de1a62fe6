"""The MI300X smoke gate's hardware side. There is no MI300X here: `invoke smoke` must say so and
stop. What does not need the GPU is tested for real: the log watcher on recorded vLLM log streams,
the container launches (the candidate's and the seed-style stack's) on the real Docker engine, and
the signed result under `invoke verify`. The gate's HTTP stages and drills are test_acceptance.py."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bakery.errors import SmokeFailure
from bakery.release import bfcl, smoke, smoke_log, smoke_report, smoke_spec
from support import BASE, ROOT, dev_policy, docker, invoke, last_line, passing_report

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
        "run invoke smoke on an MI300X host (or run the gate against servers started elsewhere: "
        "--endpoint PATH=URL and --reference-endpoint PATH=URL)"]


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
    options = {**smoke.launch_options(image, SPEC, snapshot, 18000, stand_in),
               "ulimits": [Ulimit(name="memlock", soft=soft, hard=hard)]}
    servers = {(side, path): smoke.Launch({**options, "command": ["--port=8000"]})
               for side in ("reference", "candidate") for path in SPEC.paths}
    report = smoke.run(image, SPEC, servers, smoke_report.Reference("promoted", image, None), True, None, None,
                       bfcl.Harness("unused: no server here gets past its start"),
                       vram=lambda: 0, log=lambda m: None)
    assert report.result == "FAILED" and report.launched_container
    # each server's entrypoint ran: the self-check passed, then `vllm serve` is absent from the fixture
    for run in report.servers:
        assert run.failure and "container exited (code 127) before 'model loaded'" in run.failure, run.failure
        assert "vllm: not found" in run.failure and run.vram_high_water_bytes is None
    written = report.to_json()  # as signed: the A/B that no server reached is null, and says so
    assert written["ab"] is None and {c["name"] for c in written["checks"] if not c["ok"]} >= {
        "serve:candidate:dspark", "serve:reference:native", "ab"}
    assert options["volumes"][str(snapshot)] == {"bind": "/models/DeepSeek-V4-Flash-0731", "mode": "ro"}
    assert smoke.launch_options(image, SPEC, snapshot, 18000, stand_in)["ulimits"][0].hard == -1
    assert options["cap_add"][0] == "IPC_LOCK"
    with pytest.raises(Exception, match="is not revision"):
        smoke.launch_options(image, SPEC, tmp_path, 18000)
    assert not docker("ps", "-aq", "--filter", "label=bakery.smoke=1").stdout.strip()  # every container removed


def test_the_seed_stack_mounts_the_bytes_the_image_bakes(project, registry, fixture_base, tmp_path):
    """The reference of a first release, rendered from the build record on the real engine: the
    pinned base, unchanged, each file our layers hold read from the candidate (checked against the
    record) and bind-mounted read-only at its path. Run in the base, sha256sum reads each mount."""
    import docker as docker_sdk

    from bakery.release import seed_stack
    from bakery.trust import record as record_mod

    image = last_line(invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/seed:1"))
    docker("pull", "-q", image)
    rec = record_mod.read(project / "out" / "build-record.json")
    client = docker_sdk.from_env()
    holder = client.containers.create(image, entrypoint=["/bin/true"])
    try:
        staged = seed_stack.stage(lambda p: b"".join(holder.get_archive(p)[0]), rec, tmp_path)
    finally:
        holder.remove(force=True)
    mounted = seed_stack.mounted_files(rec)
    assert len(staged) == len(mounted) > 5 and not any("bakery-selfcheck" in p for p, _ in mounted)
    base = str(rec.base.pinned.with_digest(rec.base.manifest_digest))
    from bakery.cli.smoke import image_config

    env = image_config(client, image)["Env"]
    options = seed_stack.launch(base, env, staged, {"image": image, "volumes": {}, "command": ["x"]})
    assert options["image"] == base and options["entrypoint"][-1] == "vllm-serve" and options["command"] == ["x"]
    assert "VLLM_ROCM_USE_AITER=1" in options["environment"]
    paths = [p for p, _ in mounted]
    out = client.containers.run(base, entrypoint=["sha256sum", "--", *paths], volumes=options["volumes"], remove=True)
    seen = {line.split()[1]: line.split()[0] for line in out.decode().splitlines()}
    assert seen == dict(mounted)
    # its entrypoint clears a stale CPU-KV file (host IPC: the last server's) and hands over to `vllm serve`
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "vllm_offload_1.mmap").write_bytes(b"x")
    with pytest.raises(docker_sdk.errors.ContainerError, match="vllm: not found"):  # the fixture has no vLLM
        client.containers.run(base, entrypoint=options["entrypoint"], command=["--version"],
                              volumes={str(shm): {"bind": "/dev/shm", "mode": "rw"}}, remove=True, stderr=True)
    assert not (shm / "vllm_offload_1.mmap").exists()
    # the reference a launching gate takes from the record: the base the candidate's manifest names,
    # and no other (the record is a file handed between jobs)
    from bakery.cli import smoke as smoke_cmd
    from bakery.errors import InputError
    from bakery.oci.refs import Digest, Reference

    candidate = Reference.parse(image)
    taken, same_base, _ = smoke_cmd._reference(project, candidate, "seed-stack", None, True, lambda m: None)
    assert (taken.kind, taken.image, same_base) == ("seed-stack", base, True)
    other = json.loads((project / "out" / "build-record.json").read_text())
    other["base"]["manifest"]["digest"] = str(Digest.parse("sha256:" + "e" * 64))
    (tmp_path / "other-record.json").write_text(json.dumps(other))
    with pytest.raises(InputError, match="is not the base the candidate's manifest names"):
        smoke_cmd._reference(project, candidate, "seed-stack", str(tmp_path / "other-record.json"), True,
                             lambda m: None)
    # a file of other bytes in the candidate is refused, not mounted
    wrong = dataclasses.replace(rec, files=tuple(f._replace(sha256="0" * 64) if i == 0 else f
                                                 for i, f in enumerate(rec.files)))
    (tmp_path / "w").mkdir()
    holder = client.containers.create(image, entrypoint=["/bin/true"])
    try:
        with pytest.raises(Exception, match="not the bytes its build record names"):
            seed_stack.stage(lambda p: b"".join(holder.get_archive(p)[0]), wrong, (tmp_path / "w"))
    finally:
        holder.remove(force=True)


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
    assert none.returncode == 5 and ("FAIL a passing MI300X acceptance gate signed by a smoke key, its A/B run against a "
                                     "reference on both paths (none attached") in none.stdout
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
    assert refused.returncode == 5 and "a passing MI300X acceptance gate" in refused.stderr
    # a PASSED that ran no A/B (what the smoke signed before the gate, or one path only) is refused
    for hollow in ({"image": ref, "result": "PASSED", "passed": ["health", "http", "regression", "vram"], "failed": [],
                    "regression_compared": 4}, passing_report(ref, ab={"paths": [{"path": "dspark", "compared": 240}]})):
        smoke_report.attach_report(RegistryStore(r), r, hollow, spec_bytes, signer)
        refused = invoke(project, *args)
        assert refused.returncode == 5 and "(result PASSED, no A/B)" in refused.stdout
    passing = passing_report(ref)
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
    # verify prints what the gate found: the reference, the A/B per path, each check with its figure
    assert f"smoke PASSED against the seed-stack reference {BASE}; same base; launched the candidate and the reference" \
        in ok.stdout
    assert "  A/B native: 240 compared, 0 differ, 0 approved" in ok.stdout
    assert "  ok   speed:decode-1-stream: 172.4 tok/s against 151.74" in ok.stdout
    with pytest.raises(Exception, match="is about"):
        smoke_report.attach_report(RegistryStore(r), r, {**passing, "image": "other@sha256:" + "1" * 64}, spec_bytes, signer)


def test_release_tags_sort_by_their_numbers_a_pre_release_first():
    """A number has one spelling: v01.10.0 would be v1.10.0 again, a second tag of the same number
    that the order check could not place (seventh attacker review)."""
    from bakery.cli.smoke import release_order

    tags = ["v1.10.0", "v1.9.0", "v1.10.0-rc1", "v2", "latest", "candidate-abc", "v1.x", "vnext", "v01.10.0", "v1.010"]
    ordered = sorted((t for t in tags if release_order(t) is not None), key=lambda t: release_order(t) or ())
    assert ordered == ["v1.9.0", "v1.10.0-rc1", "v1.10.0", "v2"]


def test_the_reference_is_the_last_release_in_git_or_the_seed_stack_before_the_first(registry, tmp_path):
    """--reference last-promoted (the release workflow's): the newest release tag git has merged into
    HEAD, other than HEAD's own, resolved in the candidate's repository. Chosen from git's protected
    tags, not the registry's listing: a release tag only the registry has, or one on a branch never
    merged, is not taken; the candidate put under an earlier release's tag is refused (second attacker
    review: it made the gate skip to an older release or the seed-style stack), and so is a release git
    has and the registry does not (never promoted, or its tag deleted), unless --not-promoted lists it;
    with no earlier release tag in git, the seed-style stack."""
    import subprocess

    from bakery.cli import smoke as smoke_cmd
    from bakery.errors import InputError
    from support import push_image
    from test_toolchain_root import tar

    def repository(where) -> list[str]:
        where.mkdir()
        subprocess.run(["git", "init", "-q", str(where)], check=True)
        return ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@example.com"]

    def commit(git: list[str], *tags: str) -> None:
        subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "c"], check=True)
        for tag in tags:
            subprocess.run([*git, "tag", tag], check=True)

    project = tmp_path / "p"
    git = repository(project)
    commit(git, "v1.9.0")
    commit(git, "v1.10.0-rc1", "v-next")
    commit(git, "v1.10.0", "latest")
    subprocess.run([*git, "checkout", "-q", "-b", "side"], check=True)
    commit(git, "v9.0.0")  # a branch never merged
    subprocess.run([*git, "checkout", "-q", "-"], check=True)
    commit(git, "v1.11.0")  # the candidate's own

    def image(repo: str, tag: str, n: int):
        return push_image(registry, repo, [tar((f"f{n}", "file", f"{n}\n".encode(), 0o644))], tag=tag)

    repo = "test/promoted-order"
    candidate = image(repo, "candidate-1", 0)
    pushed = {tag: image(repo, tag, n) for n, tag in enumerate(
        ["v1.9.0", "v1.10.0-rc1", "v1.10.0", "v9.0.0", "v1.11.0", "v99.0.0", "latest", "v-next"], start=1)}
    said: list[str] = []
    # resolved once, by digest: the tag may move before the reference is verified
    assert smoke_cmd._last_promoted(project, candidate, said.append) == (str(pushed["v1.10.0"]), "v1.10.0")
    assert said == [f"the reference: {registry}/{repo}:v1.10.0 ({pushed['v1.10.0'].digest}), the last promoted release"]
    # a tag pusher's v2.0.0 on v1.9.0's old commit would be every later gate's reference: out of order
    subprocess.run([*git, "tag", "v2.0.0", "v1.9.0"], check=True)
    with pytest.raises(InputError, match="git's release tags are out of order: v2.0.0 is on .*, before v1.10.0's"):
        smoke_cmd._last_promoted(project, candidate, said.append)
    subprocess.run([*git, "tag", "-d", "v2.0.0"], check=True, capture_output=True)
    image(repo, "v1.10.0", 0)  # the candidate under an earlier release's tag
    with pytest.raises(InputError, match="the registry's v1.10.0, an earlier release in git, is the candidate"):
        smoke_cmd._last_promoted(project, candidate, said.append)
    failed = "test/promoted-failed"  # only v1.9.0 was ever promoted here (or v1.10.0's tag was deleted)
    image(failed, "v1.9.0", 1)
    failed_candidate = image(failed, "candidate-1", 0)
    with pytest.raises(InputError, match="git's release tag v1.10.0 has no tag in .*: its release was never promoted, "
                                         "or the tag was deleted; if it was never promoted, say so with --not-promoted"):
        smoke_cmd._last_promoted(project, failed_candidate, said.append)
    # an admin's word that v1.10.0 and its rc were never promoted: those two passed over, and no other
    listed = smoke_cmd.release_tags("v1.10.0, v1.10.0-rc1")
    assert smoke_cmd._last_promoted(project, failed_candidate, said.append, listed)[1] == "v1.9.0"
    assert said[-3:-1] == ["git's v1.10.0 passed over: --not-promoted says its release was never promoted",
                           "git's v1.10.0-rc1 passed over: --not-promoted says its release was never promoted"]
    with pytest.raises(InputError, match="git's release tag v1.10.0-rc1 has no tag"):
        smoke_cmd._last_promoted(project, failed_candidate, said.append, smoke_cmd.release_tags("v1.10.0"))
    with pytest.raises(InputError, match="--not-promoted 'latest' is not a release tag"):
        smoke_cmd.release_tags("v1.10.0 latest")
    assert smoke_cmd.release_tags("") == frozenset()
    first = tmp_path / "first"
    commit(repository(first), "v1.0.0")
    assert smoke_cmd._last_promoted(first, candidate, said.append) == ("seed-stack", None)
    assert said[-1] == "no earlier release tag in git before HEAD: the reference is the seed-style stack (the first release)"
