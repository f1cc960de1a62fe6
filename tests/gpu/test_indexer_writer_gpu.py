"""Overlay fnuz-indexer-cache-writer on a real GPU, compiled by Triton's JIT (not its interpreter).

An H200 is OCP-FP8 hardware: there the overlaid launcher must leave its new flags at their
defaults and write exactly the stock bytes (on NVIDIA, too, DeepSeek V4's indexer cache is written
by this Triton kernel). The writer files are tests/gpu/test_proofs_gpu.py's inputs (vLLM 0.26.0,
stock and overlaid), written on the build machine and carried as out/gpu-proofs:
    .venv/bin/python tests/gpu/test_proofs_gpu.py
    python3 -m pytest --noconftest -q tests/gpu
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITERS = ROOT / "out" / "gpu-proofs" / "fnuz-indexer-cache-writer"
PROOFS = ROOT / "overlays" / "proofs"


def proof_module():
    """The overlay's proof (overlays/proofs/fnuz_indexer_cache.py), its kernels compiled for the GPU."""
    os.environ["BAKERY_PROOF_DEVICE"] = "cuda"
    sys.path.insert(0, str(PROOFS))  # its helper, _proof.py
    spec = importlib.util.spec_from_file_location("fnuz_indexer_cache", PROOFS / "fnuz_indexer_cache.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ocp_gpu_writes_the_stock_bytes():
    torch = pytest.importorskip("torch", reason="needs torch")
    pytest.importorskip("triton", reason="needs triton")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (runs on the lent H200)")
    if not (WRITERS / "stock.py").exists():  # on a GPU this test must run: a missing input is a failure
        pytest.fail(f"no writer files in {WRITERS}: write them on the build machine (see this file's docstring)")
    proof = proof_module()
    stock, overlaid = (proof.write(proof.load(str(WRITERS / name), str(WRITERS / "read0.py"))[0], fnuz=False)
                       for name in ("stock.py", "overlaid.py"))
    assert stock.count_nonzero() > 0
    assert torch.equal(stock, overlaid)
