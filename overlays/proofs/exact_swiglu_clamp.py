"""(e) Exact SwiGLU with the checkpoint's clamp: run the target's SiluAndMulWithClamp.forward_native.

Usage: python exact_swiglu_clamp.py TARGET   (.../model_executor/layers/activation.py, stock or overlaid)
The target module is imported as vLLM imports it (_proof.load_vllm), twice: as in the image, where
`import bakery_kernels` finds the package the image bakes from hip/ (here without its compiled
extension, so its PyTorch path; tests/gpu shows the HIP kernel bit-identical to that path), and
as in an image without bakery_kernels, where the overlay's `except ImportError` falls back to the
stock expression. The first decides the verdict; the second is judged against the same reference
and reported (measured "fallback"), so what a missing package would serve is on record.
Reference, from the definition: out = silu(min(gate, 10)) * clamp(up, -10, 10) with
silu(g) = g * sigmoid(g) (and its limit -0 at g = -inf), computed in float64 with numpy and rounded
once to bf16 (nearest, ties to even). The sweep: every bf16 bit pattern as gate, and up over every
pattern too, with +-inf, NaN, denormals and the clamp limits. FIXED: bit-exact everywhere (NaN
where the reference is NaN). BROKEN: otherwise; the result says how many ulps off.
"""

import decimal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import _proof  # beside this script

LIMIT = 10.0
HIP = Path(__file__).resolve().parents[2] / "hip" / "bakery_kernels" / "__init__.py"


def sweep() -> np.ndarray:
    """uint16 bf16 patterns, shape (rows, 2 * d): gate half, then up half."""
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    special = np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x0000, 0x8000,
                        0x4120, 0xC120, 0x411F, 0x4121, 0xC11F, 0xC121], dtype=np.uint16)  # 0x4120 = 10.0
    gates = np.concatenate([every, np.repeat(special, len(special)), np.tile(special, 4096)])
    ups = np.concatenate([every[::-1].copy(), np.tile(special, len(special)), np.repeat(special, 4096)])
    d = 512
    n = len(gates) // d * d
    return np.concatenate([gates[:n].reshape(-1, d), ups[:n].reshape(-1, d)], axis=1)


def as_float64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def round_once_to_bf16(y: np.ndarray) -> np.ndarray:
    """Nearest bf16 (8-bit significand, float32's exponent range), ties to even; as uint16 bits."""
    with np.errstate(all="ignore"):
        _, exp = np.frexp(y)  # |y| = m * 2**exp, m in [0.5, 1)
        quantum = np.ldexp(1.0, np.maximum(exp - 8, -133))  # bf16 subnormals step by 2**-133
        q = np.where(np.isfinite(y), np.round(y / quantum) * quantum, y)  # np.round: ties to even
        q = np.where(np.abs(q) > np.float64(np.uint32(0x7F7F0000).view(np.float32)), np.copysign(np.inf, y), q)
    bits = (q.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return np.where(np.isnan(y), np.uint16(0x7FC0), bits)


def near_ties(y: np.ndarray) -> np.ndarray:
    """Where float64's own error could put y on the wrong side of a bf16 rounding midpoint."""
    with np.errstate(all="ignore"):
        _, exp = np.frexp(y)
        r = np.abs(y) / np.ldexp(1.0, np.maximum(exp - 8, -133))
        return np.isfinite(y) & (y != 0) & (np.abs(r - np.floor(r) - 0.5) < 1e-6)


def exact_decimal(g: float, u: float) -> float:
    """silu(g) * u to 60 digits, rounded once to bf16 (as a float)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        gd, ud = decimal.Decimal(g), decimal.Decimal(u)
        y = gd / (1 + (-gd).exp()) * ud
        _, exp = np.frexp(float(y))
        quantum = decimal.Decimal(2) ** int(max(exp - 8, -133))
        return float((y / quantum).to_integral_value(decimal.ROUND_HALF_EVEN) * quantum)


def reference(x: np.ndarray) -> np.ndarray:
    d = x.shape[1] // 2
    g, u = as_float64(x[:, :d]), as_float64(x[:, d:])
    with np.errstate(all="ignore"):
        g = np.minimum(g, LIMIT)  # NaN stays NaN
        u = np.clip(u, -LIMIT, LIMIT)
        y = np.where(g == -np.inf, -0.0 * u, g / (1.0 + np.exp(-g)) * u)
    for i in zip(*np.nonzero(near_ties(y))):
        y[i] = exact_decimal(float(g[i]), float(u[i]))
    return round_once_to_bf16(y)


ACTIVATION = "vllm.model_executor.layers.activation"


def forward_native(target: str, with_package: bool):
    """SiluAndMulWithClamp.forward_native of the target module, imported with or without the
    bakery_kernels package beside it."""
    if with_package:
        modules = _proof.load_vllm({ACTIVATION: target, "bakery_kernels": str(HIP)})
    else:
        modules = _proof.load_vllm({ACTIVATION: target}, absent=("bakery_kernels",))
    layer_class = _proof.need(modules[ACTIVATION], "SiluAndMulWithClamp")
    return _proof.need(layer_class, "forward_native")


def ordered(bits: np.ndarray) -> np.ndarray:
    """bf16 bits to integers in value order, so that ulp distance is a difference."""
    b = bits.astype(np.int32)
    return np.where(b & 0x8000, -(b & 0x7FFF), b)


def run(forward, x: np.ndarray) -> np.ndarray:
    """The target's outputs on x, as bf16 bits (this runs the target's code)."""
    layer = SimpleNamespace(swiglu_limit=LIMIT, alpha=1.0, beta=0.0)
    got = forward(layer, torch.from_numpy(x.view(np.int16)).view(torch.bfloat16)).view(torch.int16).numpy()
    return got.view(np.uint16)


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    if got.shape != want.shape or got.dtype != np.uint16:
        raise ValueError(f"outputs of shape {got.shape} ({got.dtype}), not {want.shape} bf16 bits")
    got_nan = (got & 0x7F80 == 0x7F80) & (got & 0x7F != 0)
    want_nan = want == 0x7FC0
    same = np.where(want_nan, got_nan, got == want)
    finite = ~want_nan & ~got_nan
    ulps = np.abs(ordered(got) - ordered(want))[finite]
    return dict(outputs=int(same.size), differ=int((~same).sum()), max_ulps=int(ulps.max()) if ulps.size else 0,
                nan_mismatches=int((want_nan != got_nan).sum()))


def described(result: dict) -> str:
    if result["differ"] == 0:
        return "bit-exact on every input"
    return (f"{result['differ']} of {result['outputs']} outputs differ (up to {result['max_ulps']} ulps; "
            f"{result['nan_mismatches']} NaN where the reference is not, or the reverse)")


def observe(args):
    x = sweep()
    return {"image": run(forward_native(args[0], with_package=True), x),
            "fallback": run(forward_native(args[0], with_package=False), x)}


def judge(observed, args):
    want = reference(sweep())
    image, fallback = compare(observed["image"], want), compare(observed["fallback"], want)
    return _proof.report(image["differ"] == 0, f"in the image: {described(image)}; without bakery_kernels: "
                                               f"{described(fallback)}", **image, fallback=fallback)


if __name__ == "__main__":
    _proof.main(observe, judge)
