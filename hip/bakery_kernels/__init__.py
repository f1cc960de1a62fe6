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


def swiglu_clamp_reference(x: torch.Tensor, limit: float) -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit), in the input dtype, x = [gate | up]."""
    d = x.shape[-1] // 2
    gate = torch.clamp(x[..., :d], max=limit)
    up = torch.clamp(x[..., d:], min=-limit, max=limit)
    return torch.nn.functional.silu(gate) * up


def swiglu_clamp(x: torch.Tensor, limit: float) -> torch.Tensor:
    if HAVE_EXTENSION and x.is_cuda and x.dtype == torch.bfloat16 and x.is_contiguous():
        return torch.ops.bakery.swiglu_clamp(x, float(limit))
    return swiglu_clamp_reference(x, limit)


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
