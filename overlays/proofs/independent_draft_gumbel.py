"""(f) Speculative sampling with the base's own Gumbel sampler, under Triton's interpreter.

Usage: python independent_draft_gumbel.py SPECULATOR_PY GUMBEL_PY
SPECULATOR_PY is the stock or overlaid vllm/v1/worker/gpu/spec_decode/speculator.py, whose _copy_request_inputs decides the seeds
the draft samples with. One draft token per request (DSpark's Gumbel key for position Q is
(seed, Q-1), the same key the recovery resample of that position uses), accepted with probability
min(1, p/q) from an independent uniform, else resampled from max(0, p - q); GUMBEL_PY is
vllm/v1/worker/gpu/sample/gumbel.py from the same base.
Reference, from rejection sampling itself: the output must follow the target p. FIXED: the
chi-square statistic of the output histogram against p is below 13.8 (the 0.001 critical value
for 2 degrees of freedom). BROKEN: above it.
"""

import ast
import os
import sys
import textwrap
from types import SimpleNamespace

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

import _proof  # noqa: E402  (beside this script)


def gumbel_module(path: str):
    source = open(path).read().replace(
        "from vllm.triton_utils import HAS_TRITON, tl, tldevice, triton",
        "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice as tldevice\n"
        "HAS_TRITON = True")
    # Triton's interpreter has no libdevice log1p: log(1 - u) stands in for it. Only the precision of
    # the Gumbel transform changes; how the noise is keyed, (seed, position), is the code as shipped.
    source = source.replace("tldevice.log1p(-u)", "tl.log(1.0 - u)")
    return _proof.module("gumbel_under_test", [source])


def copy_request_inputs(path: str):
    """Speculator._copy_request_inputs, lifted out of its class (it only touches self's buffers)."""
    text = open(path).read()
    cls = next((n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "DraftModelSpeculator"),
               None)
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_copy_request_inputs"), None) \
        if cls else None
    if fn is None:
        raise _proof.CannotProve("DraftModelSpeculator._copy_request_inputs is not in the target (renamed upstream?)")
    namespace = {"torch": torch}
    module_consts = [n for n in ast.parse(text).body if isinstance(n, ast.Assign)
                     and all(isinstance(t, ast.Name) and t.id.isupper() for t in n.targets)]
    for const in module_consts:
        exec(compile(ast.unparse(const), path, "exec"), namespace)
    exec(compile(textwrap.dedent(ast.unparse(fn)), path, "exec"), namespace)
    return namespace["_copy_request_inputs"]


def sample(gumbel, logits, idx, temperature, seeds, pos):
    """vLLM's _gumbel_sample_kernel over a vocabulary that fits one block (gumbel_sample would use
    a 1024-lane block, which the interpreter runs far slower for an 8-token vocabulary)."""
    n, vocab = logits.shape
    local_argmax = torch.empty(n, 1, dtype=torch.int64)
    local_max = torch.empty(n, 1, dtype=torch.float32)
    gumbel._gumbel_sample_kernel[(n, 1)](local_argmax, 1, local_max, 1, None, 0, None, logits, logits.stride(0),
                                         idx, seeds, pos, temperature, vocab,
                                         BLOCK_SIZE=1 << (vocab - 1).bit_length(),
                                         APPLY_TEMPERATURE=True, USE_FP64=False, PER_TOKEN_COL=False)
    return local_argmax[:, 0]


def prove(args):
    gumbel, copy_inputs = gumbel_module(args[1]), copy_request_inputs(args[0])
    n, position = int(os.environ.get("SAMPLES", "1200")), 1234
    # a target/draft pair where the coupling shows with few samples (each interpreted program is slow)
    p = torch.tensor([0.50, 0.43, 0.07])  # target
    q = torch.tensor([0.34, 0.02, 0.64])  # draft
    g = torch.Generator().manual_seed(11)
    seeds = torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64)
    idx = torch.arange(n, dtype=torch.int32)
    temperature = torch.ones(n)
    pos = torch.full((n,), position, dtype=torch.int64)

    # the speculator's buffers, filled by the (stock or overlaid) code under test
    spec = SimpleNamespace(temperature=torch.zeros(n), seeds=torch.zeros(n, dtype=torch.int64),
                           idx_mapping=torch.zeros(n, dtype=torch.int32), draft_logits=None)
    copy_inputs(spec, n, idx, temperature, seeds)

    draft = sample(gumbel, q.log().repeat(n, 1), idx, temperature, spec.seeds, pos)
    accept = torch.rand(n, generator=g) < (p[draft] / q[draft]).clamp(max=1.0)  # an independent stream
    residual = (p - q).clamp(min=0)
    recovered = sample(gumbel, (residual / residual.sum()).log().repeat(n, 1), idx, temperature, seeds, pos)
    out = torch.where(accept, draft, recovered)
    counts = torch.bincount(out, minlength=p.numel()).float()
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    _proof.report(chi2 < 13.8, f"outputs follow the target (chi-square {chi2:.1f} < 13.8)" if chi2 < 13.8 else
                  f"outputs drift from the target (chi-square {chi2:.1f}, 0.001 critical value 13.8)",
                  n=n, counts=counts.int().tolist(), expected=(n * p).round().int().tolist(), chi2=round(chi2, 2))


if __name__ == "__main__":
    _proof.main(prove)
