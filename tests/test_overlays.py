"""Overlays as a user meets them: bad registries, the build gate, rebase, bytecode, self-check."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest

from bakery import overlays as overlays_mod
from bakery.errors import InputError
from bakery.patch import unified_diff
from bakery.refs import Reference

from conftest import docker, invoke, last_line
from test_errors import one_clear_line

SITE = "/usr/local/lib/python3.12/dist-packages"
FENCE = f"{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py"
MXFP4 = f"{SITE}/vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py"
SPARSE = f"{SITE}/vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"


def entry(**over) -> dict:
    base = {"id": "x", "target": FENCE, "patch": "patches/cpu-kv-transfer-fence.patch", "kind": "patch",
            "upstream": {"repo": "https://github.com/vllm-project/vllm", "ref": "v0.26.0",
                         "path": "vllm/v1/kv_offload/cpu/gpu_worker.py"},
            "reason": "r", "status": "required", "platforms": ["gfx942"]}
    base.update(over)
    return base


def write_registry(project, entries) -> None:
    import yaml

    (project / "overlays" / "overlays.yaml").write_text(yaml.safe_dump({"overlays": entries}))


@pytest.mark.parametrize("entries, message", [
    ("overlays: [unclosed", "not valid YAML"),
    ([entry(colour="red")], "unknown key"),
    ([entry(), entry(id="y")], "already overlaid by 'x'"),
    ([entry(target="/etc/passwd")], "must be a normalized path under"),
    ([entry(target=f"{SITE}/vllm/../../../../etc/passwd")], "must be a normalized path"),
    ([entry(patch="patches/not-there.patch")], "is missing"),
    ([entry(target=f"{SITE}/vllm/envs.py")], "touches vllm/v1/kv_offload/cpu/gpu_worker.py, not its target"),
    ([entry(kind="magic")], "kind 'magic'"),
])
def test_bad_registry(project, entries, message):
    if isinstance(entries, str):
        (project / "overlays" / "overlays.yaml").write_text(entries)
    else:
        write_registry(project, entries)
    with pytest.raises(InputError, match=message):
        overlays_mod.load(project / "overlays" / "overlays.yaml")


def test_audit_records_need_no_patch_and_are_never_baked(project):
    audit = [entry(id=status, status=status, patch=None) for status in overlays_mod.UNPATCHED]
    write_registry(project, [{k: v for k, v in e.items() if v is not None} for e in audit])
    loaded = overlays_mod.load(project / "overlays" / "overlays.yaml")
    assert [(o.status, o.baked) for o in loaded] == [(s, False) for s in overlays_mod.UNPATCHED]
    write_registry(project, [{k: v for k, v in entry().items() if k != "patch"}])
    with pytest.raises(InputError, match="needs a patch file"):
        overlays_mod.load(project / "overlays" / "overlays.yaml")


def test_bad_patch_files_through_the_cli(project, fixture_base):
    patch = project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch"
    patch.write_bytes(patch.read_bytes().replace(b"\n", b"\r\n"))
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "CRLF" in line and "dos2unix" in line
    patch.write_bytes(b"Binary files a/x and b/x differ\n")
    assert "binary patch" in one_clear_line(invoke(project, "build", "--base", str(fixture_base)))


def test_superseded_overlays_are_not_baked(project, fixture_base):
    registry = project / "overlays" / "overlays.yaml"
    registry.write_text(registry.read_text().replace("    status: required\n    platforms: [gfx942]\n  - id: cpu",
                                                     "    status: superseded\n    platforms: [gfx942]\n  - id: cpu", 1))
    assert invoke(project, "lock", "--base", str(fixture_base)).returncode == 0
    result = invoke(project, "build", "--base", str(fixture_base))
    assert result.returncode == 0, result.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    baked = {o["id"]: o["baked"] for o in record["overlays"]}
    assert baked["mxfp4-bitmatrix-padding-mask"] is False and baked["cpu-kv-transfer-fence"] is True
    assert MXFP4 not in {f["path"] for f in record["files"]}


# -- the build gate ---------------------------------------------------------------------------------

def test_lock_for_another_base(project, fixture_base):
    lock = project / "overlays" / "overlays.lock"
    doc = json.loads(lock.read_text())
    doc["base"] = "docker.io/vllm/vllm-openai-rocm@sha256:" + "e" * 64
    lock.write_text(json.dumps(doc))
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "is for base docker.io/vllm" in line and f"invoke rebase --base {fixture_base}" in line


def test_edited_patch_or_result_is_refused(project, fixture_base):
    lock = project / "overlays" / "overlays.lock"
    doc = json.loads(lock.read_text())
    fence = next(e for e in doc["overlays"] if e["id"] == "cpu-kv-transfer-fence")
    fence["result_sha256"] = "0" * 64
    lock.write_text(json.dumps(doc))
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "cpu-kv-transfer-fence" in line and "lock expects " + "0" * 64 in line and FENCE in line


def test_patch_that_does_not_apply_exactly(project, fixture_base):
    patch = project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch"
    patch.write_bytes(patch.read_bytes().replace(b"@@ -373,9 +373,10 @@", b"@@ -371,9 +371,10 @@"))
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "does not apply exactly" in line and "+2 lines away" in line and "invoke rebase" in line


def docker_base(registry: str, name: str, fixture_base, commands: list[str], tmp_path) -> Reference:
    """A new 'nightly': the fixture changed by Docker's own builder."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "Dockerfile").write_text(f"FROM {fixture_base}\n" + "".join(f"RUN {c}\n" for c in commands))
    tag = f"{registry}/test/{name}:latest"
    docker("build", "-q", "-t", tag, str(tmp_path / name))
    digest = [w for w in docker("push", tag).stdout.split() if w.startswith("sha256:")][0]
    return Reference.parse(f"{registry}/test/{name}@{digest}")


def test_base_file_changed_under_the_overlay(project, registry, fixture_base, fixture_lock, tmp_path):
    new = docker_base(registry, "drifted", fixture_base, [f"echo '# drift' >> {FENCE}"], tmp_path)
    lock = json.loads(fixture_lock)
    lock["base"] = str(new)  # pretend someone re-pointed the lock without re-locking
    (project / "overlays" / "overlays.lock").write_text(json.dumps(lock))
    line = one_clear_line(invoke(project, "build", "--base", str(new)))
    expected = next(e["base_sha256"] for e in lock["overlays"] if e["id"] == "cpu-kv-transfer-fence")
    assert f"lock expects {expected}" in line and "base changed under the overlay" in line


def test_symlinked_target_is_refused(project, registry, fixture_base, tmp_path):
    new = docker_base(registry, "symlinked", fixture_base,
                      [f"mv {FENCE} {FENCE}.real && ln -s gpu_worker.py.real {FENCE}"], tmp_path)
    line = one_clear_line(invoke(project, "lock", "--base", str(new)))
    assert "is a symlink in the base (-> gpu_worker.py.real)" in line


# -- rebase: the nightly bump ----------------------------------------------------------------------

def test_rebase_reports_each_status_and_relocks_only_when_all_apply(project, registry, fixture_base, tmp_path):
    patched_fence = project / "fence.py"
    from bakery.patch import apply, parse
    from bakery import base as base_mod
    from bakery.extract import BaseFilesystem
    from bakery.registry import Registry

    reg = Registry(registry)
    stock = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64")).read([FENCE])[FENCE.lstrip("/")]
    patch = parse((project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch").read_bytes(), "p")
    patched_fence.write_bytes(apply(patch, stock.data)[0])
    (tmp_path / "ctx").mkdir()
    new = docker_base(registry, "nightly-next", fixture_base, [
        f"sed -i '1i # two new lines\\n# at the top' {MXFP4}",  # moved: applies-with-offset
        f"sed -i 's/if self.gpu_to_cpu:/if self.gpu_to_cpu or True:/' {FENCE}",  # context changed
        f"rm {SPARSE}",  # gone
    ], tmp_path)
    lock_before = (project / "overlays" / "overlays.lock").read_bytes()
    result = invoke(project, "rebase", "--base", str(new))
    assert result.returncode == 2
    table = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:] if line.strip()}
    assert table == {"mxfp4-bitmatrix-padding-mask": "applies-with-offset", "cpu-kv-transfer-fence": "conflicts",
                     "sparse-mla-prefill-bh64-deterministic-topk": "target-missing",
                     "exact-swiglu-clamp-kernel": "applies", "independent-draft-gumbel": "applies",
                     "fnuz-indexer-cache-writer": "applies",
                     "dspark-causal-verify-flatten": "check-by-hand", "moe-expert-mask-by-backend": "check-by-hand",
                     "aiter-paged-mqa-logits-64bit-offsets": "check-by-hand", "gfx942-aiter-fast-paths": "check-by-hand"}
    assert (project / "overlays" / "overlays.lock").read_bytes() == lock_before

    upstreamed = docker_base(registry, "nightly-fixed", fixture_base, [
        f"sed -i '1i # moved down by two\\n# lines' {MXFP4}"], tmp_path)
    (tmp_path / "fixed").mkdir()
    (tmp_path / "fixed" / "Dockerfile").write_text(f"FROM {upstreamed}\nCOPY fence.py {FENCE}\n")
    subprocess.run(["cp", str(patched_fence), str(tmp_path / "fixed" / "fence.py")], check=True)
    tag = f"{registry}/test/nightly-fixed2:latest"
    docker("build", "-q", "-t", tag, str(tmp_path / "fixed"))
    digest = [w for w in docker("push", tag).stdout.split() if w.startswith("sha256:")][0]
    fixed = f"{registry}/test/nightly-fixed2@{digest}"
    result = invoke(project, "rebase", "--base", fixed)
    assert "cpu-kv-transfer-fence" in result.stdout and "already-upstream" in result.stdout
    assert result.returncode == 2


def test_rebase_refresh_moves_patches_and_writes_the_lock(project, registry, fixture_base, tmp_path):
    new = docker_base(registry, "nightly-moved", fixture_base,
                      [f"sed -i '1i # moved\\n# by two' {MXFP4} {FENCE} {SPARSE}"], tmp_path)
    result = invoke(project, "rebase", "--base", str(new), "--refresh")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("applies ") == 6
    lock = json.loads((project / "overlays" / "overlays.lock").read_text())
    assert lock["base"] == str(new)
    built = invoke(project, "build", "--base", str(new))
    assert built.returncode == 0, built.stderr


# -- what runs in the container ------------------------------------------------------------------------

PYC_MODULE = f"{SITE}/vllm/third_party/triton_kernels/proton_opts.py"


def test_stale_bytecode_cannot_shadow_an_overlay(project, registry, fixture_base, tmp_path):
    """A same-size edit whose mtime equals the one recorded in the stock .pyc: Python would run the
    stock bytecode. Shown first with plain Docker (the hazard), then with our image (the fix)."""
    from bakery import base as base_mod
    from bakery.extract import BaseFilesystem
    from bakery.registry import Registry

    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"))
    source = fs.read([PYC_MODULE])[PYC_MODULE.lstrip("/")].data
    pyc_path = PYC_MODULE.replace("proton_opts.py", "__pycache__/proton_opts.cpython-311.pyc")
    pyc = fs.read([pyc_path])[pyc_path.lstrip("/")].data
    mtime, size = struct.unpack("<II", pyc[8:16])
    assert size == len(source)
    # a same-size value change, like block_h = 16 -> 64
    edited = source.replace(b"_launch_metadata_allow_sync = None\n", b"_launch_metadata_allow_sync = True\n", 1)
    assert edited != source and len(edited) == len(source)
    probe = (f"import importlib.util as u; s = u.spec_from_file_location('m', '{PYC_MODULE}'); "
             f"m = u.module_from_spec(s); s.loader.exec_module(m); "
             f"print('overlay' if m._launch_metadata_allow_sync is True else 'stale')")
    # the hazard, with Docker alone: same size, same mtime -> the stock .pyc runs
    (tmp_path / "hazard").mkdir()
    (tmp_path / "hazard" / "m.py").write_bytes(edited)
    (tmp_path / "hazard" / "Dockerfile").write_text(
        f"FROM {fixture_base}\nCOPY m.py {PYC_MODULE}\nRUN touch -d @{mtime} {PYC_MODULE}\n")
    docker("build", "-q", "-t", "bakery-test/pyc-hazard", str(tmp_path / "hazard"))
    assert docker("run", "--rm", "--entrypoint", "python3", "bakery-test/pyc-hazard", "-c", probe).stdout.strip() == "stale"
    # ours: the same edit as an overlay, built with SOURCE_DATE_EPOCH = the recorded mtime
    rel = PYC_MODULE[len(SITE) + 1:]
    (project / "overlays" / "patches" / "same-size.patch").write_bytes(unified_diff(source, edited, rel))
    write_registry(project, [entry(id="same-size", target=PYC_MODULE, patch="patches/same-size.patch",
                                   upstream={"repo": "r", "ref": "v0.26.0", "path": rel})])
    assert invoke(project, "lock", "--base", str(fixture_base)).returncode == 0
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/pyc:1",
                    env={"SOURCE_DATE_EPOCH": str(mtime)})
    assert result.returncode == 0, result.stderr
    ref = last_line(result)
    docker("pull", "-q", ref)
    assert docker("run", "--rm", "--entrypoint", "python3", ref, "-c", probe).stdout.strip() == "overlay"
    assert docker("run", "--rm", "--entrypoint", "ls", ref, PYC_MODULE.rsplit("/", 1)[0] + "/__pycache__").stdout \
        .count("proton_opts") == 0


def test_container_refuses_to_start_with_a_file_mounted_over_a_target(project, registry, fixture_base, tmp_path):
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/selfcheck:1")
    ref = last_line(result)
    docker("pull", "-q", ref)
    ok = docker("run", "--rm", ref, check=False)
    assert "baked files verified" in ok.stderr  # then exec vllm serve, absent from the fixture
    stock = tmp_path / "stock.py"
    stock.write_text("# stock vLLM, bind-mounted by hand\n")
    bad = docker("run", "--rm", "-v", f"{stock}:{FENCE}:ro", ref, check=False)
    assert bad.returncode == 1 and f"{FENCE}: expected sha256" in bad.stderr and "refusing to start" in bad.stderr
    assert "vllm: not found" not in bad.stderr  # it never got as far as exec
