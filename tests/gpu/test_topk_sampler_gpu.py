"""topk_topp_mask_f32_kernel (hip/src/kernels.hip) on a real GPU: bit for bit against the reference
(bakery_kernels.top_k_top_p_reference), independent of the batch, repeatable, replayable in a CUDA
graph, and timed against stock vLLM 0.26's apply_top_k_top_p.

Built for NVIDIA with nvcc (no AMD GPU is reachable), twice: with the NVIDIA default of 1024 threads
per row and with gfx942's 512 (BAKERY_TK_THREADS), and driven through ctypes. Stock vLLM's
topk_topp_sampler.py and topk_topp_triton.py are read from VLLM_STOCK_DIR (a folder holding
vllm/v1/sample/ops/, unzipped from the 0.26.0 wheel; default: ../stock beside this checkout), with
small stand-in modules for the vllm names they import; without them the comparison skips.
    python3 -m pytest --noconftest -q -rs -s tests/gpu/test_topk_sampler_gpu.py
"""

from __future__ import annotations

import ctypes
import enum
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import types
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
STOCK = Path(os.environ.get("VLLM_STOCK_DIR", ROOT.parent / "stock"))
VOCAB = 129280  # DeepSeek-V3's vocabulary; assumed for V4 (its own is not known here)
THREADS = (1024, 512)


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


glue = load("bakery_kernels_gpu_ref", ROOT / "hip" / "bakery_kernels" / "__init__.py")
cpu_cases = load("topk_sampler_cpu_cases", ROOT / "tests" / "test_topk_sampler.py")


def build(threads: int):
    out = Path(tempfile.mkdtemp()) / f"libbakery_topk_{threads}.so"
    cc = torch.cuda.get_device_capability()
    subprocess.run(["nvcc", "-O3", f"-arch=sm_{cc[0]}{cc[1]}", f"-DBAKERY_TK_THREADS={threads}", "-x", "cu", "-shared",
                    "-Xcompiler", "-fPIC", "-I", str(ROOT / "hip" / "src"), str(ROOT / "hip" / "src" / "kernels.hip"),
                    "-o", str(out)], check=True)
    so = ctypes.CDLL(str(out))
    so.bakery_topk_topp_mask_f32.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                             ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return so


@pytest.fixture(scope="module")
def libs():
    return {t: build(t) for t in THREADS}


def masked(lib, logits: torch.Tensor, k, p) -> torch.Tensor:
    """The launcher on logits in place (any row stride, unit column stride); returns logits."""
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    rc = lib.bakery_topk_topp_mask_f32(logits.data_ptr(), logits.shape[0], logits.shape[1], logits.stride(0),
                                       None if k is None else k.data_ptr(), int(k is not None and k.dtype == torch.int64),
                                       None if p is None else p.data_ptr(), torch.cuda.current_stream().cuda_stream)
    assert rc == 0
    return logits


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def serving(rows: int, n: int = VOCAB, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, n, generator=g) * 4).cuda(), None, torch.full((rows,), 0.95).cuda()


def mixed(rows: int, n: int = VOCAB, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 4
    k = torch.tensor([20, 50, n], dtype=torch.int32)[torch.arange(rows) % 3]
    p = torch.tensor([0.9, 0.95, 1.0])[(torch.arange(rows) // 3) % 3]
    return x.cuda(), k.cuda(), p.cuda()


def ties_heavy(rows: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (rows, n), generator=g).float()  # > 3072 candidates share every value
    for value in (float("nan"), float("inf"), float("-inf"), -0.0):
        x.view(-1)[torch.randint(0, x.numel(), (x.numel() // 300,), generator=g)] = value
    x[0, :5] = float("inf")
    return x


CASES = {
    "random, per-row k and p": lambda: (cpu_cases.special_logits(12, 300, 1),) + cpu_cases.per_row_k_p(12, 300, 2),
    "k only, int64": lambda: (cpu_cases.special_logits(12, 257, 3), cpu_cases.per_row_k_p(12, 257, 4)[0].long(), None),
    "p only": lambda: (cpu_cases.special_logits(12, 257, 5), None, cpu_cases.per_row_k_p(12, 257, 6)[1]),
    "k = 1": lambda: (cpu_cases.special_logits(10, 64, 7), torch.ones(10, dtype=torch.int32), None),
    "k = V, p = 1": lambda: (cpu_cases.special_logits(10, 64, 8), torch.full((10,), 64, dtype=torch.int32),
                             torch.ones(10)),
    "serving V": lambda: tuple(t if t is None else t.cpu() for t in serving(4, seed=11)),
    "mixed V": lambda: tuple(t.cpu() for t in mixed(9, seed=12)),
    "planted ties at k, V": lambda: (cpu_cases.planted_boundary_ties(4, VOCAB, 20, 13),
                                     torch.full((4,), 20, dtype=torch.int32), torch.tensor([1.0, 0.9, 0.5, 0.99])),
    "ties heavy, special values, V": lambda: (ties_heavy(6, VOCAB, 14), torch.tensor([50, 4000, VOCAB, 1, 7, VOCAB],
                                              dtype=torch.int32), torch.tensor([0.9, 1.0, 0.95, 0.5, 0.2, 0.999])),
    "p near 1 over a wide range, V": lambda: (torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(17)) * 12,
                                             torch.tensor([VOCAB, VOCAB, 3000, 2], dtype=torch.int32),
                                             torch.tensor([0.99999994, 0.9999, 0.99999994, 0.99999994])),
    "per-row k and p, V": lambda: (cpu_cases.special_logits(12, VOCAB, 15),) + cpu_cases.per_row_k_p(12, VOCAB, 16),
}
_REFERENCE: dict[str, torch.Tensor] = {}


@pytest.mark.parametrize("threads", THREADS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_reference_bit_for_bit(libs, threads, case):
    x, k, p = CASES[case]()
    if case not in _REFERENCE:
        _REFERENCE[case] = glue.top_k_top_p_reference(x, k, p)
    want = _REFERENCE[case]
    got = masked(libs[threads], x.cuda(), None if k is None else k.cuda(), None if p is None else p.cuda()).cpu()
    differ = (bits(got) != bits(want)).any(-1)
    assert not differ.any(), f"{case}: rows {differ.nonzero().flatten().tolist()} differ from the reference"
    # the GPU fallback (PyTorch ops) agrees too
    fb = glue.top_k_top_p_torch(x.cuda(), None if k is None else k.cuda(), None if p is None else p.cuda()).cpu()
    assert torch.equal(bits(fb), bits(want))


@pytest.mark.parametrize("threads", THREADS)
def test_unaligned_row_stride(libs, threads):
    x, k, p = mixed(9, n=VOCAB - 3, seed=21)
    wide = torch.full((9, VOCAB + 1), 7.0, device="cuda")
    wide[:, 1:VOCAB - 2] = x  # rows start 4 bytes past a 16-byte boundary, stride not a multiple of 4
    view = wide[:, 1:VOCAB - 2]
    masked(libs[threads], view, k, p)
    assert torch.equal(bits(view.cpu()), bits(glue.top_k_top_p_torch(x.clone(), k, p).cpu()))
    assert (wide[:, 0] == 7.0).all() and (wide[:, VOCAB - 2:] == 7.0).all()


@pytest.mark.parametrize("threads", THREADS)
def test_a_row_is_the_same_alone_and_in_batches_of_8_and_64_and_over_runs(libs, threads):
    lib = libs[threads]
    x, k, p = mixed(64, seed=31)
    x[5] = ties_heavy(1, VOCAB, 32)[0].cuda()
    full = masked(lib, x.clone(), k, p)
    assert torch.equal(bits(full), bits(glue.top_k_top_p_torch(x.clone(), k, p)))
    for r in (0, 1, 2, 5, 40, 63):
        alone = masked(lib, x[r:r + 1].clone(), k[r:r + 1].clone(), p[r:r + 1].clone())
        assert torch.equal(bits(alone[0]), bits(full[r])), f"row {r} alone"
    for start in (0, 8, 56):
        batch = masked(lib, x[start:start + 8].clone(), k[start:start + 8].clone(), p[start:start + 8].clone())
        assert torch.equal(bits(batch), bits(full[start:start + 8])), f"rows {start}..{start + 7}"
    for _ in range(50):
        assert torch.equal(bits(masked(lib, x.clone(), k, p)), bits(full))


@pytest.mark.parametrize("threads", THREADS)
def test_cuda_graph_capture_and_replay_with_new_data(libs, threads):
    lib = libs[threads]
    x, k, p = mixed(16, seed=41)
    static_x, static_k, static_p = x.clone(), k.clone(), p.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        masked(lib, static_x, static_k, static_p)  # warm, outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        masked(lib, static_x, static_k, static_p)
    for seed in (42, 43):
        y, k2, p2 = mixed(16, seed=seed)
        k2 = k2.flip(0).contiguous()
        p2 = torch.where(torch.arange(16, device="cuda") % 4 == 0, torch.full_like(p2, 0.5), p2)
        static_x.copy_(y)
        static_k.copy_(k2)
        static_p.copy_(p2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(static_x), bits(masked(lib, y.clone(), k2, p2)))
        assert torch.equal(bits(static_x), bits(glue.top_k_top_p_torch(y.clone(), k2, p2)))


# -- timing against stock vLLM 0.26 -----------------------------------------------------------------

def stock_sampler():
    """vLLM 0.26.0's topk_topp_sampler (and its Triton kernel) from the carried files, with stand-ins
    for the vllm modules they import. None if the files are not here."""
    ops = STOCK / "vllm" / "v1" / "sample" / "ops"
    if not (ops / "topk_topp_sampler.py").exists():
        return None
    import triton
    import triton.language as tl

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    envs = module("vllm.envs", VLLM_USE_FLASHINFER_SAMPLER=False, VLLM_XPU_USE_SAMPLER_KERNEL=False,
                  is_set=lambda name: False)
    module("vllm", __path__=[], envs=envs)
    for name in ("vllm.config", "vllm.utils", "vllm.v1", "vllm.v1.sample", "vllm.v1.sample.ops"):
        module(name, __path__=[])
    module("vllm._aiter_ops", rocm_aiter_ops=types.SimpleNamespace(is_enabled=lambda: False))
    module("vllm.config.model", LogprobsMode=enum.Enum("LogprobsMode", "RAW_LOGITS RAW_LOGPROBS PROCESSED_LOGITS "
                                                                      "PROCESSED_LOGPROBS"))
    module("vllm.logger", init_logger=logging.getLogger)
    CpuArchEnum = enum.Enum("CpuArchEnum", "X86 ARM POWERPC S390X RISCV OTHER")
    platform = types.SimpleNamespace(is_cpu=lambda: False, is_cuda=lambda: True, is_rocm=lambda: False,
                                     is_xpu=lambda: False, get_device_capability=torch.cuda.get_device_capability,
                                     get_cpu_architecture=lambda: CpuArchEnum.X86)
    module("vllm.platforms", CpuArchEnum=CpuArchEnum, current_platform=platform)
    module("vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton)
    module("vllm.utils.math_utils", next_power_of_2=lambda n: 1 if n < 1 else 1 << (n - 1).bit_length())
    module("vllm.utils.platform_utils",
           num_compute_units=lambda device=None: torch.cuda.get_device_properties(device or 0).multi_processor_count)
    load("vllm.v1.sample.ops.topk_topp_triton", ops / "topk_topp_triton.py")
    return load("vllm.v1.sample.ops.topk_topp_sampler", ops / "topk_topp_sampler.py")


def median_ms(fn, src: torch.Tensor, iters: int = 200) -> float:
    """Median of CUDA-event times of fn on a fresh copy of src (the copy is outside the timed span).
    This includes the host's launch work whenever the GPU waits for it (vLLM's sampler runs eagerly)."""
    buf = src.clone()
    for _ in range(10):
        buf.copy_(src)
        fn(buf)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for s, e in zip(starts, ends, strict=True):
        buf.copy_(src)
        s.record()
        fn(buf)
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))
    return times[len(times) // 2]


def device_ms(fn, src: torch.Tensor, iters: int = 50) -> float:
    """Mean GPU time of fn's own kernels per call (CUPTI, through torch.profiler), copies left out."""
    from torch.profiler import ProfilerActivity, profile
    buf = src.clone()
    fn(buf)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            buf.copy_(src)
            fn(buf)
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages()
                if "memcpy" not in e.key.lower() and "copy_kernel" not in e.key.lower())
    return total / iters / 1000.0


def test_timing_against_stock_vllm(libs):
    stock = stock_sampler()
    if stock is None:
        pytest.skip(f"stock vLLM 0.26 files not found under {STOCK}")
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, V = {VOCAB}, logits randn * 4; ms per call: "
          "'event' = median of 200 warm calls between CUDA events (host launch work included), "
          "'device' = the call's kernels alone (CUPTI, mean of 50)")
    print(f"{'config':<8} {'batch':>5} {'stock path':<10} {'stock event':>11} {'device':>7} | {'bakery1024 event':>16} "
          f"{'device':>7} {'speed-up ev/dev':>15} | {'bakery512 event':>15} {'device':>7} {'speed-up ev/dev':>15} | "
          "stock == reference")
    for config, make in (("serving", serving), ("mixed", mixed)):
        for batch in (1, 8, 64):
            x, k, p = make(batch, seed=100 + batch)
            path = "triton" if batch >= 8 else "torch"

            def run_stock(b, k=k, p=p):
                return stock.apply_top_k_top_p(b, k, p)

            ev: dict[str | int, float] = {"stock": median_ms(run_stock, x)}  # by the stock path or our threads
            dev: dict[str | int, float] = {"stock": device_ms(run_stock, x)}
            for th in THREADS:
                ev[th] = median_ms(lambda b, lib=libs[th], k=k, p=p: masked(lib, b, k, p), x)
                dev[th] = device_ms(lambda b, lib=libs[th], k=k, p=p: masked(lib, b, k, p), x)
            ours = masked(libs[1024], x.clone(), k, p)  # equal to the reference (tests above)
            theirs = stock.apply_top_k_top_p(x.clone(), k, p)
            same_rows = (bits(ours) == bits(theirs)).all(-1)
            kept_ours, kept_theirs = (ours > -float("inf")).sum().item(), (theirs > -float("inf")).sum().item()
            verdict = "yes" if bool(same_rows.all()) else \
                f"no: {int((~same_rows).sum())}/{batch} rows differ (stock keeps {kept_theirs}, reference {kept_ours})"
            cells = " | ".join(f"{ev[th]:>{len(f'bakery{th} event')}.4f} {dev[th]:>7.4f} "
                               f"{ev['stock'] / ev[th]:>6.2f}x/{dev['stock'] / dev[th]:>6.2f}x" for th in THREADS)
            print(f"{config:<8} {batch:>5} {path:<10} {ev['stock']:>11.4f} {dev['stock']:>7.4f} | {cells} | {verdict}")
