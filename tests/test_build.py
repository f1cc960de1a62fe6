"""`invoke build` end to end: fixture base -> derived image -> real registry -> real Docker engine."""

from __future__ import annotations

import json
import subprocess

import pytest

from bakery.dev import stack
from bakery.oci.refs import Reference
from bakery.oci.registry import Registry
from support import docker, invoke, last_line


@pytest.fixture(scope="module")
def built(registry, fixture_base, fixture_lock, tmp_path_factory):
    from support import copy_project

    project = copy_project(tmp_path_factory.mktemp("build") / "project", fixture_lock)
    out = project / "out"
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/derived:v1",
                    "--layout", str(project / "layout"))
    assert result.returncode == 0, result.stderr
    return Reference.parse(last_line(result)), json.loads((out / "build-record.json").read_text()), project


def test_last_line_is_the_pushed_digest_and_docker_runs_it(built, registry):
    ref, record, _ = built
    assert ref.name == f"{registry}/test/derived" and ref.digest
    assert str(ref.digest) == record["manifest"]["digest"]
    docker("pull", "-q", str(ref))
    run = docker("run", "--rm", "--entrypoint", "/usr/local/bin/bakery-selfcheck", str(ref))
    baked = [f for f in record["files"] if f["path"] != "/etc/bakery/manifest.json"]
    assert f"{len(baked)} baked files verified" in run.stderr
    # the real entrypoint: self-check, stale mmap cleanup, then exec vllm serve (absent in the fixture)
    run = docker("run", "--rm", str(ref), check=False)
    assert "baked files verified" in run.stderr and "vllm: not found" in run.stderr


def test_tag_points_at_the_same_digest(built, registry):
    ref, _, _ = built
    _, _, digest = Registry(registry).get_manifest(Reference(registry, "test/derived", "v1"))
    assert digest == ref.digest


def test_config_env_entrypoint_annotations(built, fixture_base):
    ref, record, _ = built
    inspect = json.loads(docker("inspect", str(ref)).stdout)[0]["Config"]
    for pair in ("VLLM_ROCM_USE_AITER=1", "PYTHONHASHSEED=0", "VLLM_ROCM_USE_SKINNY_GEMM=0",
                 "HSA_COREDUMP_PATTERN=/var/crash/vllm/gpucore.%p"):
        assert pair in inspect["Env"]
    assert inspect["Entrypoint"] == ["/usr/local/bin/bakery-entrypoint"]
    assert "--kv-offloading-backend=native" in inspect["Cmd"]
    raw = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{ref}"],
                         capture_output=True, text=True, check=True).stdout
    notes = json.loads(raw)["annotations"]
    assert notes["org.opencontainers.image.base.digest"] == str(fixture_base.digest)
    assert notes["org.opencontainers.image.base.name"] == fixture_base.name
    assert notes["org.opencontainers.image.revision"] == record["source"]["revision"]
    assert notes["org.opencontainers.image.source"].startswith("https://")
    assert notes["org.opencontainers.image.created"].endswith("Z")


def test_base_layers_are_mounted_not_uploaded(built):
    _, record, _ = built
    assert record["push"]["base_bytes_uploaded"] == 0
    assert record["push"]["base_layers_mounted"] + record["push"]["base_layers_present"] == \
        len(record["base"]["layers"])


def test_other_registry_gets_base_layers_copied_once(built, fixture_base):
    """A target on another registry has no mount source: the base is copied, and only once."""
    _, _, project = built
    other = stack.ensure_registry(5004, name="registry-other")
    first = invoke(project, "build", "--base", str(fixture_base), "--push", f"{other}/copy/derived:1",
                   "--out", str(project / "out-other"))
    assert first.returncode == 0, first.stderr
    rec = json.loads((project / "out-other" / "build-record.json").read_text())
    assert rec["push"]["base_layers_copied"] + rec["push"]["base_layers_present"] == len(rec["base"]["layers"])
    second = invoke(project, "build", "--base", str(fixture_base), "--push", f"{other}/copy/derived:1",
                    "--out", str(project / "out-other"))
    rec2 = json.loads((project / "out-other" / "build-record.json").read_text())
    assert rec2["push"]["base_bytes_uploaded"] == 0 and rec2["push"]["base_layers_copied"] == 0
    assert last_line(first) == last_line(second)


def test_record_lists_every_input_and_output_by_digest(built, fixture_base):
    _, record, _ = built
    assert record["base"]["manifest"]["digest"] == str(fixture_base.digest)
    assert {d["name"]: d["version"] for d in record["base"]["python_distributions"]} == \
        {"vllm": "0.26.0", "amd-aiter": "0.1.7.post2.dev18"}
    paths = {f["path"] for f in record["files"]}
    assert {"/usr/local/bin/bakery-entrypoint", "/usr/local/bin/bakery-selfcheck",
            "/etc/bakery/manifest.json"} <= paths
    assert all(len(f["sha256"]) == 64 for f in record["files"])
    assert all(layer["digest"].startswith("sha256:") and layer["diff_id"].startswith("sha256:") for layer in record["layers"])
    assert {i["path"] for i in record["inputs"]} >= {"image/image.yaml", "image/base.yaml"}
    assert record["config"]["digest"].startswith("sha256:")
    assert record["tools"]["zlib"]


def test_layout_is_read_by_skopeo_and_runs_in_docker(built):
    ref, _, project = built
    layout = project / "layout"
    inspect = json.loads(subprocess.run(["skopeo", "inspect", f"oci:{layout}"], capture_output=True,
                                        text=True, check=True).stdout)
    assert inspect["Digest"] == str(ref.digest)
    subprocess.run(["skopeo", "copy", "-q", f"oci:{layout}", "docker-daemon:bakery-layout/test:1"],
                   check=True, capture_output=True)
    run = docker("run", "--rm", "--entrypoint", "bakery-selfcheck", "bakery-layout/test:1")
    assert "baked files verified" in run.stderr


def test_dirty_counts_untracked_files(project, fixture_base):
    """An untracked file in the checkout can change what is built: the record says dirty."""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(project), "commit", "-qm", "lock for this machine's fixture", "--allow-empty"],
                   check=True,
                   env={**__import__("os").environ, **env})

    def dirty() -> bool:
        result = invoke(project, "build", "--base", str(fixture_base))
        assert result.returncode == 0, result.stderr
        return json.loads((project / "out" / "build-record.json").read_text())["source"]["dirty"]

    assert dirty() is False
    (project / "image" / "notes.txt").write_text("not committed\n")
    assert dirty() is True


def test_a_build_leaves_little_for_the_cyclic_collector(project, registry, fixture_base, toolchain):
    """`invoke build` runs with the cyclic collector off (tasks.py: collect_cycles=False), which is
    sound only while a build leaves little that collector alone could free: what it finds after a
    build, with what that holds, is under 64 KiB (a few of the standard library's JSON encoders and
    metadata lookups; a cold build, base fetched, proofs run, kernels compiled, left 11 KB when this
    was measured). The control: a build whose log line makes a cycle holding a megabyte."""
    import gc
    import sys

    from bakery.bake.options import Options
    from bakery.bake.pipeline import build as run

    def cyclic(_line):
        loop: list = [bytes(1 << 20)]
        loop.append(loop)

    held = []
    for log in (lambda _line: None, cyclic):
        gc.collect()
        gc.freeze()  # what exists before the build is not the build's
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            run(Options(project, str(fixture_base), f"{registry}/test/cycles:v1", toolchain=toolchain), log=log)
            gc.collect()
            found = {id(x): x for garbage in gc.garbage for x in (garbage, *gc.get_referents(garbage))}
            held.append(sum(sys.getsizeof(x) for x in found.values()))
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
            gc.unfreeze()
    assert held[0] < 64 << 10 and held[1] > 1 << 20, held


def test_a_task_without_the_cyclic_collector_gives_it_back_as_it_found_it(tmp_path):
    """The task wrapper turns the collector off for the task alone: on or off before, so after."""
    import gc

    from bakery.cli.edge import reports_errors_for

    seen = []
    task = reports_errors_for(tmp_path)(lambda c: seen.append(gc.isenabled()), collect_cycles=False)
    was = gc.isenabled()
    try:
        for before in (True, False):
            (gc.enable if before else gc.disable)()
            task(None)
            assert gc.isenabled() is before
    finally:
        (gc.enable if was else gc.disable)()
        gc.unfreeze()
    assert seen == [False, False]
