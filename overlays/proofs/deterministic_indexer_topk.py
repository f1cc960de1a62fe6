"""Indexer top-k: run the target's _topk_indices_torch (vllm/v1/attention/ops/rocm_aiter_mla_sparse.py).

Usage: python deterministic_indexer_topk.py TARGET
Reference, from the defect: per row, the k largest scores with ties going to the lower index,
indices in ascending order, from a plain Python sort; the property that matters is that the same
scores choose the same tokens whatever else is in the batch and in whatever row order. The
scores are tie-heavy (small integers) with -inf tails, as masked indexer logits are.
FIXED: every row chooses the reference tokens, in every batch. BROKEN: a row chooses other tokens.
"""

import random

import torch

import _proof  # beside this script


K = 256


def expected(row: list[float], k: int) -> list[int]:
    best = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    return sorted(i if row[i] != float("-inf") else -1 for i in best)


def batches():
    """(the rows, and the rows each batch takes, in order): the same in the run and in its judge."""
    rng = random.Random(3)
    rows = [[float(rng.randrange(5)) for _ in range(2048)] + [float("-inf")] * 7 for _ in range(12)]
    return rows, [rng.sample(range(len(rows)), size) for size in (1, 3, 12) for _ in range(4)]


def observe(args):
    """The target's top-k indices of each batch (this runs the target's code)."""
    namespace = {"torch": torch}
    exec(compile(_proof.function_source(args[0], "_topk_indices_torch"), args[0], "exec"), namespace)
    topk = namespace["_topk_indices_torch"]
    rows, picks = batches()
    return {f"batch{b}": topk(torch.tensor([rows[i] for i in picked]), K) for b, picked in enumerate(picks)}


def judge(observed, args):
    rows, picks = batches()
    wrong = set()
    for b, picked in enumerate(picks):
        got = observed[f"batch{b}"]
        if got.shape != (len(picked), K):
            raise ValueError(f"batch {b} gave {got.shape} indices, not {(len(picked), K)}")
        for r, i in enumerate(picked):
            if sorted(got[r].tolist()) != expected(rows[i], K):
                wrong.add(i)
    return _proof.report(not wrong, f"{len(wrong)} of {len(rows)} rows choose other tokens than the lowest-index ties"
                         if wrong else "every row chooses the reference tokens in every batch",
                         rows=len(rows), batches=len(picks), rows_choosing_other_tokens=len(wrong))


if __name__ == "__main__":
    _proof.main(observe, judge)
