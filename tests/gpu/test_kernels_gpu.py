"""Numerics of hip/src/kernels.hip on a real GPU, against the PyTorch reference bit for bit.

No AMD GPU is reachable, so the same kernel source is built for NVIDIA with nvcc (hip/src/
gpu_compat.h maps the few runtime calls) and run on an H200 through the lent device machine:
    python3 -m pytest --noconftest -q tests/gpu
Where no CUDA GPU or nvcc exists (CI, the build machine) every test here skips and says why.
The latest output, dated, is kept beside this file (LATEST.txt).
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch", reason="needs torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here (runs on the lent H200)"),
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here (runs on the lent H200)")]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 10.0  # the checkpoint's swiglu_limit


def reference_module():
    spec = importlib.util.spec_from_file_location("bakery_kernels_ref", ROOT / "hip" / "bakery_kernels" / "__init__.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def lib():
    out = Path(tempfile.mkdtemp()) / "libbakery_kernels.so"
    cc = torch.cuda.get_device_capability()
    subprocess.run(["nvcc", "-O3", f"-arch=sm_{cc[0]}{cc[1]}", "-x", "cu", "-shared", "-Xcompiler", "-fPIC",
                    "-I", str(ROOT / "hip" / "src"), str(ROOT / "hip" / "src" / "kernels.hip"), "-o", str(out)],
                   check=True)
    so = ctypes.CDLL(str(out))
    so.bakery_swiglu_clamp_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_float, ctypes.c_void_p]
    return so


def swiglu(lib, x: torch.Tensor, limit: float) -> torch.Tensor:
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=torch.bfloat16, device=x.device)
    rc = lib.bakery_swiglu_clamp_bf16(x.data_ptr(), out.data_ptr(), x.numel() // (2 * d), d, limit,
                                      torch.cuda.current_stream().cuda_stream)
    assert rc == 0
    return out


def bf16(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)


def adversarial_swiglu_input(rows: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 2 * d, generator=g) * 6).to(torch.bfloat16)
    limit = torch.tensor(LIMIT, dtype=torch.bfloat16)
    special = torch.cat([
        bf16([LIMIT, -LIMIT, 0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e4, -1e4, 3e38, -3e38]),
        torch.nextafter(limit.float(), torch.tensor(20.0)).to(torch.bfloat16).reshape(1),
        bf16([10.0625, 9.9375, -10.0625, -9.9375]),  # the bf16 neighbours of +-10
        bf16([1e-39, -1e-39, 5e-40, 9.2e-41]),  # bf16 subnormals
    ])
    flat = x.view(-1)
    idx = torch.randint(0, flat.numel(), (flat.numel() // 8,), generator=g)
    flat[idx] = special[torch.randint(0, special.numel(), (idx.numel(),), generator=g)]
    return x


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, except that any NaN equals any NaN (payloads are not part of the contract)."""
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(a[~na].view(torch.int16), b[~nb].view(torch.int16))


@pytest.mark.parametrize("rows, d, limit", [(1, 8, LIMIT), (257, 2048, LIMIT), (4096, 8192, LIMIT), (64, 3000, 7.3)])
def test_swiglu_clamp_is_bit_exact(lib, rows, d, limit):
    ref = reference_module()
    x = adversarial_swiglu_input(rows, d, seed=rows + d).cuda()
    want = ref.swiglu_clamp_exact(x.cpu(), limit).cuda()  # float64 on the CPU, rounded once
    got = swiglu(lib, x, limit)
    assert same_bits(got, want), f"{(got.view(torch.int16) != want.view(torch.int16)).sum().item()} elements differ"


def test_swiglu_clamp_matters(lib):
    """The clamp is live on these inputs: without it the result would differ (the 3/120 incident)."""
    x = adversarial_swiglu_input(257, 2048, seed=1).cuda()
    d = x.shape[-1] // 2
    unclamped = torch.nn.functional.silu(x[..., :d]) * x[..., d:]
    assert not same_bits(swiglu(lib, x, LIMIT), unclamped)


