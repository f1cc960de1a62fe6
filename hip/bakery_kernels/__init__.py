"""The project's GPU kernels for vLLM's overlays, with PyTorch fallbacks of the same semantics.

`swiglu_clamp` and `top_k_top_p` use the compiled extension (_C_stable_libtorch, built from hip/src for
gfx942) when it loads and the tensor is on the GPU; otherwise the PyTorch path below, which is
also the reference the kernels are tested against bit for bit.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import torch

_LIB = os.path.join(os.path.dirname(__file__), "_C_stable_libtorch.so")
FLT_MAX = torch.finfo(torch.float32).max


def _load() -> bool:
    """True where the compiled library is baked beside this file and loads; False where it is not
    there (a checkout, a proof's sandbox). A baked library that does not load, or lacks an operator,
    is an error (RuntimeError, which the overlays' `except ImportError` does not catch: vLLM stops):
    a quiet PyTorch fallback on the GPU would serve with host syncs and without the kernel the image
    says it serves."""
    if not os.path.exists(_LIB):
        return False
    try:
        torch.ops.load_library(_LIB)
    except (OSError, RuntimeError) as e:
        raise RuntimeError(f"bakery_kernels: {_LIB} is baked but does not load in this torch: {e}") from e
    missing = [op for op in ("top_k_top_p_", "swiglu_clamp") if not hasattr(torch.ops.bakery, op)]
    if missing:
        raise RuntimeError(f"bakery_kernels: {_LIB} registers no bakery::{', bakery::'.join(missing)}")
    return True


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


# -- top-k / top-p masking (vLLM's apply_top_k_top_p) ---------------------------------------------
#
# Per row, independent of every other row. Rank: +inf, then finite values by value (-0 equals +0),
# then -inf and NaN (equal); ties to the lower index. top-k keeps the clamp(k, 1, V) best. top-p
# weighs each survivor by an integer q in units of 2**-32 (so that every sum is exact and no
# summation order can change a result):
#   u = rint((x - x_max) * -65536) in float32 (x_max: the best survivor's value),
#   q = 0 if u > 23 * 65536, else rint(A[u >> 14] * B[(u >> 7) & 127] * C[u & 127] * 2**32),
# float32 products of the tables A[i] = exp(-i/4), B[j] = exp(-j/512), C[l] = exp(-l/65536), each
# built by _exp_det and rounded to float32. So q is exp(x - x_max) * 2**32 to about 2e-5 relative
# where q is above 1e5 units (to half a unit, 2**-33, below that; x - x_max taken to 1/65536; 0
# from about e**-22.2 down), and it never decreases as x grows. This is the
# one difference from a float64 sum of exp(x - x_max). If a survivor is +inf, each +inf survivor
# weighs 2**32 and the others 0; if the best is -inf (or NaN) all weigh 0. The survivor at rank
# position j (0-based) is kept iff the sum of q over the survivors before it is < p * W exactly (W the
# sum over all survivors, p the float32 value); position 0 always. Applied when p < 1 (a NaN p: no
# top-p). Every element not kept, and every NaN, becomes -inf; kept values keep their bits.

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_EXP_COEFFS = (1.0, 1.0, 1.0 / 2.0, 1.0 / 6.0, 1.0 / 24.0, 1.0 / 120.0, 1.0 / 720.0, 1.0 / 5040.0,
               1.0 / 40320.0, 1.0 / 362880.0, 1.0 / 3628800.0, 1.0 / 39916800.0, 1.0 / 479001600.0)
_U_MAX = 23 * 65536
_WEIGHT_TABLES: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None


def _exp_det(d: float) -> float:
    """exp(d) for d in [-24, 0] by the kernel's fixed sequence of float64 operations (each rounded
    once; Python never fuses a multiply and an add), so both sides build the same tables."""
    kf = float(round(d * 1.4426950408889634))  # round(): half to even, as rint
    r = (d + -(kf * _LN2_HI)) + -(kf * _LN2_LO)
    acc = _EXP_COEFFS[12]
    for c in reversed(_EXP_COEFFS[:12]):
        acc = c + r * acc
    return math.ldexp(acc, int(kf))


def weight_tables() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(A, B, C), float32 on the CPU: exp(-i/4) for i <= 92, exp(-j/512) and exp(-l/65536) for j, l < 128."""
    global _WEIGHT_TABLES
    if _WEIGHT_TABLES is None:
        def table(values):
            return torch.tensor(values, dtype=torch.float64).to(torch.float32)  # round to nearest even
        _WEIGHT_TABLES = (table([_exp_det(-i * 0.25) for i in range(93)]),
                          table([_exp_det(-j / 512.0) for j in range(128)]),
                          table([_exp_det(-l / 65536.0) for l in range(128)]))
    return _WEIGHT_TABLES


def topp_weights(v: torch.Tensor, xmax: torch.Tensor) -> torch.Tensor:
    """q (int64) of float32 values v (NaN already -inf) against x_max (broadcast), +inf rule included."""
    a, b, c = (t.to(v.device) for t in weight_tables())
    u = torch.round((v - xmax) * -65536.0)  # float32 throughout; round(): half to even
    ok = u <= _U_MAX  # False for inf and NaN
    iu = torch.where(ok, u, torch.zeros_like(u)).to(torch.int64)
    w = (a[iu >> 14] * b[(iu >> 7) & 127]) * c[iu & 127]
    q = torch.where(ok, torch.round(w * 4294967296.0).to(torch.int64), torch.zeros_like(iu))
    inf = float("inf")
    return torch.where(xmax == inf, (v == inf).to(torch.int64) << 32, q)


def _ceil_p_times(p: float, total: int) -> int:
    """ceil(p * total) exactly, never below 0: the survivor before whose weight this is reached is cut."""
    return max(0, math.ceil(Fraction(p) * total))


def top_k_top_p_reference(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """The semantics above, written out row by row (plain Python sort and sums, exact rationals).
    Returns a new float32 tensor on the CPU; logits are left as they are."""
    x = logits.detach().to("cpu", torch.float32)
    rows, n = x.shape
    out = torch.full_like(x, float("-inf"))
    kl = None if k is None else k.tolist()
    pl = None if p is None else p.to(torch.float32).tolist()  # a float32 is exact as a Python float
    for r in range(rows):
        vals = x[r].tolist()

        def rank(i: int) -> tuple[int, float, int]:
            v = vals[i]
            if v != v or v == float("-inf"):
                return (0, 0.0, i)
            if v == float("inf"):
                return (2, 0.0, i)
            return (1, v, i)

        order = sorted(range(n), key=lambda i: (-rank(i)[0], -rank(i)[1], i))
        kr = n if kl is None else min(max(int(kl[r]), 1), n)
        survivors = order[:kr]
        kept = set(survivors)
        pr = 1.0 if pl is None else pl[r]
        if pr < 1.0:
            best = vals[survivors[0]]
            v = torch.tensor([vals[i] for i in survivors], dtype=torch.float32)
            if best == float("inf"):
                weights = [1 << 32 if vals[i] == float("inf") else 0 for i in survivors]
            elif best != best or best == float("-inf"):
                weights = [0] * kr
            else:
                a, b, c = weight_tables()
                u = torch.round((v - torch.tensor(best, dtype=torch.float32)) * -65536.0)  # NaN: -inf - x
                ok = u <= _U_MAX
                iu = torch.where(ok, u, torch.zeros_like(u)).to(torch.int64)
                w = (a[iu >> 14] * b[(iu >> 7) & 127]) * c[iu & 127]
                weights = torch.where(ok, torch.round(w * 4294967296.0).to(torch.int64), 0).tolist()
            limit = Fraction(pr) * sum(weights)
            kept, before = set(), 0
            for j, i in enumerate(survivors):
                if j == 0 or before < limit:
                    kept.add(i)
                before += weights[j]
        row = [float("-inf")] * n
        for i in kept:
            if vals[i] == vals[i]:
                row[i] = vals[i]
        out[r] = torch.tensor(row, dtype=torch.float32)
    return out


def top_k_top_p_torch(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """The same masking with whole-tensor PyTorch ops (a stable sort, an exact int64 cumsum), in place.
    Reads W back to the host for the exact p * W."""
    rows, n = logits.shape
    if rows == 0 or n == 0:
        return logits
    nan = torch.isnan(logits)
    v = torch.where(nan, torch.full_like(logits, float("-inf")), logits).float() + 0.0  # -0 ranks as +0
    sorted_v, order = torch.sort(v, dim=-1, descending=True, stable=True)  # ties: lower index first
    pos = torch.arange(n, device=logits.device)
    kr = torch.full((rows,), n, device=logits.device, dtype=torch.int64) if k is None \
        else k.to(logits.device, torch.int64).clamp(1, n)
    keep_sorted = pos[None, :] < kr[:, None]
    if p is not None:
        pf = p.to(logits.device, torch.float32)
        q = torch.where(keep_sorted, topp_weights(sorted_v, sorted_v[:, :1]), 0)
        total = q.sum(-1)
        limit = torch.tensor([_ceil_p_times(pv, w) if pv < 1.0 else 0 for pv, w in zip(pf.tolist(), total.tolist())],
                             dtype=torch.int64, device=logits.device)
        before = torch.cumsum(q, -1) - q
        keep_p = (before < limit[:, None]) | (pos[None, :] == 0) | ~(pf < 1.0)[:, None]
        keep_sorted = keep_sorted & keep_p
    keep = torch.empty_like(keep_sorted).scatter_(1, order, keep_sorted)
    return logits.masked_fill_(~keep | nan, float("-inf"))


def top_k_top_p(logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None) -> torch.Tensor:
    """vLLM's apply_top_k_top_p(logits, k, p): logits [B, V] masked in place with -inf and returned.
    k: [B] int (V: no top-k), p: [B] float32 (1.0: no top-p), either None. The extension when it is
    loaded and logits are float32 on the GPU (deterministic, no host sync); else PyTorch."""
    if k is None and p is None:
        return logits
    if HAVE_EXTENSION and logits.is_cuda and logits.dim() == 2 and logits.dtype in (torch.bfloat16, torch.float16):
        # a 16-bit float widens to float32 exactly, so the ranking and the kept values are the same;
        # the buffer's size follows the shape alone (graph-safe)
        wide = logits.float()
        top_k_top_p(wide, k, p)
        return logits.copy_(wide)
    if HAVE_EXTENSION and logits.is_cuda and logits.dtype == torch.float32 and logits.dim() == 2 \
            and logits.stride(1) == 1:
        if k is not None and (k.dtype not in (torch.int32, torch.int64) or not k.is_contiguous()
                              or k.device != logits.device):
            k = k.to(logits.device, torch.int32).contiguous()
        if p is not None and (p.dtype != torch.float32 or not p.is_contiguous() or p.device != logits.device):
            p = p.to(logits.device, torch.float32).contiguous()
        return torch.ops.bakery.top_k_top_p_(logits, k, p)
    return top_k_top_p_torch(logits, k, p)
