"""Each overlay's behavioural proof (overlays/proofs/), run the way users run it: `invoke prove` on
the fixture base (real vLLM 0.26.0 bytes), plus what a proof must never do: pass when it cannot run.

The proofs execute the target's own code (Triton's interpreter, CPU torch, a recording model of
streams and events) against references written from each defect's description. What only an
MI300X can show is marked hardware-only in overlays.yaml and says so; no MI300X exists here.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.base import spec as base_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.inputs import overlays as overlays_mod, patch as patch_mod, proof_spec
from bakery.oci.registry import Registry
from bakery.proofs import runner as prove
from support import ROOT, invoke

pytest.importorskip("torch", reason="the overlay proofs need CPU torch (pip install -e '.[test]')")

REQUIRED = ["mxfp4-bitmatrix-padding-mask", "cpu-kv-transfer-fence", "fnuz-indexer-cache-writer",
            "exact-swiglu-clamp-kernel", "independent-draft-gumbel", "deterministic-sampler-topk-topp",
            "aiter-paged-mqa-logits-64bit-offsets"]


@pytest.fixture(scope="module")
def table(fixture_base):
    result = invoke(ROOT, "prove", "--base", str(fixture_base))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {}
    for line in result.stdout.splitlines()[1:]:
        words = line.split()
        rows[words[0]] = words[1:]
    return rows


@pytest.mark.parametrize("overlay", REQUIRED)
@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_each_overlay_is_broken_on_stock_and_fixed_overlaid(table, overlay):
    assert table[overlay][:2] == ["BROKEN", "FIXED"]


@pytest.mark.slow
def test_the_prove_table_names_the_check_behind_each_verdict(table):
    gumbel = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == "independent-draft-gumbel")
    assert gumbel.proof and gumbel.proof.script
    assert table["independent-draft-gumbel"][2:4] == [gumbel.proof.script.name, "(cpu)"]
    assert table["sparse-mla-prefill-bh64"][2] == "hardware"


@pytest.mark.slow
def test_hardware_only_overlay_says_why_and_audit_records_are_proven_on_stock(table):
    assert table["sparse-mla-prefill-bh64"][:2] == ["hardware-only", "hardware-only"]
    assert table["deterministic-indexer-topk"][:2] == ["BROKEN", "(audit)"]


@pytest.fixture(scope="module")
def versions(registry, fixture_base, tmp_path_factory):
    """{overlay id: (stock path, patched path)} with the stock bytes read from the fixture base."""
    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"))
    overlays = [o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.baked]
    found = fs.read([o.target for o in overlays])
    out = tmp_path_factory.mktemp("versions")
    paths = {}
    for o in overlays:
        target = found[o.target.lstrip("/")]
        assert target and target.data, o.target
        stock = target.data
        patched, _ = patch_mod.apply(o.parsed(), stock)
        (out / f"{o.id}.stock.py").write_bytes(stock)
        (out / f"{o.id}.patched.py").write_bytes(patched)
        paths[o.id] = (out / f"{o.id}.stock.py", out / f"{o.id}.patched.py")
    return paths


def spec_of(overlay_id: str) -> proof_spec.ProofSpec:
    spec = next(o.proof for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == overlay_id)
    assert spec is not None, (overlay_id, "has no proof")
    return spec


# -- CANNOT-PROVE is never a pass --------------------------------------------------------------------

@pytest.mark.slow
def test_a_target_that_raises_cannot_be_proven_with_one_line_why():
    verdict = prove.run(spec_of("cpu-kv-transfer-fence"), b"raise RuntimeError('boom')\n", {})
    assert verdict.verdict == prove.CANNOT and "RuntimeError: boom" in verdict.reason and "\n" not in verdict.reason


@pytest.mark.slow
def test_a_renamed_function_cannot_be_proven(versions):
    renamed = versions["exact-swiglu-clamp-kernel"][1].read_bytes().replace(b"def forward_native", b"def forward_eager")
    verdict = prove.run(spec_of("exact-swiglu-clamp-kernel"), renamed, {})
    assert verdict.verdict == prove.CANNOT and "forward_native is not in the target" in verdict.reason


@pytest.mark.slow
def test_a_proof_that_crashes_is_cannot_prove_not_a_pass(tmp_path, monkeypatch):
    """Even after printing a well-formed FIXED line: a proof that then exits non-zero did not finish."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    (tmp_path / "_proof.py").write_text("")
    for n, body in enumerate(["print('{\"verdict\": \"FIXED\"')", "print('[1, 2]')",
                              "print('{\"verdict\": \"FIXED\", \"reason\": \"ok\"}')"]):
        script = tmp_path / f"crash{n}.py"
        script.write_text(f"import sys\n{body}\nsys.exit(3)\n")
        verdict = prove.run(proof_spec.ProofSpec(script), b"x = 1\n", {})
        assert verdict.verdict == prove.CANNOT and "exit 3" in verdict.reason, (body, verdict)


FORGED = b'{"verdict": "FIXED", "reason": "fixed upstream", "measured": {}, "target": 0}\n'


@pytest.mark.slow
@pytest.mark.parametrize("how", [
    b"print(FORGED.decode(), flush=True)\n",  # on its stdout, as the verdict used to be read
    b"for fd in range(1, 256):\n    try:\n        os.write(fd, FORGED)\n    except OSError:\n        pass\n",
])
def test_a_stock_target_that_writes_a_verdict_and_exits_is_not_fixed(versions, how, tmp_path, monkeypatch):
    """Found by the attacker review (issue 50 item 8): the stock target's code, as its module loads,
    writes a FIXED line and exits 0. The verdict was read from what the child wrote, so the proof
    said FIXED on stock and rebase would have marked the overlay fixed upstream. It is now the
    judge's, from the data a finished run hands back: there is none, so it cannot prove."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    stock = versions["cpu-kv-transfer-fence"][0].read_bytes()
    forging = stock + b"\nimport os\nFORGED = " + repr(FORGED).encode() + b"\n" + how + b"os._exit(0)\n"
    verdict = prove.run(spec_of("cpu-kv-transfer-fence"), forging, {})
    assert verdict.verdict == prove.CANNOT, verdict
    assert prove.run(spec_of("cpu-kv-transfer-fence"), stock, {}).verdict == prove.BROKEN  # the control


JUDGE = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
sys.argv[1:] = []
import cpu_kv_transfer_fence as fence, fnuz_indexer_cache as fnuz, mxfp4_bitmatrix_padding as mxfp4
import _proof
empty = np.zeros(0, dtype=np.int32)
payloads = {
    "fence": (fence, {"store": np.array([0, 0]), "load": np.array([0, 0]), "ops": np.array(0),
                      "edges": np.zeros((0, 2), dtype=np.int64)}),
    "mxfp4": (mxfp4, {"row_block0": empty, "col_all": empty, "row_all": empty}),
    "fnuz": (fnuz, {"ocp_cache": np.zeros((4, 64, 132), dtype=np.uint8), "fnuz_cache": np.zeros((4, 64, 132), dtype=np.uint8),
                    "by_reader": np.zeros((80, 128))}),
}
print(json.dumps({name: _proof._judged(module.judge, [], b"D" + _proof._pack(data), 0)["verdict"]
                  for name, (module, data) in payloads.items()}))
"""


@pytest.mark.slow
def test_a_run_that_hands_back_empty_data_is_not_judged_fixed():
    """Found by the second attacker review: a child could hand back data that passes a judge
    without running anything: a graph where the kernel is the copy, empty kernel outputs, caches of
    zeros (whose keys are all zero on every side). Each judge now refuses data of another shape
    than a run gives, and the FNUZ judge keys that read back mostly zero."""
    done = subprocess.run([sys.executable, "-c", JUDGE, str(ROOT / "overlays" / "proofs")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"fence": "FAILED", "mxfp4": "FAILED", "fnuz": "CANNOT-PROVE"}


@pytest.mark.slow
def test_a_poisoned_verdict_cache_entry_is_dropped_and_rerun(versions, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    spec, stock = spec_of("cpu-kv-transfer-fence"), versions["cpu-kv-transfer-fence"][0].read_bytes()
    assert prove.run(spec, stock, {}).verdict == prove.BROKEN
    entry = tmp_path / "proofs" / f"{prove.cache_key(spec, stock, {})}.json"
    doc = json.loads(entry.read_text())
    entry.write_text(json.dumps({**doc, "verdict": "FIXED", "key": "0" * 64}))  # a forged pass
    assert prove.run(spec, stock, {}).verdict == prove.BROKEN
    assert "dropped a corrupt proof cache entry" in capsys.readouterr().err


@pytest.mark.slow
def test_the_fence_proof_catches_a_fence_on_stores_only(versions):
    """A mutation of the overlaid file that fences only stores again must be BROKEN: the proof
    reads the happens-before order the code produces, not the text of the patch."""
    overlaid = versions["cpu-kv-transfer-fence"][1].read_text()
    line = "        stream.wait_stream(current_platform.current_stream())\n"
    mutated = overlaid.replace(line, "        if self.gpu_to_cpu:\n    " + line)
    assert mutated != overlaid
    assert prove.run(spec_of("cpu-kv-transfer-fence"), mutated.encode(), {}).verdict == prove.BROKEN


# -- (d) FNUZ FP8 writer: the read contract and the compiled code -------------------------------------

@pytest.mark.slow
def test_the_base_reads_the_indexer_cache_shuffled(versions):
    """The contract the overlay writes to, as the base's ROCm indexer states it: decode hands the
    cache to AITER with Preshuffle=block_size > 1, prefill gathers it SHUFFLE for blocks above 1.
    A base that reads DeepSeek V4's cache flat instead (vLLM PR #50455) fails here: supersede the
    overlay then."""
    tree = ast.parse(versions["sparse-mla-prefill-bh64"][1].read_text())
    calls = [ast.unparse(k.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
             for k in n.keywords if k.arg == "Preshuffle"]
    layouts = [ast.unparse(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
               and ast.unparse(n.targets[0]) == "layout"]
    assert calls == ["block_size > 1"]
    assert set(layouts) == {"'NORMAL' if block_size == 1 else 'SHUFFLE'"}


def amdgcn(writer: Path, *args: str) -> dict:
    pytest.importorskip("triton", reason="needs triton's compiler")
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "proofs" / "indexer_writer_isa.py"), str(writer), *args],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


@pytest.mark.parametrize("which", [0, 1], ids=["stock", "overlaid"])
@pytest.mark.slow
def test_gfx942_writer_converts_with_the_hardware_fnuz_instruction(versions, which):
    """Triton's real compiler, ahead of time for gfx942 (no GPU needed), flags as the launcher sets
    them on an MI300X: the overlaid writer converts with v_cvt_pk_fp8_f32, the MI300X's own FP8
    (FNUZ) conversion; the stock one's OCP E4M3 has no gfx942 instruction, Triton emulates it."""
    writer = versions["fnuz-indexer-cache-writer"][which]
    code = amdgcn(writer, "gfx942", "224", "1", "1") if which else amdgcn(writer, "gfx942", "448")
    assert ("v_cvt_pk_fp8_f32" in code["fp8_instructions"]) is (which == 1), code


@pytest.mark.slow
def test_ocp_hardware_runs_the_stock_machine_code(versions):
    """For gfx950 (MI355X, OCP FP8), with its flags at the default the launcher leaves them at
    there, the overlaid writer compiles to exactly the stock machine code."""
    stock, overlaid = versions["fnuz-indexer-cache-writer"]
    assert amdgcn(overlaid, "gfx950", "448", "0", "0") == amdgcn(stock, "gfx950", "448")




# -- what a verdict is keyed by, and what a proof can execute (issue 18) -------------------------

def test_the_verdict_cache_key_covers_every_project_file_the_proof_executes(tmp_path):
    """The SwiGLU proof imports hip/bakery_kernels: editing that file must make the verdict run again."""
    import shutil

    declared = spec_of("exact-swiglu-clamp-kernel")
    assert ROOT / "hip" / "bakery_kernels" / "__init__.py" in declared.code and declared.script
    (tmp_path / "overlays" / "proofs").mkdir(parents=True)
    (tmp_path / "hip" / "bakery_kernels").mkdir(parents=True)
    for path in declared.code:
        shutil.copy(path, tmp_path / path.relative_to(ROOT))
    uses = tmp_path / "hip" / "bakery_kernels" / "__init__.py"
    spec = proof_spec.ProofSpec(tmp_path / "overlays" / "proofs" / declared.script.name, uses=(uses,))
    before = prove.cache_key(spec, b"target", {})
    uses.write_text(uses.read_text() + "\n# changed\n")
    assert prove.cache_key(spec, b"target", {}) != before


@pytest.mark.slow
def test_a_proof_cannot_execute_a_project_file_it_does_not_declare(versions, tmp_path, monkeypatch):
    """The sandbox shows a proof only its declared code, so an undeclared import fails (and its
    verdict is never cached under a key that does not cover what ran)."""
    import dataclasses

    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    undeclared = dataclasses.replace(spec_of("exact-swiglu-clamp-kernel"), uses=())
    verdict = prove.run(undeclared, versions["exact-swiglu-clamp-kernel"][0].read_bytes(), {})
    assert verdict.verdict == prove.CANNOT and "bakery_kernels/__init__.py" in verdict.reason, verdict.reason


@pytest.mark.slow
def test_stock_and_overlaid_run_in_one_process_and_keep_apart(versions, tmp_path, monkeypatch):
    """One sandboxed process per proof: both verdicts come back, each from its own bytes."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    stock, patched = versions["cpu-kv-transfer-fence"]
    verdicts = prove.run_batch(spec_of("cpu-kv-transfer-fence"), [stock.read_bytes(), patched.read_bytes()], {})
    assert [v.verdict for v in verdicts] == [prove.BROKEN, prove.FIXED]


@pytest.fixture(scope="module")
def reads(registry, fixture_base):
    """The other base files the proofs read, from the fixture base."""
    reg = Registry(registry)
    fs = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64"))
    paths = [r for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.proof for r in o.proof.reads]
    found = {p: fs.read([p])[p.lstrip("/")] for p in paths}
    assert all(f and f.data is not None for f in found.values()), found
    return {p: f.data for p, f in found.items() if f and f.data is not None}


@pytest.mark.slow
def test_the_gumbel_proof_catches_a_salt_that_keeps_the_targets_key(versions, reads):
    """The overlaid speculator with its salt made 0: the draft samples with the target's key again."""
    overlaid = versions["independent-draft-gumbel"][1].read_text()
    mutated = overlaid.replace("torch.bitwise_xor(seeds, DRAFT_NOISE_SALT, out=self.seeds)",
                               "torch.bitwise_xor(seeds, 0, out=self.seeds)")
    assert mutated != overlaid
    verdict = prove.run(spec_of("independent-draft-gumbel"), mutated.encode(), reads)
    assert verdict.verdict == prove.BROKEN and "replacements follow the draft's noise" in verdict.reason, verdict.reason


DSPARK = "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"


@pytest.mark.slow
def test_the_gumbel_proof_draws_drafts_through_the_bases_own_dspark_sampler(versions, reads):
    """The draft's key comes from DSpark's own call, not from the proof: make DSpark key its draws
    by the drafted position itself (Q) instead of the one before it (Q-1, the key the target's
    resample uses), and the stock speculator's drafts no longer share the target's noise."""
    stock = versions["independent-draft-gumbel"][0].read_bytes()
    assert prove.run(spec_of("independent-draft-gumbel"), stock, reads).verdict == prove.BROKEN
    keyed = reads[DSPARK].replace(b"sample_pos[:, i] - 1,", b"sample_pos[:, i],")
    assert keyed != reads[DSPARK]
    verdict = prove.run(spec_of("independent-draft-gumbel"), stock, {**reads, DSPARK: keyed})
    assert verdict.verdict == prove.FIXED, verdict.reason


@pytest.mark.slow
def test_a_branch_on_a_name_the_proof_does_not_model_is_cannot_prove(versions):
    """Upstream often ships a fix behind a flag that is off by default. A stand-in's value is not
    known, so the fence gated on an unmodeled vllm.envs flag is CANNOT-PROVE naming it, never
    FIXED because a stand-in happened to be true."""
    overlaid = versions["cpu-kv-transfer-fence"][1].read_text()
    line = "        stream.wait_stream(current_platform.current_stream())\n"
    gated = overlaid.replace(line, "        if self.gpu_to_cpu or envs.VLLM_KV_OFFLOAD_FENCE_LOADS:\n    " + line)
    gated = gated.replace("\nimport torch\n", "\nimport torch\nimport vllm.envs as envs\n", 1)
    assert gated.count("envs.VLLM_KV_OFFLOAD_FENCE_LOADS") == 1 and "import vllm.envs as envs" in gated
    verdict = prove.run(spec_of("cpu-kv-transfer-fence"), gated.encode(), {})
    assert verdict.verdict == prove.CANNOT and "vllm.envs.VLLM_KV_OFFLOAD_FENCE_LOADS" in verdict.reason, verdict


@pytest.mark.slow
def test_an_argument_the_target_no_longer_takes_is_cannot_prove(versions, reads):
    """The proof gives rejection_sample use_block_verification=True (DSpark as served): a base
    whose function dropped it would silently run another path, so the proof says it cannot tell."""
    rejection = "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"
    renamed = reads[rejection].replace(b"use_block_verification", b"block_verify")
    assert renamed != reads[rejection]
    verdict = prove.run(spec_of("independent-draft-gumbel"), versions["independent-draft-gumbel"][0].read_bytes(),
                        {**reads, rejection: renamed})
    assert verdict.verdict == prove.CANNOT and "no longer takes use_block_verification" in verdict.reason, verdict


@pytest.mark.slow
def test_the_swiglu_proof_imports_bakery_kernels_as_the_image_does(versions):
    """An overlay whose import of the package never succeeds in the image (a misspelt name) serves
    the stock arithmetic through its fallback: BROKEN, though its fast path alone is exact."""
    overlaid = versions["exact-swiglu-clamp-kernel"][1].read_bytes()
    misspelt = overlaid.replace(b"import bakery_kernels as _bakery_kernels", b"import bakery_kernel as _bakery_kernels")
    assert misspelt != overlaid
    assert prove.run(spec_of("exact-swiglu-clamp-kernel"), overlaid, {}).verdict == prove.FIXED
    verdict = prove.run(spec_of("exact-swiglu-clamp-kernel"), misspelt, {})
    assert verdict.verdict == prove.BROKEN and verdict.measured["fallback"]["differ"] > 0, verdict.reason


SAMPLER = "deterministic-sampler-topk-topp"
ROUTE = b"        return _bakery_kernels.top_k_top_p(logits, k, p)\n"


@pytest.mark.parametrize("route, named", [
    # ties broken to the higher token index: the row reversed, masked, reversed back
    (b"        return _bakery_kernels.top_k_top_p(logits.flip(-1), None if k is None else k, p).flip(-1)\n",
     "ties: "),
    # the deterministic path for big batches only: a row alone takes the stock sort
    (b"        if logits.shape[0] >= 8:\n            return _bakery_kernels.top_k_top_p(logits, k, p)\n",
     "batch dependence: "),
    # NaN ranked first and kept, as the sort path ranks it
    (b"        nan = logits.isnan()\n        out = _bakery_kernels.top_k_top_p(logits.masked_fill(nan, 3e38), k, p)\n"
     b"        return out.masked_fill_(nan & (out > float('-inf')), float('nan'))\n", "NaN: "),
], ids=["ties to the higher index", "only in big batches", "NaN kept"])
@pytest.mark.slow
def test_the_sampler_proof_names_the_property_a_wrong_route_breaks(versions, reads, route, named):
    """The overlaid sampler, its route to bakery_kernels changed so that one property of the
    semantics fails: BROKEN, naming it (the proof's own reference, not the glue, decides)."""
    overlaid = versions[SAMPLER][1].read_bytes()
    assert overlaid.count(ROUTE) == 1
    spec = spec_of(SAMPLER)
    files = {r: reads[r] for r in spec.reads}
    assert prove.run(spec, overlaid, files).verdict == prove.FIXED
    verdict = prove.run(spec, overlaid.replace(ROUTE, route), files)
    assert verdict.verdict == prove.BROKEN and named in verdict.reason.split("; without bakery_kernels")[0], \
        verdict.reason


@pytest.mark.slow
def test_the_sampler_proof_cannot_prove_what_the_served_sampler_no_longer_calls(versions, reads):
    """A base whose served sampler stopped calling apply_top_k_top_p: the overlay would route a
    function nothing serves with, so no verdict (FIXED would claim a served path that is not there)."""
    spec = spec_of(SAMPLER)
    caller = "/usr/local/lib/python3.12/dist-packages/vllm/v1/worker/gpu/sample/sampler.py"
    files = {r: reads[r] for r in spec.reads}
    assert files[caller].count(b"apply_top_k_top_p(") == 2
    files[caller] = files[caller].replace(b"apply_top_k_top_p(", b"apply_top_k_top_p_v2(")
    verdict = prove.run(spec, versions[SAMPLER][1].read_bytes(), files)
    assert verdict.verdict == prove.CANNOT and "no longer calls apply_top_k_top_p" in verdict.reason, verdict.reason


@pytest.mark.slow
def test_proofs_on_a_gpu_where_there_is_none_say_so_in_one_line(tmp_path, monkeypatch):
    if list(Path("/dev").glob("nvidia*")) or Path("/dev/kfd").exists():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    from bakery.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="no GPU device nodes here"):
        prove.run(spec_of("cpu-kv-transfer-fence"), b"x = 1\n", {}, device="cuda")
    result = invoke(ROOT, "prove", "--device", "tpu")
    assert result.returncode == 2 and "--device tpu: say cpu or cuda" in result.stderr


def test_the_verdict_cache_key_covers_the_device():
    spec = spec_of("cpu-kv-transfer-fence")
    assert prove.cache_key(spec, b"t", {}, "cpu") != prove.cache_key(spec, b"t", {}, "cuda")


@pytest.mark.parametrize("mutation", [
    [("            + (kv_pos_in_block % 16) * 16\n", "            + (kv_pos_in_block % 16)\n"),
     ("(block // 16) * 256 + block % 16", "(block // 16) * 256 + (block % 16) * 16")],  # each tile transposed
    [("            fp8_max = 224.0\n", "            fp8_max = 448.0\n")],  # OCP's max in FNUZ bytes
], ids=["tile transposed", "OCP max"])
@pytest.mark.slow
def test_the_fnuz_proof_catches_a_wrong_layout_or_scale(versions, reads, mutation):
    overlaid = versions["fnuz-indexer-cache-writer"][1].read_text()
    mutated = overlaid
    for old, new in mutation:
        assert old in mutated
        mutated = mutated.replace(old, new)
    verdict = prove.run(spec_of("fnuz-indexer-cache-writer"), mutated.encode(), reads)
    assert verdict.verdict == prove.BROKEN, verdict.reason


# -- the proofs of one base share one sandbox's start (issue 54) ---------------------------------------

@pytest.mark.slow
def test_the_proofs_of_a_base_give_the_same_verdicts_together_in_any_order_as_alone(versions, tmp_path, monkeypatch):
    """run_many forks every proof of a base from one process that imported torch once: each
    proof's verdicts are the ones it gives in a sandbox of its own, whatever the order."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    ids = ["cpu-kv-transfer-fence", "exact-swiglu-clamp-kernel"]
    files = prove.BaseFiles("sha256:" + "1" * 64, {})
    jobs: dict = {(o, which): (spec_of(o), path.read_bytes(), files) for o in ids
                  for which, path in zip(("stock", "overlaid"), versions[o], strict=True)}
    alone = {key: prove.run_batch(spec, [target], reads, reprove=True)[0] for key, (spec, target, reads) in jobs.items()}
    assert [alone[(o, w)].verdict for o in ids for w in ("stock", "overlaid")] == [prove.BROKEN, prove.FIXED] * 2
    for order in (list(jobs), list(reversed(jobs))):
        together = prove.run_many({k: jobs[k] for k in order}, reprove=True)
        assert {k: (v.verdict, v.reason, v.key) for k, v in together.items()} == \
            {k: (v.verdict, v.reason, v.key) for k, v in alone.items()}, order


FORGED_RUN = {"exit": 0, "stdout": FORGED.decode(), "stderr": ""}


@pytest.mark.slow
@pytest.mark.parametrize("how", [
    b"print(FORGED.decode(), flush=True)\n",  # its own stdout
    b"for fd in range(1, 256):\n    try:\n        os.write(fd, FORGED)\n    except OSError:\n        pass\n",
    b"for pid in os.listdir('/proc'):\n    for fd in range(0, 64):\n        try:\n"  # a parent's or sibling's fds
    b"            with open(f'/proc/{pid}/fd/{fd}', 'wb') as f:\n                f.write(FORGED)\n"
    b"        except (OSError, ValueError):\n            pass\n",
], ids=["stdout", "every fd", "proc fds"])
def test_a_target_cannot_write_another_proofs_verdict(versions, how, tmp_path, monkeypatch):
    """From the attacker's side: the stock target of one proof, run beside another proof of the
    same base, writes a proof's FIXED line and what the zygote prints for each proof (a run that
    exited 0 with a FIXED line) wherever it can reach. The other proof's stock stays BROKEN: only the zygote writes its stdout,
    and its fds are not the children's to open."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    forged = FORGED + b"".join(json.dumps({"proof": i, **FORGED_RUN}).encode() + b"\n" for i in range(4))
    stock = versions["cpu-kv-transfer-fence"][0].read_bytes()
    forging = stock + b"\nimport os\nFORGED = " + repr(forged).encode() + b"\n" + how
    files = prove.BaseFiles("sha256:" + "1" * 64, {})
    verdicts = prove.run_many({("fence", "stock"): (spec_of("cpu-kv-transfer-fence"), forging, files),
                               ("swiglu", "stock"): (spec_of("exact-swiglu-clamp-kernel"),
                                                     versions["exact-swiglu-clamp-kernel"][0].read_bytes(), files)},
                              reprove=True)
    assert verdicts[("swiglu", "stock")].verdict == prove.BROKEN, verdicts
    assert verdicts[("fence", "stock")].verdict != prove.FIXED, verdicts  # its own: from the data it handed back


def test_the_proofs_of_two_bases_never_share_a_sandbox(tmp_path, monkeypatch):
    """A base's code may shape the verdicts on its own bytes, never those on another's: each
    base's files (one `reads` mapping) get a sandbox of their own."""
    from bakery import sandbox

    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    plans = []

    def recorded(argv, readable, inputs, *args, **kwargs):
        plans.append(json.loads((inputs / "plan.json").read_text()))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(sandbox, "run", recorded)
    fence, swiglu = spec_of("cpu-kv-transfer-fence"), spec_of("exact-swiglu-clamp-kernel")
    old, new = prove.BaseFiles("sha256:" + "1" * 64, {}), prove.BaseFiles("sha256:" + "2" * 64, {})
    prove.run_many({("a", "old"): (fence, b"x = 1\n", old), ("b", "old"): (swiglu, b"x = 2\n", old),
                    ("a", "new"): (fence, b"x = 3\n", new)}, reprove=True)
    assert sorted(len(plan) for plan in plans) == [1, 2]  # the old base's two proofs together; the new one's apart
    plans.clear()
    files: dict = {}  # files no base names: nothing to key a shared run by
    prove.run_many({("a", "old"): (fence, b"x = 1\n", files), ("b", "old"): (swiglu, b"x = 2\n", files)}, reprove=True)
    assert sorted(len(plan) for plan in plans) == [1, 1]


def test_a_verdict_proven_beside_a_bases_other_proofs_is_keyed_by_that_base():
    """Found by the attacker review: a hostile base copies one proof's target and reads from a
    good base byte for byte, and its code in another proof rewrites that proof's run beside it.
    Keyed by the proof's own inputs alone, the forged verdict would be taken for the good base's
    bytes (from this machine's cache, or signed, from the registry)."""
    spec = spec_of("cpu-kv-transfer-fence")
    good, hostile = prove.BaseFiles("sha256:" + "1" * 64, {}), prove.BaseFiles("sha256:" + "2" * 64, {})
    assert prove.cache_key(spec, b"same bytes", good) != prove.cache_key(spec, b"same bytes", hostile)
    assert prove.cache_key(spec, b"same bytes", good) == prove.cache_key(spec, b"same bytes",
                                                                          prove.BaseFiles(good.base, {}))


@pytest.mark.slow
def test_what_a_target_leaves_running_does_not_hold_the_other_proofs(versions, tmp_path, monkeypatch):
    """From the attacker's side: the stock target's code leaves a process behind holding its
    proof's stderr. Alone in a sandbox, the sandbox ended with its proof; sharing one, were that
    stderr a pipe read to its end, it would keep every proof of the base waiting to the sandbox's
    time limit (then CANNOT-PROVE). The zygote waits for the proof, not for its output's end."""
    import dataclasses

    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    monkeypatch.setattr(prove, "LIMITS", dataclasses.replace(prove.LIMITS, seconds=60))
    stock = versions["cpu-kv-transfer-fence"][0].read_bytes()
    lingering = stock + b"\nimport os, time\nif os.fork() == 0:\n    os.closerange(3, 4096)\n    time.sleep(600)\n"
    files = prove.BaseFiles("sha256:" + "1" * 64, {})
    verdicts = prove.run_many({("fence", "stock"): (spec_of("cpu-kv-transfer-fence"), lingering, files),
                               ("swiglu", "stock"): (spec_of("exact-swiglu-clamp-kernel"),
                                                     versions["exact-swiglu-clamp-kernel"][0].read_bytes(), files)},
                              reprove=True)
    assert [verdicts[k].verdict for k in (("fence", "stock"), ("swiglu", "stock"))] == [prove.BROKEN] * 2, verdicts
