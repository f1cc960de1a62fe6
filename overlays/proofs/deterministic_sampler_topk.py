"""(h) The sampler's top-k/top-p: one answer per row, whatever the batch, whatever ties and NaN.

Usage: python deterministic_sampler_topk.py TARGET TRITON SAMPLER
TARGET is the stock or overlaid vllm/v1/sample/ops/topk_topp_sampler.py, TRITON the same base's
topk_topp_triton.py, SAMPLER its vllm/v1/worker/gpu/sample/sampler.py: the served sampler of the
V2 model runner (which DSpark speculative decoding selects), read as text; if its Sampler no longer
calls apply_top_k_top_p from the target, what the overlay routes is off the served path, and the
proof says it cannot tell (CANNOT-PROVE). The target and TRITON load as vLLM imports them on ROCm
(_proof.load_vllm, a platform that is not the CPU): apply_top_k_top_p takes vLLM's Triton kernel
for 8 rows or more and its sort path below (0.26-0.29; from 0.30 Triton for every batch). The overlaid target
finds the bakery_kernels package the image bakes (here its PyTorch path: tests/gpu shows the HIP
kernel bit-identical to it); without the package it would run the stock paths the stock run judges.
Reference, written here from the semantics of the seed's fix (sampler.topk-tiebreak-sanitize) in
plain Python floats: per row, rank +inf first, then finite values by value, then -inf and NaN;
ties go to the lower token index; exactly clamp(k, 1, V) survive. With p < 1, each survivor in rank
order weighs exp(x - x_best) in float64 (+inf survivors 1 and the rest 0 when there is one); it is
kept iff the weight ranked before it is below p times the survivors' total; the first always is.
Everything not kept, and every NaN, becomes -inf; kept values keep their bits. The overlay weighs
by exp to about 2e-5 in exact integer sums (hip/bakery_kernels): a top-p decision whose float64
margin is under 1e-4 of the row's total is not judged (they are counted).
Inputs: 8 rows of 256 logits (ties across the k boundary, NaN, +inf, -inf, the serving config
p=0.95 without top-k, k=1 on a tied maximum, ties inside the nucleus, a mixed row), as one batch of
8 and each alone, and the batch with k None. FIXED: every row is the reference's, alone as in the
batch. BROKEN names what fails: ties (not exactly k), NaN (kept), batch dependence, other rows.
"""

import ast
import contextlib
import inspect
import math
from pathlib import Path

import numpy as np
import torch

import _proof  # beside this script



def eager(fn=None, **options):
    """torch.compile, modeled as eager: the target decorates a function this proof never calls
    (its random sampler) at import, and the real decorator loads TorchDynamo for seconds; compiling
    changes speed, not results."""
    return fn if fn is not None else (lambda f: f)


torch.compile = eager

SAMPLER = "vllm.v1.sample.ops.topk_topp_sampler"
TRITON = "vllm.v1.sample.ops.topk_topp_triton"
HIP = Path(__file__).resolve().parents[2] / "hip" / "bakery_kernels" / "__init__.py"
VOCAB = 256
TOLERANCE = 1e-4  # of a row's total weight: top-p decisions closer than this to p are not judged
INF = float("inf")


class Platform:
    """ROCm, as the MI300X image runs: not the CPU, not CUDA, not XPU."""

    def is_cpu(self):
        return False

    def is_cuda(self):
        return False

    def is_xpu(self):
        return False

    def is_rocm(self):
        return True

    def is_cuda_alike(self):
        # the tensors here are the CPU's: vLLM 0.30 on sends small top-p-only batches through a
        # split pipeline only for GPU tensors, and tells its kernel so by this answer; kept
        # consistent with the tensors, those rows take the one-program-per-row kernel here
        return False

    simple_compile_backend = "inductor"  # what a decorator at import asks for (compiled only if called)


def dispatcher(*, kernel=None, warmup_inputs=None):
    """vLLM's declarative Triton dispatcher (0.33 on): the decorated function returns the grid and
    launch arguments; the rest is bound as _proof.bind_launch models it, and the kernel launched."""
    def decorate(dispatch):
        def launch(*args, **kwargs):
            given = inspect.signature(dispatch).bind(*args, **kwargs)
            given.apply_defaults()
            grid, spec = dispatch(*args, **kwargs)[:2]
            spec = {k: v for k, v in spec.items() if k not in ("num_warps", "num_stages")}
            kernel[grid](**_proof.bind_launch(kernel, given.arguments, spec))
        return launch
    return decorate


MODELED = {
    "vllm.platforms": {"current_platform": Platform()},
    "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed": contextlib.nullcontext},
    "vllm.model_executor.warmup.jit_warmup_triton_helper": {"triton_kernel_dispatcher_with_warmup": dispatcher},
    "vllm.utils.math_utils": {"next_power_of_2": lambda n: 1 << max(int(n) - 1, 0).bit_length()},
    "vllm.utils.platform_utils": {"num_compute_units": lambda index=None: 304},  # MI300X's CUs
}


def apply_top_k_top_p(target: str, triton_file: str):
    """The target's apply_top_k_top_p, with the bakery_kernels package beside it as in the image."""
    modules = _proof.load_vllm({SAMPLER: target, TRITON: triton_file, "bakery_kernels": str(HIP)}, MODELED)
    return _proof.need(modules[SAMPLER], "apply_top_k_top_p")


def inputs() -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(logits [8, 256] float32, k int32, p float32, what each row tests)."""
    rng = np.random.default_rng(2026)
    x = (rng.standard_normal((8, VOCAB)) * 2).astype(np.float32)
    top = np.float32(x.max() + 1)
    x[0, [10, 20, 30, 40, 50, 60]] = top  # six equal maxima across k=3
    x[1, [5, 77, 200]] = np.nan
    x[2, 3] = INF
    x[4, rng.choice(VOCAB, 100, replace=False)] = -INF
    x[5, [9, 7]] = top  # k=1 on a tied maximum: token 7
    x[6, [1, 2, 3]] = top  # ties inside the nucleus
    k = np.array([3, 20, 5, VOCAB, 50, 1, VOCAB, 40], dtype=np.int32)
    p = np.array([1.0, 0.9, 1.0, 0.95, 0.95, 0.95, 0.5, 0.8], dtype=np.float32)
    what = ["ties across k", "NaN", "+inf", "serving config", "-inf", "k=1 on a tie", "ties in the nucleus", "mixed"]
    return x, k, p, what


def rank(v: float) -> tuple[int, float]:
    if v != v or v == -INF:
        return (0, 0.0)
    return (2, 0.0) if v == INF else (1, v)


def reference_row(x: list[float], k: int | None, p: float | None) -> tuple[list[float], set[int]]:
    """(the masked row, the positions whose top-p decision lies within the tolerance)."""
    n = len(x)
    order = sorted(range(n), key=lambda i: (-rank(x[i])[0], -rank(x[i])[1], i))
    survivors = order[:n if k is None else min(max(int(k), 1), n)]
    kept, unjudged = set(survivors), set()
    if p is not None and p < 1:
        best = x[survivors[0]]
        if best == INF:
            weights = [1.0 if x[i] == INF else 0.0 for i in survivors]
        elif rank(best)[0] == 0:
            weights = [0.0] * len(survivors)
        else:
            weights = [0.0 if rank(x[i])[0] == 0 else math.exp(x[i] - best) for i in survivors]
        total = math.fsum(weights)
        kept, before = set(), 0.0
        for j, i in enumerate(survivors):
            if j == 0 or before < p * total:
                kept.add(i)
            if j > 0 and abs(before - p * total) <= TOLERANCE * total:
                unjudged.add(i)
            before += weights[j]
    return [x[i] if i in kept and x[i] == x[i] else -INF for i in range(n)], unjudged


def same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Bit for bit, NaN equal to NaN (a row must equal itself in another batch, NaN included)."""
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def run(apply, x, k, p) -> dict:
    """The target's masked logits (this runs the target's code): the batch of 8, each row alone, and
    the batch in the serving config."""
    n = len(x)
    k_t, p_t = torch.from_numpy(k.copy()), torch.from_numpy(p.copy())
    return {"batch": apply(torch.from_numpy(x.copy()), k_t, p_t).numpy(),
            "alone": np.stack([apply(torch.from_numpy(x[i:i + 1].copy()), k_t[i:i + 1], p_t[i:i + 1]).numpy()[0]
                               for i in range(n)]),
            "serving": apply(torch.from_numpy(x.copy()), None, torch.full((n,), 0.95)).numpy()}


def failures(observed, x, k, p, what) -> tuple[list[str], int]:
    """The properties that fail, and how many top-p decisions were too close to judge."""
    n = len(x)
    batch, alone, serving = (observed[name] for name in ("batch", "alone", "serving"))
    for got in (batch, alone, serving):
        if got.shape != x.shape or got.dtype != np.float32:
            raise ValueError(f"logits of shape {got.shape} ({got.dtype}), not {x.shape} float32")
    cases = [([(batch, "in a batch of 8"), (alone, "alone")], list(k), list(p)),
             ([(serving, "k None, p 0.95")], [None] * n, [np.float32(0.95)] * n)]
    failed, unjudged = {}, 0
    for runs, ks, ps in cases:
        for r in range(n):
            want, skip = reference_row([float(v) for v in x[r]], ks[r], float(ps[r]))
            want, judged = np.array(want, dtype=np.float32), np.ones(len(want), dtype=bool)
            judged[list(skip)] = False
            unjudged += len(skip)
            for got, how in runs:
                row = got[r]
                if np.isnan(row).any():
                    failed.setdefault("NaN", f"NaN: kept in row {r} ({what[r]}, {how})")
                if (~same(row, want) & judged).any():
                    kept, wanted = int((row > -INF).sum() + np.isnan(row).sum()), int((want > -INF).sum())
                    key = "ties" if "tie" in what[r] else f"row {r}"
                    if kept != wanted:
                        told = f"keeps {kept} where the reference keeps {wanted}"
                    else:
                        ours, theirs = np.flatnonzero((row > -INF) | np.isnan(row)), np.flatnonzero(want > -INF)
                        told = (f"keeps tokens {', '.join(map(str, np.setdiff1d(ours, theirs)[:4]))} where the "
                                f"reference keeps {', '.join(map(str, np.setdiff1d(theirs, ours)[:4]))}")
                    failed.setdefault(key, ("ties: " if key == "ties" else "") + f"row {r} ({what[r]}, {how}) {told}"
                                      + (f" (k={ks[r]})" if ks[r] is not None else ""))
    differ = [r for r in range(n) if not same(batch[r], alone[r]).all()]
    if differ:
        failed["batch"] = (f"batch dependence: rows {', '.join(map(str, differ))} ({', '.join(what[r] for r in differ)}) "
                           f"differ alone and in a batch of 8")
    return list(failed.values()), unjudged


def described(failed: list[str], unjudged: int) -> str:
    verdict = "; ".join(failed) if failed else "every row is the reference's, alone as in a batch of 8"
    return verdict + (f" ({unjudged} top-p decisions within 1e-4 of p not judged)" if unjudged else "")


def served(sampler_py: str) -> None:
    """The served sampler imports apply_top_k_top_p from the target's module and its Sampler calls it."""
    tree = ast.parse(Path(sampler_py).read_text())
    imported = any(isinstance(n, ast.ImportFrom) and n.module == SAMPLER and
                   any(a.name == "apply_top_k_top_p" and a.asname is None for a in n.names) for n in tree.body)
    sampler = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Sampler"), None)
    called = sampler is not None and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and
                                         n.func.id == "apply_top_k_top_p" for n in ast.walk(sampler))
    if not (imported and called):
        raise _proof.CannotProve("the served sampler (vllm/v1/worker/gpu/sample/sampler.py) no longer calls "
                                 "apply_top_k_top_p from this module: what the overlay routes may be off the "
                                 "served path; find what the base's Sampler calls now")


def observe(args):
    if len(args) != 3:
        raise _proof.CannotProve("needs the base's topk_topp_triton.py and worker/gpu/sample/sampler.py "
                                 "beside the target")
    _proof.tensor_ranges()
    x, k, p, _ = inputs()
    return run(apply_top_k_top_p(args[0], args[1]), x, k, p)


def judge(observed, args):
    served(args[2])  # read as text here: the served sampler must call what the overlay routes
    x, k, p, what = inputs()
    image, unjudged = failures(observed, x, k, p, what)
    # Without the package the overlaid module takes its `except ImportError` branch and runs the
    # stock paths, which the stock run judges: not run twice here.
    return _proof.report(not image, f"in the image: {described(image, unjudged)}", failed=image, unjudged=unjudged)


if __name__ == "__main__":
    _proof.main(observe, judge)
