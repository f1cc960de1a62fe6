"""(f) Speculative sampling with the base's own Gumbel sampler, under Triton's interpreter.

Usage: python independent_draft_gumbel.py SPECULATOR_PY GUMBEL_PY
SPECULATOR_PY is the stock or overlaid vllm/v1/worker/gpu/spec_decode/speculator.py, whose
_copy_request_inputs decides the seeds the draft samples with; GUMBEL_PY is
vllm/v1/worker/gpu/sample/gumbel.py from the same base, whose kernel draws both the draft token of
position Q (keyed by the seeds the speculator copied, at Q-1 + 1 as its sample_draft passes) and
the recovery resample of a rejected Q (keyed by the target's (seed, Q)).
Reference, from rejection sampling itself (Leviathan et al.; Chen et al.): a rejected draft is
replaced by an independent draw from max(0, p - q), so over many requests the pair (draft,
recovered) must follow q x residual. With the target's key reused, the recovered token is the one
whose noise made the draft win: the pairs cluster on the diagonal. FIXED: the chi-square statistic
of the n x (draft, recovered) histogram against n q x residual is below 20.5 (the 0.001 critical
value for its 5 degrees of freedom). BROKEN: above it. Sized so: with p = (.45, .45, .10) and
q = (.2, .2, .6), sharing the key puts every recovered token of drafts 0 and 1 on the draft itself.
In 20,000 simulated runs of 120 requests (numpy's Gumbel draws, the key shared) the statistic never
fell below 30; with independent keys it passed 20.5 about once in 2,000, the test's own level. The
seeds are fixed, so a verdict repeats; nothing in the environment changes n.
"""

import ast
import os
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


SAMPLES, POSITION = 120, 1234
CRITICAL = 20.515  # chi-square, 5 degrees of freedom, p = 0.001


def prove(args):
    gumbel, copy_inputs = gumbel_module(args[1]), copy_request_inputs(args[0])
    n = SAMPLES
    p = torch.tensor([0.45, 0.45, 0.10])  # target
    q = torch.tensor([0.20, 0.20, 0.60])  # draft
    residual = (p - q).clamp(min=0)
    residual = residual / residual.sum()
    g = torch.Generator().manual_seed(11)
    seeds = torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64)
    idx = torch.arange(n, dtype=torch.int32)
    temperature = torch.ones(n)
    pos = torch.full((n,), POSITION, dtype=torch.int64)

    # the speculator's buffers, filled by the (stock or overlaid) code under test
    spec = SimpleNamespace(temperature=torch.zeros(n), seeds=torch.zeros(n, dtype=torch.int64),
                           idx_mapping=torch.zeros(n, dtype=torch.int32), draft_logits=None)
    copy_inputs(spec, n, idx, temperature, seeds)

    draft = sample(gumbel, q.log().repeat(n, 1), idx, temperature, spec.seeds, pos)
    recovered = sample(gumbel, residual.log().repeat(n, 1), idx, temperature, seeds, pos)
    observed = torch.zeros(3, 3)
    observed.index_put_((draft, recovered), torch.ones(n), accumulate=True)
    expected = n * torch.outer(q, residual)
    cells = expected > 0
    if observed[~cells].sum() > 0:
        chi2 = float("inf")  # a recovered token the residual gives no mass to
    else:
        chi2 = float(((observed[cells] - expected[cells]) ** 2 / expected[cells]).sum())
    diagonal = int(observed.diagonal()[:2].sum())
    _proof.report(chi2 < CRITICAL,
                  f"draft and recovered tokens are independent (chi-square {chi2:.1f} < {CRITICAL})" if chi2 < CRITICAL
                  else f"recovered tokens follow the draft's noise (chi-square {chi2:.1f} >= {CRITICAL}; {diagonal} "
                       f"of {int(observed[:2].sum())} recoveries of drafts 0 and 1 repeat the draft)",
                  n=n, observed=observed.int().tolist(), expected=expected.round(decimals=1).tolist(),
                  chi2=round(chi2, 2))


if __name__ == "__main__":
    _proof.main(prove)
