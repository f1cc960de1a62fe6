"""The project's GPU kernels for vLLM's overlays, with PyTorch fallbacks of the same semantics.

`swiglu_clamp` and `topk` use the compiled extension (_C_stable_libtorch, built from hip/src for
gfx942) when it loads and the tensor is on the GPU; otherwise the PyTorch path below, which is
also the reference the kernels are tested against bit for bit.
"""

from __future__ import annotations

import os

import torch

_LIB = os.path.join(os.path.dirname(__file__), "_C_stable_libtorch.so")
FLT_MAX = torch.finfo(torch.float32).max


def _load() -> bool:
    if not os.path.exists(_LIB):
        return False
    try:
        torch.ops.load_library(_LIB)
        return hasattr(torch.ops, "bakery") and hasattr(torch.ops.bakery, "topk")
    except (OSError, RuntimeError):
        return False


HAVE_EXTENSION = _load()


def round_to_bf16(y: torch.Tensor) -> torch.Tensor:
    """float64 -> bfloat16 rounded once (nearest, ties to even). torch's own conversion goes through
    float32 and can round twice; rounding to float32 *to odd* first cannot spoil the second rounding
    (float32 keeps 16 more significand bits than bf16)."""
    t = y.to(torch.float32)
    bits = t.view(torch.int32)
    away = t.double().abs() > y.abs()  # rounded away from zero (or overflowed): one step back
    bits = torch.where(away, bits - 1, bits)
    inexact = bits.view(torch.float32).double() != y
    bits = torch.where(inexact & ~torch.isnan(y), bits | 1, bits)
    return bits.view(torch.float32).to(torch.bfloat16)


def _sum_to_odd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b in float64 rounded to odd (|a| >= |b|): the sum's rounding error is kept as a sticky
    bit, so the later rounding to bf16 sees which side of a midpoint the exact sum lies."""
    s = a + b
    err = (a - s) + b  # exact (Fast2Sum)
    bits = s.view(torch.int64)
    away = (err != 0) & ((err > 0) != (s > 0))  # s was rounded away from zero
    bits = torch.where(away, bits - 1, bits)
    return torch.where(err != 0, bits | 1, bits).view(torch.float64)


def swiglu_clamp_exact(x: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), x = [gate | up], rounded once to x's
    dtype; silu(-inf) is its limit, -0. For |g| < 1, silu(g) * u = h*u + h*tanh(h)*u with h = g/2:
    the first term is exact in float64 (two 8-bit significands), the second a correction smaller
    than it, so a tiny g's g**2 term still decides the rounding; elsewhere g / (1 + exp(-g)) * u, as the HIP kernel computes it."""
    d = x.shape[-1] // 2
    gate = torch.clamp(x[..., :d].double(), max=limit)
    up = torch.clamp(x[..., d:].double(), min=-limit, max=limit)
    half = gate / 2
    exact = half * up
    small = _sum_to_odd(exact, half * torch.tanh(half) * up)
    small = torch.where(small == 0, exact, small)  # a zero keeps the product's sign (-0 + +0 is +0)
    out = torch.where(gate.abs() < 1, small, gate / (1 + torch.exp(-gate)) * up)
    out = torch.where(gate == float("-inf"), -0.0 * up, out)
    return round_to_bf16(out) if x.dtype == torch.bfloat16 else out.to(x.dtype)


def swiglu_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
    if HAVE_EXTENSION and x.is_cuda and x.dtype == torch.bfloat16 and x.is_contiguous():
        return torch.ops.bakery.swiglu_clamp(x, float(limit))
    return swiglu_clamp_exact(x, limit)


def sanitize(logits: torch.Tensor) -> torch.Tensor:
    """NaN and -inf rank lowest, +inf highest, all finite: what the kernel ranks by."""
    return torch.nan_to_num(logits, nan=-FLT_MAX, posinf=FLT_MAX, neginf=-FLT_MAX)


def topk_reference(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest sanitized logits per row, ties to the lower index, best first."""
    return torch.sort(sanitize(logits), dim=-1, descending=True, stable=True).indices[..., :k]


def topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices): deterministic top-k over sanitized logits."""
    if HAVE_EXTENSION and logits.is_cuda and logits.dtype == torch.float32 and logits.dim() == 2 \
            and logits.is_contiguous():
        indices = torch.ops.bakery.topk(logits, int(k))
    else:
        indices = topk_reference(logits, k)
    return torch.gather(sanitize(logits), -1, indices), indices
