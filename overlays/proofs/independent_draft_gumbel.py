"""(f) Speculative decoding through the base's own DSpark draft sampler and rejection sampler, under
Triton's interpreter.

Usage: python independent_draft_gumbel.py SPECULATOR_PY -- GUMBEL_PY DFLASH_PY DSPARK_PY REJECTION_PY
SPECULATOR_PY is the stock or overlaid vllm/v1/worker/gpu/spec_decode/speculator.py, whose
_copy_request_inputs sets the seeds the draft samples with; the others are from the same base:
sample/gumbel.py, spec_decode/dflash/speculator.py, spec_decode/dspark/speculator.py and
spec_decode/rejection_sampler_utils.py. All load as vLLM imports them (_proof.load_vllm). For each
of N requests, one probabilistic draft token is proposed by DSparkSpeculator._sample_sequential
(the served path for this model: its own Gumbel call, its own position convention, the seeds its
inherited _copy_request_inputs copied) and verified by rejection_sample (its accept test, its
resample kernel for a rejected token). Only the draft and target distributions are the proof's.
Reference, from rejection sampling itself (Leviathan et al.; Chen et al.), independent of how any
vLLM version keys its noise: the draft d follows q, is kept with probability min(1, p_d/q_d), and
is otherwise replaced by an independent draw from max(0, p - q). Here p gives token 0 nothing, so
every draft 0 is replaced, by token 2 with probability 0.65 (its share of the residual), while
drafts 1 and 2 (p >= q) are always kept and tell nothing about replacement: only drafts 0 are
verified. When the target reuses the draft's Gumbel key, the noise that made draft 0 win also
picks its replacement, which then favours token 2 (its noise is the least bound by draft 0's win
over token 1): about 0.83 instead of 0.65.
FIXED: the chi-square statistic of the replacements of the drafts 0 against 0.65/0.35 is below
10.83 (0.001, 1 degree of freedom); BROKEN: above it, or a draft 0 kept. Sized so (N = 700
requests, about 245 drafts 0): in 20,000 simulated runs with the key shared the statistic fell
below 10.83 in 0.05%; with independent keys it exceeded it in 0.07%. Before judging, the drafts
themselves must follow q (chi-square below 13.8, 2 degrees of freedom), or the proof cannot tell:
its stand-in for the draft model did not reach the speculator's sampler as it thinks. The seeds
are fixed, so a verdict repeats; nothing in the environment changes N.
"""

import _proof  # beside this script; first: it picks Triton's interpreter or the GPU
import torch

_proof.USES_DEVICE = True  # its kernels run where --device says
SPEC = "vllm.v1.worker.gpu.spec_decode"
P = (0.0, 0.7405, 0.2595)  # the target's next-token distribution
Q = (0.35, 0.618, 0.032)  # the draft's
N, POSITION = 700, 1234  # requests; the position of the drafted token
CRITICAL = 10.828  # chi-square, 1 degree of freedom, p = 0.001
DRAFTS_CRITICAL = 13.816  # chi-square, 2 degrees of freedom, p = 0.001


def load(target: str, reads: list[str]):
    if len(reads) != 4:
        raise _proof.CannotProve("needs the base's gumbel.py, dflash/ and dspark/speculator.py and "
                                 "rejection_sampler_utils.py beside the target")
    modules = _proof.load_vllm({
        "vllm.v1.worker.gpu.sample.gumbel": reads[0],
        f"{SPEC}.speculator": target,
        f"{SPEC}.dflash.speculator": reads[1],
        f"{SPEC}.dspark.speculator": reads[2],
        f"{SPEC}.rejection_sampler_utils": reads[3]})
    return (_proof.need(modules[f"{SPEC}.dspark.speculator"], "DSparkSpeculator"),
            _proof.need(modules[f"{SPEC}.rejection_sampler_utils"], "rejection_sample"))


class DraftModel:
    """The draft model's outputs: its hidden state is the draft logits themselves, no Markov bias."""

    def compute_draft_logits(self, hidden):
        return hidden

    def markov_embed(self, prev):
        return prev

    def markov_bias(self, embed):
        return torch.zeros(())


def draft(speculator_class, seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(draft tokens, the draft logits the speculator kept for verification), from the
    speculator's own code: the seeds through _copy_request_inputs, the draws by _sample_sequential."""
    n, vocab = len(seeds), len(Q)
    concrete = type("Speculator", (speculator_class,), {})
    concrete.__abstractmethods__ = frozenset()  # built without __init__ (no model, no GPU): its buffers are set here
    spec = object.__new__(concrete)
    state = dict(
        num_speculative_steps=1, max_num_reqs=n, vocab_size=vocab, model=DraftModel(),
        temperature=torch.zeros(n), seeds=torch.zeros(n, dtype=torch.int64),
        idx_mapping=torch.zeros(n, dtype=torch.int32), sample_indices=torch.arange(n),
        sample_idx_mapping=torch.arange(n, dtype=torch.int32), sample_pos=torch.full((n,), POSITION),
        input_buffers=type("Buffers", (), {"input_ids": torch.zeros(n, dtype=torch.int64)}),
        _anchor_idx=torch.arange(n), draft_logits=torch.zeros(n, 1, vocab), _d2t_scatter_index=None,
        _draft_scatter_buf=None, _step_cols=torch.arange(1), use_fp64_gumbel=False,
        draft_tokens=torch.zeros(n, 1, dtype=torch.int64), _draft_topk=None,
        enable_adaptive_verification=False, use_confidence_head=False, use_acceptance_estimator=False,
        acceptance_estimator=None, draft_watermarker=None)
    spec.__dict__.update(state)
    try:
        _proof.call(spec._copy_request_inputs, dict(num_reqs=n, idx_mapping=torch.arange(n, dtype=torch.int32),
                                                   temperature=torch.ones(n), seeds=seeds),
                    "the speculator's _copy_request_inputs")
        _proof.call(spec._sample_sequential, dict(num_reqs=n, head_hidden=torch.tensor(Q).log().repeat(n, 1)),
                    "DSparkSpeculator._sample_sequential")
    except AttributeError as e:
        raise _proof.CannotProve(f"the draft sampler needs {e.name or e}, which this proof does not set") from e
    return spec.draft_tokens[:, 0].clone(), spec.draft_logits


def verify(rejection_sample, drafts, draft_logits, seeds) -> torch.Tensor:
    """The token the target emits at the drafted position: the draft if accepted, else the
    resampled one, from rejection_sample over two logits per request (the draft's, the bonus)."""
    n = len(drafts)
    known = dict(
        target_logits=torch.tensor(P).log().repeat(2 * n, 1), draft_logits=draft_logits,
        draft_sampled=torch.stack([torch.zeros(n, dtype=torch.int64), drafts], 1).reshape(-1),
        cu_num_logits=torch.arange(0, 2 * n + 1, 2, dtype=torch.int32),
        pos=torch.tensor([POSITION - 1, POSITION]).repeat(n),
        idx_mapping=torch.arange(n, dtype=torch.int32),
        expanded_idx_mapping=torch.arange(n, dtype=torch.int32).repeat_interleave(2),
        expanded_local_pos=torch.tensor([0, 1], dtype=torch.int32).repeat(n),
        temperature=torch.ones(n), seed=seeds, num_speculative_steps=1,
        use_block_verification=True)  # DSpark as served: probabilistic drafts, block rejection
    sampled, _ = _proof.call(rejection_sample, known, "rejection_sample")
    return sampled[:, 0]


def residual() -> torch.Tensor:
    """max(0, p - q), normalized: the law of a replacement under exact speculative sampling."""
    p, q = (torch.tensor(law, dtype=torch.float64, device="cpu") for law in (P, Q))
    r = (p - q).clamp(min=0)
    return r / r.sum()


def chi2(observed: torch.Tensor, expected: torch.Tensor) -> float:
    if (observed[expected == 0] > 0).any():
        return float("inf")  # an outcome the law gives no mass to
    cells = expected > 0
    return float(((observed[cells] - expected[cells]) ** 2 / expected[cells]).sum())


def seeds_of_requests() -> torch.Tensor:
    return torch.randint(0, 2**62, (N,), generator=torch.Generator().manual_seed(11), dtype=torch.int64)


def observe(args):
    """Each request's draft token, and the token emitted for each draft 0 (this runs the target's code)."""
    speculator_class, rejection_sample = load(args[0], args[1:])
    torch.set_default_device(_proof.DEVICE)  # every buffer below where the kernels run
    seeds = seeds_of_requests().to(_proof.DEVICE)
    drafts, draft_logits = draft(speculator_class, seeds)
    zero = drafts == 0
    return {"drafts": drafts.cpu(), "emitted": verify(rejection_sample, drafts[zero], draft_logits[zero],
                                                      seeds[zero]).cpu()}


def judge(observed, args):
    drafts, emitted = (torch.from_numpy(observed[k]).long() for k in ("drafts", "emitted"))
    if drafts.shape != (N,) or emitted.shape != (int((drafts == 0).sum()),) or \
            not ((0 <= drafts) & (drafts < len(Q))).all() or not ((0 <= emitted) & (emitted < len(P))).all():
        raise ValueError("the drafts or the tokens emitted are not of the shapes and vocabulary the proof's run gives")
    drawn = torch.bincount(drafts, minlength=len(Q)).double()
    if chi2(drawn, N * torch.tensor(Q, dtype=torch.float64, device="cpu")) >= DRAFTS_CRITICAL:
        raise _proof.CannotProve(f"the speculator's drafts do not follow q (counts {drawn.int().tolist()}): "
                                 "the proof's stand-in does not reach its sampler as it should")
    replaced = torch.bincount(emitted, minlength=len(P)).double()
    statistic = chi2(replaced, len(emitted) * residual())
    share = float(replaced[2] / replaced.sum())
    return _proof.report(statistic < CRITICAL,
                         f"replacements follow max(0, p - q) (token 2 replaced {share:.0%} of drafts 0, chi-square "
                         f"{statistic:.1f} < {CRITICAL})" if statistic < CRITICAL else
                         f"replacements follow the draft's noise: token 2 replaced {share:.0%} of drafts 0, "
                         f"max(0, p - q) gives it {float(residual()[2]):.0%} (chi-square {statistic:.1f} >= {CRITICAL})",
                         n=N, drafts=drawn.int().tolist(), replacements=replaced.int().tolist(),
                         chi2=round(statistic, 2))


if __name__ == "__main__":
    _proof.main(observe, judge)
