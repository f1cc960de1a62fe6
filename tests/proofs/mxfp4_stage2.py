"""Run vLLM 0.26.0's _stage2_pow2 (MXFP4 routing bitmatrix, stage 2) under Triton's interpreter.

Usage: python mxfp4_stage2.py KERNEL_FILE KEYED_ADD_FILE   (the module sources, stock or patched)
Prints JSON: what one program (block 0) wrote, and the full result against a reference.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: jit then builds interpreted kernels

import torch  # noqa: E402

import lift  # noqa: E402  (beside this script)


def load(kernel_file: str, keyed_add_file: str):
    """The stage-2 kernel with the helper it calls, as one real module."""
    return lift.module("stage2_under_test", ["import triton\nimport triton.language as tl",
                                             lift.function_source(keyed_add_file, "_keyed_add"),
                                             lift.function_source(kernel_file, "_stage2_pow2")])._stage2_pow2


def main() -> None:
    kernel = load(sys.argv[1], sys.argv[2])
    top_k, block_m, n_experts, n_tokens = 6, 32, 16, 80  # 3 blocks of 32 tokens, the last partial
    block_size = block_m * top_k  # 192: not a power of two, padded to 256 lanes
    padded = 1 << (block_size - 1).bit_length()
    gen = torch.Generator().manual_seed(7)
    experts = torch.stack([torch.randperm(n_experts, generator=gen)[:top_k] for _ in range(n_tokens)]).to(torch.int16)
    flat = experts.flatten().long()
    n_blocks = -(-n_tokens // block_m)
    counts = torch.zeros(n_blocks, n_experts, dtype=torch.int32)
    for b in range(n_blocks):
        counts[b] = torch.bincount(flat[b * block_size:(b + 1) * block_size], minlength=n_experts)
    partial = (torch.cumsum(counts, 0) - counts).to(torch.int32).contiguous()  # exclusive, per block
    col_offs = (torch.cumsum(counts.sum(0), 0) - counts.sum(0)).to(torch.int32)
    # reference: entries grouped by expert, in flat order within an expert
    order = sorted(range(flat.numel()), key=lambda i: (int(flat[i]), i))
    ref_col = torch.tensor(order, dtype=torch.int32)
    ref_row = torch.empty_like(ref_col)
    ref_row[ref_col.long()] = torch.arange(flat.numel(), dtype=torch.int32)

    def run(grid):
        col_sorted = torch.full((flat.numel(),), -1, dtype=torch.int32)
        row_sorted = torch.full((flat.numel(),), -1, dtype=torch.int32)
        kernel[grid](col_sorted, row_sorted, experts, n_tokens, partial, partial.stride(0), partial.stride(1),
                     col_offs, TOKS_PER_ROW=top_k, BLOCK_PER_TOK=block_m, BLOCK_SIZE_PADDED=padded)
        return col_sorted, row_sorted

    _, row_block0 = run((1,))  # program 0 alone
    written = (row_block0 >= 0).nonzero().flatten().tolist()
    col_all, row_all = run((n_blocks,))
    print(json.dumps({
        "block_size": block_size, "padded": padded,
        "block0_wrote_outside_its_block": [i for i in written if i >= block_size],
        "row_sorted_matches_reference": bool(torch.equal(row_all, ref_row)),
        "col_sorted_matches_reference": bool(torch.equal(col_all, ref_col)),
    }))


if __name__ == "__main__":
    main()
