"""Overlays as a user meets them: bad registries, the build gate, rebase, bytecode, self-check."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys

import pytest

from bakery.errors import InputError
from bakery.inputs import overlays as overlays_mod
from bakery.inputs.patch import unified_diff
from bakery.oci.refs import Reference
from support import ROOT, docker, invoke, last_line, push_image
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
    ([entry(proof={"script": "proofs/not-there.py"})], "is not a file inside"),
    ([entry(proof={"script": "proofs/cpu_kv_transfer_fence.py", "hardware": "both"})], "proof must be"),
    ([entry(probe=[{"present": "(", "why": "w"}])], "not a regular expression"),
    ([entry(probe=[{"present": "a", "absent": "b", "why": "w"}])], "exactly one of"),
    ([entry(probe=[{"present": "a"}])], "missing key\\(s\\) why"),
    ([entry(reason=None)], "reason must be a str, not null"),  # the signed SBOM said "None"
    # the release key signs `fixed` under the defect's id: it must be the overlay's upstream's own
    ([entry(defect={"id": "https://nvd.nist.gov/vuln/detail/CVE-2025-0001", "aliases": []})],
     "not an issue, PR, commit or advisory of https://github.com/vllm-project/vllm"),
    ([entry(defect={"id": "https://github.com/vllm-project/vllm/issues/1", "aliases": None})], "must be a list"),
    ([entry(defect={"id": "https://github.com/vllm-project/vllm/issues/1%2F..%2Fother", "aliases": []})],
     "not an issue, PR, commit or advisory"),
    ([entry(defect={"id": "https://github.com/vllm-project/vllm/issues/1", "aliases": ["javascript:x"]})],
     "is not an https URL"),
    ([entry(defect={"id": "https://github.com/vllm-project/vllm/issues/1", "aliases": []}, patch=None,
            status="absent")], "needs a probe"),
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
    text = registry.read_text()
    start = text.index("  - id: mxfp4-bitmatrix-padding-mask")
    registry.write_text(text[:start] + text[start:].replace("    status: required\n", "    status: superseded\n", 1))
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


def test_lock_refuses_an_overlay_its_proof_finds_broken(project, fixture_base):
    """A patch that edits the fence's target without restoring the fence (the race is back): `invoke
    lock` must not pin it, and the lock already there stays byte for byte."""
    lock_path = project / "overlays" / "overlays.lock"
    before = lock_path.read_bytes()
    sha = next(e["base_sha256"] for e in json.loads(before)["overlays"] if e["id"] == "cpu-kv-transfer-fence")
    stock = (project / "overlays" / "stock" / sha).read_bytes()
    neutered = stock.replace(b"        if self.gpu_to_cpu:\n", b"        if self.gpu_to_cpu:  # reviewed\n", 1)
    assert neutered != stock
    (project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch").write_bytes(
        unified_diff(stock, neutered, "vllm/v1/kv_offload/cpu/gpu_worker.py"))
    line = one_clear_line(invoke(project, "lock", "--base", str(fixture_base)))
    assert "overlay 'cpu-kv-transfer-fence': its proof says BROKEN on the overlaid target" in line
    assert lock_path.read_bytes() == before


# -- rebase: the nightly bump ----------------------------------------------------------------------

GUMBEL = f"{SITE}/vllm/v1/worker/gpu/spec_decode/speculator.py"


def base_bytes(fs, path: str) -> bytes:
    """A regular file of the base that the test knows is there."""
    found = fs.read([path])[path.lstrip("/")]
    assert found is not None and found.data is not None, path
    return found.data


def lock_ids(lock: dict) -> set:
    return {e["id"] for e in lock["overlays"]}


def rebase_table(result) -> dict:
    rows = {}
    for line in result.stdout.splitlines()[1:]:
        if line.strip() and not line.startswith("lock written"):
            words = line.split()
            status = " ".join(words[1:words.index("yes") if "yes" in words else words.index("no")])
            rows[words[0]] = status
    return rows


def test_rebase_026_to_027_end_to_end_without_the_old_base(project, fixture_base_027, registry):
    """The nightly bump onto vLLM 0.27.0 with the old base gone (the lock names a digest no
    registry has) and no known ports but the hardware-only overlay's (which rebase carries only by
    bytes a person wrote: test_rebase_carries_a_hardware_only_overlay_only_exactly): the old side
    comes from overlays/stock, every overlay is carried and proven, and the result bakes."""
    for ported in (project / "overlays" / "patches" / "ports").iterdir():
        if ported.name != "sparse-mla-prefill-bh64":
            shutil.rmtree(ported)
    lock = json.loads((project / "overlays" / "overlays.lock").read_text())
    lock["base"] = f"{registry}/gone/vllm-openai-rocm@sha256:" + "0" * 64
    (project / "overlays" / "overlays.lock").write_text(json.dumps(lock))
    result = invoke(project, "rebase", "--base", str(fixture_base_027))
    assert result.returncode == 0, result.stdout + result.stderr
    table = rebase_table(result)
    assert table["independent-draft-gumbel"] == "ported (merged), proven"
    assert table["cpu-kv-transfer-fence"] == "ported (exact), proven"
    assert table["exact-swiglu-clamp-kernel"] == "ported (offset), proven"
    assert table["sparse-mla-prefill-bh64"] == "ported (known port), not proven here"
    assert table["deterministic-sampler-topk-topp"] == "ported (offset), proven"
    assert table["aiter-paged-mqa-logits-64bit-offsets"] == "ported (merged), proven"  # 0.1.19 -> .post1: formatting
    assert "[8/8] aiter-paged-mqa-logits-64bit-offsets" in result.stderr
    # the audit records' probes: 0.27.0 brings the Gluon decode path the DSpark causal fix targets
    assert {k: v for k, v in table.items() if k not in lock_ids(lock)} == {
        "deterministic-indexer-topk": "audit holds", "dspark-causal-verify-flatten": "audit changed: re-check",
        "moe-expert-mask-by-backend": "audit holds", "gfx942-aiter-fast-paths": "audit holds"}
    assert json.loads((project / "overlays" / "overlays.lock").read_text())["base"] == str(fixture_base_027)
    old_sha = next(e["base_sha256"] for e in lock["overlays"] if e["id"] == "independent-draft-gumbel")
    assert (project / "overlays" / "patches" / "ports" / "independent-draft-gumbel" / f"{old_sha}.patch").is_file()
    built = invoke(project, "build", "--base", str(fixture_base_027), "--push", f"{registry}/test/rebased:027")
    assert built.returncode == 0, built.stderr
    record = json.loads((project / "out" / "build-record.json").read_text())
    proofs = {o["id"]: o["proof"] for o in record["overlays"] if o["baked"]}
    assert {k: (v.get("stock"), v.get("overlaid")) for k, v in proofs.items() if "script" in v} == \
        dict.fromkeys(("mxfp4-bitmatrix-padding-mask", "cpu-kv-transfer-fence", "fnuz-indexer-cache-writer",
                       "exact-swiglu-clamp-kernel", "independent-draft-gumbel", "deterministic-sampler-topk-topp",
                       "aiter-paged-mqa-logits-64bit-offsets"), ("BROKEN", "FIXED"))
    assert all(len(v.get("code_sha256", "x" * 64)) == 64 for v in proofs.values())


def test_committed_ports_carry_every_overlay_to_027(project, fixture_base_027):
    result = invoke(project, "rebase", "--base", str(fixture_base_027))
    assert result.returncode == 0, result.stdout + result.stderr
    table = rebase_table(result)
    assert {k: v for k, v in table.items() if v.startswith("ported")} == {
        "mxfp4-bitmatrix-padding-mask": "ported (known port), proven",
        "cpu-kv-transfer-fence": "ported (exact), proven", "fnuz-indexer-cache-writer": "ported (exact), proven",
        "exact-swiglu-clamp-kernel": "ported (known port), proven",
        "aiter-paged-mqa-logits-64bit-offsets": "ported (known port), proven",
        "independent-draft-gumbel": "ported (known port), proven",
        "deterministic-sampler-topk-topp": "ported (offset), proven",
        "sparse-mla-prefill-bh64": "ported (known port), not proven here"}


def test_rebase_needs_porting_writes_a_kit_and_nothing_else(project, registry, fixture_base, tmp_path):
    """The fence's guarded line changed upstream: no patch applies, the merge conflicts, and the
    stock is still BROKEN. Nothing is written but out/rebase/<id>/."""
    new = docker_base(registry, "nightly-conflict", fixture_base,
                      [f"sed -i 's/        if self.gpu_to_cpu:/        if self.gpu_to_cpu and True:/' {FENCE}"], tmp_path)
    before = {p: p.read_bytes() for p in (project / "overlays").rglob("*") if p.is_file()}
    result = invoke(project, "rebase", "--base", str(new))
    assert result.returncode == 2 and "lock, patches and overlays.yaml left unchanged" in result.stderr
    assert rebase_table(result)["cpu-kv-transfer-fence"] == "needs porting"
    kit = project / "out" / "rebase" / "cpu-kv-transfer-fence"
    assert b"<<<<<<< ours" in (kit / "ours.py").read_bytes() and (kit / "stock.py").is_file()
    run = subprocess.run(["sh", str(kit / "prove.sh")], capture_output=True, text=True)  # the markers do not parse
    assert run.returncode == 5 and "ours.py: CANNOT-PROVE" in run.stdout, run.stdout + run.stderr
    after = {p: p.read_bytes() for p in (project / "overlays").rglob("*") if p.is_file()}
    assert after == before
    # ours.py is the new base's code: a hostile one that plants a file in the project at import
    # would have run as the maintainer with plain python3 (the control); prove.sh runs it sandboxed
    planted = project / "planted-by-the-base"
    hostile = f"open({str(planted)!r}, 'w').write('x')\n".encode() + (kit / "stock.py").read_bytes()
    (kit / "ours.py").write_bytes(hostile)
    script = project / "overlays" / "proofs" / "cpu_kv_transfer_fence.py"
    plain = subprocess.run([sys.executable, str(script), str(kit / "ours.py"), "--"], capture_output=True, text=True,
                           cwd=project / "overlays" / "proofs")
    assert planted.exists(), plain.stderr[-500:]
    planted.unlink()
    run = subprocess.run(["sh", str(kit / "prove.sh")], capture_output=True, text=True)
    assert not planted.exists() and run.returncode == 5, run.stdout + run.stderr


def test_rebase_says_where_a_moved_target_went(project, registry, fixture_base, tmp_path):
    """Upstream moved the fence's file into a subpackage: not "needs porting" with no clue, but its
    own status, naming where a file of that name now is (the one like the old stock first), and
    nothing written."""
    moved = FENCE.replace("/cpu/gpu_worker.py", "/cpu/workers/gpu_worker.py")
    new = docker_base(registry, "nightly-moved", fixture_base,
                      [f"mkdir -p {moved.rsplit('/', 1)[0]} && mv {FENCE} {moved}"], tmp_path)
    before = {p: p.read_bytes() for p in (project / "overlays").rglob("*") if p.is_file()}
    result = invoke(project, "rebase", "--base", str(new))
    assert result.returncode == 2, result.stdout + result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("cpu-kv-transfer-fence"))
    assert "target moved" in row and f"a file of its name is at {moved} (100% like the old stock)" in row, row
    assert {p: p.read_bytes() for p in (project / "overlays").rglob("*") if p.is_file()} == before


def test_rebase_retires_an_overlay_that_upstream_fixed(project, registry, fixture_base, tmp_path, versions_dir):
    """The new base ships the Gumbel fix itself: its own code proves FIXED, so the overlay is
    recorded as already-upstream and no longer baked; the rest are re-locked."""
    ctx = tmp_path / "fixed"
    ctx.mkdir()
    (ctx / "speculator.py").write_bytes((versions_dir / "independent-draft-gumbel.patched.py").read_bytes())
    (ctx / "Dockerfile").write_text(f"FROM {fixture_base}\nCOPY speculator.py {GUMBEL}\n")
    tag = f"{registry}/test/nightly-upstreamed:latest"
    docker("build", "-q", "-t", tag, str(ctx))
    digest = [w for w in docker("push", tag).stdout.split() if w.startswith("sha256:")][0]
    result = invoke(project, "rebase", "--base", f"{registry}/test/nightly-upstreamed@{digest}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert rebase_table(result)["independent-draft-gumbel"] == "fixed-upstream"
    gumbel = next(o for o in overlays_mod.load(project / "overlays" / "overlays.yaml") if o.id == "independent-draft-gumbel")
    assert gumbel.status == "already-upstream" and not gumbel.baked
    lock = json.loads((project / "overlays" / "overlays.lock").read_text())
    assert "independent-draft-gumbel" not in {e["id"] for e in lock["overlays"]} and len(lock["overlays"]) == 7


@pytest.fixture
def versions_dir(registry, fixture_base, tmp_path):
    from bakery.base import spec as base_mod
    from bakery.base.filesystem import BaseFilesystem
    from bakery.inputs import patch as patch_mod
    from bakery.oci.registry import Registry

    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"))
    o = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == "independent-draft-gumbel")
    stock = base_bytes(fs, o.target)
    (tmp_path / "independent-draft-gumbel.patched.py").write_bytes(patch_mod.apply(o.parsed(), stock)[0])
    return tmp_path


def test_a_port_for_an_unknown_base_is_refused(project, fixture_base):
    port = project / "overlays" / "patches" / "ports" / "cpu-kv-transfer-fence" / f"{'ab' * 32}.patch"
    port.parent.mkdir(parents=True, exist_ok=True)
    port.write_bytes((project / "overlays" / "patches" / "cpu-kv-transfer-fence.patch").read_bytes())
    result = invoke(project, "build", "--base", str(fixture_base))
    line = one_clear_line(result)
    assert result.returncode == 2 and f"names target bytes {'ab' * 32}" in line and "an unknown base" in line


def test_a_port_named_for_other_bytes_is_refused(project, fixture_base):
    """The 0.27.0 port of the Gumbel overlay, renamed as if it were for 0.26.0's bytes."""
    lock = json.loads((project / "overlays" / "overlays.lock").read_text())
    sha026 = next(e["base_sha256"] for e in lock["overlays"] if e["id"] == "independent-draft-gumbel")
    ports = project / "overlays" / "patches" / "ports" / "independent-draft-gumbel"
    port027 = next(ports.glob("*.patch"))
    port027.rename(ports / f"{sha026}.patch")
    result = invoke(project, "build", "--base", str(fixture_base))
    line = one_clear_line(result)
    assert result.returncode == 5 and "does not apply exactly to the bytes it is named for" in line
    assert not (project / "out" / "build-record.json").exists()


# -- stored stock bytes ------------------------------------------------------------------------------

def test_build_refuses_stock_bytes_whose_name_is_not_their_sha256(project, fixture_base):
    stored = sorted((project / "overlays" / "stock").iterdir())[0]
    stored.write_bytes(stored.read_bytes() + b"# edited\n")
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert f"{stored.name} holds bytes with sha256" in line and "name must be its sha256" in line


def test_build_refuses_a_lock_whose_stock_bytes_are_not_stored(project, fixture_base):
    lock = json.loads((project / "overlays" / "overlays.lock").read_text())
    sha = next(e["base_sha256"] for e in lock["overlays"] if e["id"] == "cpu-kv-transfer-fence")
    (project / "overlays" / "stock" / sha).unlink()
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert f"names stock bytes {sha}" in line and "invoke lock" in line


# -- what runs in the container ------------------------------------------------------------------------

PYC_MODULE = f"{SITE}/vllm/third_party/triton_kernels/proton_opts.py"


def test_stale_bytecode_cannot_shadow_an_overlay(project, registry, fixture_base, tmp_path):
    """A same-size edit whose mtime equals the one recorded in the stock .pyc: Python would run the
    stock bytecode. Shown first with plain Docker (the hazard), then with our image (the fix)."""
    from bakery.base import spec as base_mod
    from bakery.base.filesystem import BaseFilesystem
    from bakery.oci.registry import Registry

    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"))
    source = base_bytes(fs, PYC_MODULE)
    pyc = base_bytes(fs, PYC_MODULE.replace("proton_opts.py", "__pycache__/proton_opts.cpython-311.pyc"))
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
                                   proof={"hardware": "a test overlay: what matters here is which bytes run"},
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


# -- rules that keep a verdict honest (issue 18) ----------------------------------------------------

def test_lock_refuses_an_overlay_whose_stock_target_also_proves_fixed(project, fixture_base):
    """A proof that cannot tell stock from overlaid (here: one made to say FIXED on anything) proves
    nothing: lock and build demand BROKEN on stock, and say upstream may have fixed it."""
    script = project / "overlays" / "proofs" / "cpu_kv_transfer_fence.py"
    text = script.read_text()
    assert "import _proof  # beside this script\n" in text
    script.write_text(text.replace("import _proof  # beside this script\n", "import _proof\n_proof.report = (lambda say: "
                                   "lambda fixed, reason, **m: say(True, reason, **m))(_proof.report)\n", 1))
    lock_path = project / "overlays" / "overlays.lock"
    before = lock_path.read_bytes()
    line = one_clear_line(invoke(project, "lock", "--base", str(fixture_base)))
    assert "overlay 'cpu-kv-transfer-fence': its proof says FIXED on the base's stock target" in line
    assert "upstream fixed it, run `invoke rebase`" in line and lock_path.read_bytes() == before
    built = invoke(project, "build", "--base", str(fixture_base))
    assert built.returncode == 5 and "its proof says FIXED on the base's stock target" in built.stderr


def stock_of(overlay_id: str) -> tuple:
    o = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == overlay_id)
    lock = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    sha = next(e["base_sha256"] for e in lock["overlays"] if e["id"] == overlay_id)
    return o, (ROOT / "overlays" / "stock" / sha).read_bytes()


def test_rebase_carries_a_hardware_only_overlay_only_exactly(tmp_path):
    """No proof runs for the BLOCK_H tile here, so nothing but the committed patch applied exactly
    may carry it: moved code (an offset) or a merge is a person's call. The control: exact bytes."""
    from bakery.release.rebase import NEEDS_PORTING, _decide

    overlay, stock = stock_of("sparse-mla-prefill-bh64")
    moved = b"# a new line upstream\n" + stock
    row = _decide(overlay, moved, stock, {}, tmp_path, log=lambda m: None, project=ROOT)
    assert row.status == NEEDS_PORTING and "offset: not taken, no proof runs here" in row.detail
    assert str(_decide(overlay, stock, stock, {}, tmp_path, log=lambda m: None, project=ROOT).status) == \
        "ported (exact), not proven here"


def test_a_probe_on_a_file_that_moved_away_says_changed():
    """`absent: PATTERN` in a file that is not there is not 'still absent': the record needs a look."""
    topk = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == "deterministic-indexer-topk")
    path = topk.probe[0]["path"]
    holds, detail = overlays_mod.probe_holds(topk, {path: None})
    assert not holds and f"{path} is not in this base (moved or removed?)" in detail
    assert overlays_mod.probe_holds(topk, {path: b"def _topk_indices_torch(x):\n    pass\n"})[0]  # the control


def test_a_file_absent_probe_holds_only_where_python_finds_nothing(registry, tmp_path):
    """`file: absent` says the module is not in the base. A link or a folder at that path, a link over a
    folder above it (the module then lies where the link leads), or the module in a form Python imports
    in its stead (a package, an extension, bytecode without source) is not nothing: the record needs a
    look, and the VEX says under_investigation, not not_affected. Read through the merged view of a
    real image, as rebase and the build read it."""
    import dataclasses

    from bakery.bake.opened import probe_files
    from test_engines import filesystem
    from test_toolchain_root import busybox_layer, tar

    # an audit record of a Gluon kernel the base may not have (as AITER's was, before the fixture had it)
    aiter = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml")
                 if o.id == "aiter-paged-mqa-logits-64bit-offsets")
    gluon = dataclasses.replace(aiter, status="absent", probe=(
        {"file": "absent", "path": aiter.target, "why": "the base's AITER has no Gluon paged-MQA-logits kernel"},))
    path = aiter.target.lstrip("/")
    folder, stem = path.rsplit("/", 1)[0], path.rsplit("/", 1)[1][:-3]
    # (the layer's members: name, kind, bytes or link target, mode; what the probe says, None if it holds)
    cases: dict[str, tuple[list[tuple[str, str, str | bytes, int]], str | None]] = {
        "link": ([(path, "symlink", "elsewhere.py", 0o777)], "a symlink"),
        "folder": ([(path, "dir", b"", 0o755), (f"{path}/x", "file", b"", 0o644)], "a dir"),
        "link above": ([(folder, "symlink", "/opt/real", 0o777), (f"opt/real/{stem}.py", "file", b"code", 0o644)],
                       f"under a symlink (/{folder})"),
        "package": ([(f"{folder}/{stem}/__init__.py", "file", b"code", 0o644)], f"the module as /{folder}/{stem}"),
        "extension": ([(f"{folder}/{stem}.cpython-312-x86_64-linux-gnu.so", "file", b"\x7fELF", 0o644)],
                      f"the module as /{folder}/{stem}.cpython-312-x86_64-linux-gnu.so"),
        "bytecode alone": ([(f"{folder}/{stem}.pyc", "file", b"bytes", 0o644)], f"the module as /{folder}/{stem}.pyc"),
        "nothing": ([(f"{folder}/other.py", "file", b"", 0o644)], None),  # the control: it holds
    }
    for name, (given, said) in cases.items():
        repo = "test/probe-" + name.replace(" ", "-")
        ref = push_image(registry, repo, [busybox_layer(), tar(*given)])
        files = probe_files(filesystem(ref, tmp_path / repo.replace("/", "-")), ["/" + path])
        assert files == {"/" + path: said}, (name, files)
        holds, detail = overlays_mod.probe_holds(gluon, files)
        assert holds == (said is None), (name, detail)
        assert said is None or f"is {said} in this base" in detail, detail


def test_the_committed_lock_reads_into_a_lock_and_writes_back_byte_identical(tmp_path):
    from bakery.inputs.overlays import Lock, read_lock, write_lock

    committed = ROOT / "overlays" / "overlays.lock"
    lock = read_lock(committed)
    fence = lock.entry("cpu-kv-transfer-fence")
    assert isinstance(lock, Lock) and fence is not None and fence.target.endswith("/gpu_worker.py")
    write_lock(tmp_path / "again.lock", lock)
    assert (tmp_path / "again.lock").read_bytes() == committed.read_bytes()


@pytest.mark.parametrize("edit", [lambda d: d["overlays"][0].pop("result_sha256"),
                                  lambda d: d["overlays"][0].update(patch_sha256="not-hex"),
                                  lambda d: d["overlays"][0].update(base_sha256=7),
                                  lambda d: d.update(overlays={"id": "x"}),
                                  lambda d: d.pop("base")])
def test_a_lock_edited_into_another_shape_is_one_input_error(tmp_path, edit):
    """Read before: a missing key surfaced as a KeyError deep in the build's gate."""
    from bakery.errors import InputError
    from bakery.inputs.overlays import read_lock

    doc = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    edit(doc)
    (tmp_path / "overlays.lock").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="run `invoke lock`"):
        read_lock(tmp_path / "overlays.lock")
