"""Overlay fnuz-indexer-cache-writer on a real GPU, compiled by Triton's JIT (not its interpreter).

An H200 is OCP-FP8 hardware: there the overlaid launcher must leave its new flags at their
defaults and write exactly the stock bytes (on NVIDIA, too, DeepSeek V4's indexer cache is written
by this Triton kernel). The writer files come from the fixture base; write them on the build
machine, then carry out/gpu-writers to the device machine:
    .venv/bin/python tests/gpu/test_indexer_writer_gpu.py 127.0.0.1:5000/fixture/...@sha256:...
    python3 -m pytest --noconftest -q tests/gpu
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ROOT / "out" / "gpu-writers"
PROOFS = ROOT / "overlays" / "proofs"
TARGET = "/usr/local/lib/python3.12/dist-packages/vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py"
READER = "/usr/local/lib/python3.12/dist-packages/vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"


def proof_module():
    """The overlay's proof (overlays/proofs/fnuz_indexer_cache.py) with Triton's real JIT instead
    of its interpreter."""
    os.environ["TRITON_INTERPRET"] = "0"
    sys.path.insert(0, str(PROOFS))  # its helper, _proof.py
    spec = importlib.util.spec_from_file_location("fnuz_indexer_cache", PROOFS / "fnuz_indexer_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_on_gpu(proof, writer: Path):
    import torch

    module = proof.load(str(writer), str(WRITERS / "reader.py"))
    module.current_platform.fnuz = False
    args = {k: v.cuda() if torch.is_tensor(v) else v for k, v in proof.inputs().items()}
    args["k_cache_metadata"].slot_mapping = args["k_cache_metadata"].slot_mapping.cuda()
    cache = torch.zeros(4, proof.KV_BLOCK, proof.HEAD + 4, dtype=torch.uint8, device="cuda")
    module.compress_norm_rope_store_triton(kv_cache=cache, **args)
    torch.cuda.synchronize()
    return cache.cpu()


def test_ocp_gpu_writes_the_stock_bytes():
    torch = pytest.importorskip("torch", reason="needs torch")
    pytest.importorskip("triton", reason="needs triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (runs on the lent H200)")
    if not (WRITERS / "stock.py").exists():  # on a GPU this test must run: a missing input is a failure
        pytest.fail(f"no writer files in {WRITERS}: write them from the fixture base (see this file's docstring)")
    proof = proof_module()
    stock, overlaid = (write_on_gpu(proof, WRITERS / name) for name in ("stock.py", "overlaid.py"))
    assert stock.count_nonzero() > 0
    assert torch.equal(stock, overlaid)


def main(base_ref: str) -> None:
    """Write out/gpu-writers from a base: its stock writer and reader, and the overlaid writer."""
    sys.path.insert(0, str(ROOT))
    from bakery import base as base_mod, overlays as overlays_mod, patch as patch_mod
    from bakery.extract import BaseFilesystem
    from bakery.refs import Reference
    from bakery.registry import Registry

    ref = Reference.parse_pinned(base_ref, "base")
    registry = Registry(ref.registry)
    found = BaseFilesystem(registry, base_mod.resolve(registry, ref, "linux/amd64")).read([TARGET, READER])
    overlay = next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.target == TARGET)
    stock = found[TARGET.lstrip("/")].data
    WRITERS.mkdir(parents=True, exist_ok=True)
    (WRITERS / "stock.py").write_bytes(stock)
    (WRITERS / "overlaid.py").write_bytes(patch_mod.apply(overlay.parsed(), stock)[0])
    (WRITERS / "reader.py").write_bytes(found[READER.lstrip("/")].data)
    print(WRITERS)


if __name__ == "__main__":
    main(sys.argv[1])
