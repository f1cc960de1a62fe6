"""The overlay proofs on a real GPU, their Triton kernels compiled for it instead of interpreted,
and the GPU check of the hardware-only overlay (sparse-mla-prefill-bh64).

No AMD GPU is reachable; this runs on the lent NVIDIA H200 (torch's "cuda" device; on an MI300X
the same code runs on ROCm). Inputs are vLLM 0.26.0's files (the fixture base's wheel), stock and
overlaid, written on the build machine and carried:
    .venv/bin/python tests/gpu/test_proofs_gpu.py        (writes out/gpu-proofs/)
    python3 -m pytest --noconftest -q -rs -s tests/gpu/test_proofs_gpu.py
Each proof runs as `invoke prove --device cuda` runs it: prove.run_batch in the sandbox, with the
GPU's device nodes bound (bubblewrap carried as out/gpu-proofs/bin/bwrap). The sparse MLA check
compares vLLM's prefill kernel at block_h 16 (stock) and 64 (overlaid) with a float64 reference at
DeepSeek-V4 shapes (512 heads, head dim 448 + 64, top-512 and top-1024 routed rows) and prints both
times; speed on an MI300X, which is what the overlay is for, stays a question for an MI300X.
Where no CUDA GPU exists (CI, the build machine) every test here skips and says why. The latest
output, dated, is kept beside this file (LATEST.txt).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "out" / "gpu-proofs"
SITE = "/usr/local/lib/python3.12/dist-packages/"
MLA = SITE + "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
sys.path.insert(0, str(ROOT))


def write_inputs() -> None:
    """out/gpu-proofs/: each required overlay's stock and overlaid target and its reads, from the
    vLLM 0.26.0 wheel the fixture base installs, plus bwrap from Debian's bubblewrap package."""
    import subprocess
    import tempfile
    import zipfile

    import yaml

    from bakery.dev import fixture
    from bakery.inputs import overlays, patch

    spec = yaml.safe_load((ROOT / "tests" / "fixture" / "fixture.yaml").read_text())
    vllm = next(w for w in spec["wheels"] if w["name"] == "vllm")
    archive = zipfile.ZipFile(fixture.wheel(vllm, print))
    shutil.rmtree(INPUTS, ignore_errors=True)
    (INPUTS / "bin").mkdir(parents=True)
    manifest = {}
    for o in overlays.load(ROOT / "overlays" / "overlays.yaml"):
        if not o.baked:
            continue
        stock = archive.read(o.target.removeprefix(SITE))
        folder = INPUTS / o.id
        folder.mkdir()
        (folder / "stock.py").write_bytes(stock)
        (folder / "overlaid.py").write_bytes(patch.apply(o.parsed(), stock)[0])
        reads = o.proof.reads if o.proof else ()
        for i, path in enumerate(reads):
            (folder / f"read{i}.py").write_bytes(archive.read(path.removeprefix(SITE)))
        manifest[o.id] = list(reads)
    (INPUTS / "manifest.json").write_text(json.dumps(manifest, indent=1))
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "bubblewrap"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("bubblewrap_*.deb"))
        subprocess.run(["dpkg", "-x", str(deb), tmp], check=True)
        shutil.copy(Path(tmp) / "usr" / "bin" / "bwrap", INPUTS / "bin" / "bwrap")
    print(f"wrote {INPUTS}: carry out/gpu-proofs to the GPU machine")


if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="needs torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (runs on the lent H200)")]


@pytest.fixture(scope="module")
def manifest() -> dict:
    if not (INPUTS / "manifest.json").exists():  # on a GPU this must run: a missing input is a failure
        pytest.fail(f"no inputs in {INPUTS}: write them on the build machine (see this file's docstring)")
    os.environ["PATH"] = f"{INPUTS / 'bin'}:{os.environ['PATH']}"
    return json.loads((INPUTS / "manifest.json").read_text())


def _proven(overlay_id: str, manifest: dict):
    from bakery.inputs import overlays
    from bakery.proofs import runner as prove

    o = next(o for o in overlays.load(ROOT / "overlays" / "overlays.yaml") if o.id == overlay_id)
    folder = INPUTS / overlay_id
    reads = {path: (folder / f"read{i}.py").read_bytes() for i, path in enumerate(manifest[overlay_id])}
    targets = [(folder / name).read_bytes() for name in ("stock.py", "overlaid.py")]
    assert o.proof is not None, overlay_id
    return prove.run_batch(o.proof, targets, reads, device="cuda")


@pytest.mark.parametrize("overlay_id", ["mxfp4-bitmatrix-padding-mask", "cpu-kv-transfer-fence",
                                        "exact-swiglu-clamp-kernel", "independent-draft-gumbel"])
def test_proof_on_the_gpu_is_broken_on_stock_and_fixed_overlaid(manifest, overlay_id, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    stock, overlaid = _proven(overlay_id, manifest)
    print(f"\n{overlay_id} on {torch.cuda.get_device_name()}: stock {stock.verdict} ({stock.reason}); "
          f"overlaid {overlaid.verdict} ({overlaid.reason})")
    assert (stock.verdict, overlaid.verdict) == ("BROKEN", "FIXED"), (stock.reason, overlaid.reason)


def test_fnuz_proof_on_the_gpu_says_what_this_gpu_can_tell(manifest, tmp_path, monkeypatch):
    """The FNUZ flavour of FP8 exists on AMD GPUs only: on an MI300X this is BROKEN/FIXED like the
    rest; on NVIDIA, Triton has no FNUZ type, and the proof must say it cannot tell, not pass."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    stock, overlaid = _proven("fnuz-indexer-cache-writer", manifest)
    print(f"\nfnuz-indexer-cache-writer on {torch.cuda.get_device_name()}: stock {stock.verdict} ({stock.reason}); "
          f"overlaid {overlaid.verdict} ({overlaid.reason})")
    if torch.version.hip:
        assert (stock.verdict, overlaid.verdict) == ("BROKEN", "FIXED")
    else:
        assert stock.verdict == overlaid.verdict == "CANNOT-PROVE" and "no FNUZ FP8" in overlaid.reason


# -- sparse-mla-prefill-bh64: what a GPU can tell of a tile-size change -------------------------------

HEADS, NOPE, ROPE, QUERIES, KV_ROWS = 512, 448, 64, 64, 16384


def _prefill(path: Path):
    sys.path.insert(0, str(ROOT / "overlays" / "proofs"))
    os.environ["BAKERY_PROOF_DEVICE"] = "cuda"
    import _proof

    name = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
    return _proof.need(_proof.load_vllm({name: str(path)})[name], "_rocm_sparse_attn_prefill_ragged_triton")


def _inputs(routed: int):
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(QUERIES, HEADS, NOPE + ROPE, device="cuda", generator=g).to(torch.bfloat16)
    kv = torch.randn(KV_ROWS, NOPE + ROPE, device="cuda", generator=g).to(torch.bfloat16)
    indices = torch.stack([torch.randperm(KV_ROWS, device="cuda", generator=g)[:routed] for _ in range(QUERIES)])
    indptr = torch.arange(0, QUERIES * routed + 1, routed, device="cuda", dtype=torch.int32)
    sink = torch.randn(HEADS, device="cuda", generator=g)
    return q, kv, indices.flatten().to(torch.int32), indptr, sink


def _reference(q, kv, indices, sink, scale, routed: int) -> torch.Tensor:
    """softmax over the routed rows and the head's sink, times the rows, in float64."""
    rows = kv.double()[indices.long()].view(QUERIES, routed, -1)
    scores = torch.einsum("thd,tkd->thk", q.double(), rows) * scale
    scores = torch.cat([scores, sink.double()[None, :, None].expand(QUERIES, HEADS, 1)], dim=2)
    weights = torch.softmax(scores, dim=2)[..., :routed]
    return torch.einsum("thk,tkd->thd", weights, rows)


def _timed(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


@pytest.mark.parametrize("routed", [512, 1024])
def test_sparse_mla_prefill_block_h_64_is_no_less_accurate_than_16(manifest, routed):
    folder = INPUTS / "sparse-mla-prefill-bh64"
    q, kv, indices, indptr, sink = _inputs(routed)
    scale = (NOPE + ROPE) ** -0.5
    want = _reference(q, kv, indices, sink, scale, routed)
    result = {}
    for name in ("stock", "overlaid"):
        prefill = _prefill(folder / f"{name}.py")

        def call(prefill=prefill):
            return prefill(q, kv, indices, indptr, scale, sink, NOPE, ROPE)

        error = (call().double() - want).abs()
        result[name] = (float(error.max()), float(error.mean()), _timed(call))
    for name, (worst, mean, ms) in result.items():
        print(f"\nsparse MLA prefill, {HEADS} heads, {QUERIES} queries x {routed} routed rows, block_h "
              f"{16 if name == 'stock' else 64} ({name}) on {torch.cuda.get_device_name()}: max error {worst:.3g}, "
              f"mean {mean:.3g}, median {ms:.3f} ms")
    (stock_max, stock_mean, _), (over_max, over_mean, _) = result["stock"], result["overlaid"]
    assert over_max <= stock_max * 1.05 and over_mean <= stock_mean * 1.05


if __name__ == "__main__":
    write_inputs()
