"""(a) MXFP4 routing bitmatrix: run the target's _stage2_pow2 under Triton's interpreter.

Usage: python mxfp4_bitmatrix_padding.py TARGET KEYED_ADD
  TARGET: .../fused_moe/experts/gpt_oss_triton_kernels_moe.py (stock or overlaid)
  KEYED_ADD: .../third_party/triton_kernels/routing_details/_routing_compute.py from the same base
Reference, from the defect: with top_k 6 a block holds 32 * 6 = 192 entries, padded to 256 lanes;
each program may write only its own block's entries, and the sorted result groups entries by
expert in flat order. FIXED: program 0 alone writes nothing past entry 191 and every program
together gives the reference. BROKEN: otherwise. Independent of the patch: the reference is a
stable sort of (expert, entry) written here, and "no write past the block" is read from memory.
Loaded by lifting: _stage2_pow2 is defined inside a function whose imports are triton_kernels'
(not vLLM's), so the loader lifts it and the _keyed_add it scans with from the base's files.
"""

import _proof  # beside this script; first: it picks Triton's interpreter or the GPU
import torch

_proof.USES_DEVICE = True  # its kernel runs where --device says


TOP_K, BLOCK_M, N_EXPERTS, N_TOKENS = 6, 32, 16, 48  # 2 blocks of 32 tokens, the last partial
BLOCK_SIZE = BLOCK_M * TOP_K
PADDED = 1 << (BLOCK_SIZE - 1).bit_length()
N_BLOCKS = -(-N_TOKENS // BLOCK_M)


def routing():
    """(experts [tokens, top_k], their flat order): the same in the run and in its judge."""
    gen = torch.Generator().manual_seed(7)
    experts = torch.stack([torch.randperm(N_EXPERTS, generator=gen)[:TOP_K] for _ in range(N_TOKENS)]).to(torch.int16)
    return experts, experts.flatten().long()


def observe(args):
    """The sorted columns and rows the target's kernel writes: program 0 alone, then every program."""
    target, keyed_add = args
    kernel = _proof.module("stage2_under_test", [
        "import triton\nimport triton.language as tl",
        _proof.function_source(keyed_add, "_keyed_add"),
        _proof.function_source(target, "_stage2_pow2")])._stage2_pow2
    experts, flat = routing()
    counts = torch.stack([torch.bincount(flat[b * BLOCK_SIZE:(b + 1) * BLOCK_SIZE], minlength=N_EXPERTS)
                          for b in range(N_BLOCKS)]).to(torch.int32)
    partial = (torch.cumsum(counts, 0) - counts).to(torch.int32).contiguous()  # exclusive, per block
    col_offs = (torch.cumsum(counts.sum(0), 0) - counts.sum(0)).to(torch.int32)

    def run(grid):
        on = _proof.DEVICE
        col_sorted = torch.full((flat.numel(),), -1, dtype=torch.int32, device=on)
        row_sorted = torch.full((flat.numel(),), -1, dtype=torch.int32, device=on)
        kernel[grid](col_sorted, row_sorted, experts.to(on), N_TOKENS, partial.to(on), partial.stride(0),
                     partial.stride(1), col_offs.to(on), TOKS_PER_ROW=TOP_K, BLOCK_PER_TOK=BLOCK_M,
                     BLOCK_SIZE_PADDED=PADDED)
        return col_sorted.cpu(), row_sorted.cpu()

    _, row_block0 = run((1,))  # program 0 alone
    col_all, row_all = run((N_BLOCKS,))
    return {"row_block0": row_block0, "col_all": col_all, "row_all": row_all}


def judge(observed, args):
    _, flat = routing()
    order = sorted(range(flat.numel()), key=lambda i: (int(flat[i]), i))
    ref_col = torch.tensor(order, dtype=torch.int32)
    ref_row = torch.empty_like(ref_col)
    ref_row[ref_col.long()] = torch.arange(flat.numel(), dtype=torch.int32)
    row_block0, col_all, row_all = (torch.from_numpy(observed[k]) for k in ("row_block0", "col_all", "row_all"))
    if any(t.shape != ref_col.shape or t.dtype != torch.int32 for t in (row_block0, col_all, row_all)):
        raise ValueError(f"the kernel's outputs are not {tuple(ref_col.shape)} int32, as the proof's run gives them")
    outside = [i for i in (row_block0 >= 0).nonzero().flatten().tolist() if i >= BLOCK_SIZE]
    matches = bool(torch.equal(row_all, ref_row) and torch.equal(col_all, ref_col))
    reason = (f"program 0 wrote {len(outside)} entries of block 1 ({outside[0]}..{outside[-1]})" if outside
              else "every program stays in its block") + ("" if matches else "; sorted result differs from the reference")
    return _proof.report(not outside and matches, reason, block_size=BLOCK_SIZE, padded=PADDED,
                         block0_wrote_outside=len(outside), result_matches_reference=matches)


if __name__ == "__main__":
    _proof.main(observe, judge)
