"""(d) Write DeepSeek V4's FP8 indexer K cache with the target's fused compressor kernel and read it
back with the reader vLLM itself uses on ROCm, under Triton's interpreter.

Usage: python fnuz_indexer_cache.py WRITER_FILE READER_FILE
  WRITER_FILE: fused_compress_quant_cache.py (stock or patched)
  READER_FILE: rocm_aiter_mla_sparse.py (cp_gather_indexer_k_quant_cache_triton, and V3.2's
               indexer_k_quant_and_cache_triton, the writer that pairs with AITER's preshuffled
               paged-MQA-logits reader)
`current_platform` is a stand-in whose FP8 flavour the script picks: gfx942 (FNUZ) or OCP hardware.
Reference, from the defect: a gfx942 reader must read back what OCP hardware reads from the same
writer's OCP bytes (the keys the model computed). FIXED: the FNUZ write reads back exactly that.
BROKEN: it reads back other values (scrambled tiles, halved magnitudes). AITER's own gfx942 reader
is a Gluon kernel that cannot run on a CPU; the bytes are also compared, where the scales agree,
with V3.2's FNUZ writer, whose layout that reader takes (measured, not part of the verdict).
"""

import hashlib
import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: jit then builds interpreted kernels

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import _proof  # noqa: E402  (beside this script)

# Triton's interpreter hands some scalar masks broadcast to a block (the reader's `valid_block`) to
# its store as int32, which it then refuses; on the GPU they are i1. Give it the booleans it wants.
_masked_store = interpreter.InterpreterBuilder.create_masked_store


def _create_masked_store(self, ptrs, value, mask, cache_policy):
    if mask.data.dtype != np.bool_:
        mask = interpreter.TensorHandle(mask.data.astype(np.bool_), tl.int1)
    return _masked_store(self, ptrs, value, mask, cache_policy)


interpreter.InterpreterBuilder.create_masked_store = _create_masked_store

HEAD, ROPE, RATIO, KV_BLOCK = 128, 64, 4, 64  # DeepSeek V4 indexer: head 128, cache block 256 / 4
TOKENS = 4 * 80  # 80 compressed entries: one full cache block and a partial one
KV_BLOCKS = [3, 1]  # physical blocks of the request, out of 4


class Platform:
    fnuz = False

    def is_fp8_fnuz(self):
        return self.fnuz

    def fp8_dtype(self):
        return torch.float8_e4m3fnuz if self.fnuz else torch.float8_e4m3fn


def load(writer: str, reader: str):
    """The writer's launcher and kernel, and the ROCm reader and V3.2 writer, as one real module."""
    parts = ["from typing import Any\n\nimport torch\nimport triton\nimport triton.language as tl\n"
             "current_platform = None"]
    parts += [_proof.function_source(writer, n) for n in
              ("compress_norm_rope_store_triton", "_fused_kv_compress_norm_rope_insert_indexer_attn")]
    parts += [_proof.function_source(reader, n) for n in
              ("_cp_gather_indexer_quant_cache_kernel", "cp_gather_indexer_k_quant_cache_triton",
               "_indexer_k_quant_and_cache_kernel", "indexer_k_quant_and_cache_triton")]
    module = _proof.module("indexer_cache_under_test", parts)
    module.current_platform = Platform()
    return module


def inputs():
    g = torch.Generator().manual_seed(11)
    state_width = 2 * HEAD  # overlap (ratio 4): two heads of kv state, then two of score state
    state = torch.randn(1, TOKENS, 2 * state_width, generator=g)
    cos_sin = torch.cat([torch.cos(torch.linspace(0, 3, TOKENS * ROPE // 2)).view(TOKENS, ROPE // 2),
                         torch.sin(torch.linspace(0, 3, TOKENS * ROPE // 2)).view(TOKENS, ROPE // 2)], dim=1)
    positions = torch.arange(TOKENS)
    compressed = positions // RATIO
    boundary = (positions + 1) % RATIO == 0
    kv_slots = torch.tensor(KV_BLOCKS)[compressed // KV_BLOCK] * KV_BLOCK + compressed % KV_BLOCK
    return dict(state_cache=state, num_actual=TOKENS, token_to_req_indices=torch.zeros(TOKENS, dtype=torch.int32),
                positions=positions, slot_mapping=positions.clone(), block_table=torch.zeros(1, 1, dtype=torch.int32),
                block_size=TOKENS, state_width=state_width, cos_sin_cache=cos_sin,
                k_cache_metadata=type("Meta", (), {"slot_mapping": torch.where(boundary, kv_slots, -1)}),
                pdl_kwargs={}, head_dim=HEAD, rope_head_dim=ROPE, compress_ratio=RATIO, overlap=True,
                use_fp4_cache=False, rms_norm_weight=torch.rand(HEAD, generator=g) + 0.5, rms_norm_eps=1e-6,
                quant_block=HEAD, token_stride=HEAD, scale_dim=4)


def write(module, fnuz: bool, keep=None) -> torch.Tensor:
    """The compressor's cache; `keep` (one bool per compressed entry) leaves the others unwritten."""
    module.current_platform.fnuz = fnuz
    cache = torch.zeros(4, KV_BLOCK, HEAD + 4, dtype=torch.uint8)
    args = inputs()
    if keep is not None:
        slots = args["k_cache_metadata"].slot_mapping
        dropped = torch.zeros_like(slots, dtype=torch.bool)
        dropped[RATIO - 1::RATIO] = ~keep
        args["k_cache_metadata"].slot_mapping = torch.where(dropped, -1, slots)
    module.compress_norm_rope_store_triton(kv_cache=cache, **args)
    return cache


def scales(cache: torch.Tensor) -> torch.Tensor:
    """Per compressed entry; every writer keeps the float32 scales row-major after the FP8 area."""
    flat = cache.view(cache.shape[0], -1)
    return flat[:, KV_BLOCK * HEAD:].reshape(-1, KV_BLOCK, 4).view(torch.float32)[KV_BLOCKS].flatten()[:TOKENS // RATIO]


def row_major(cache: torch.Tensor, dtype) -> torch.Tensor:
    """What an OCP-hardware reader sees: [compressed entries, HEAD] dequantized, row-major."""
    flat = cache.view(cache.shape[0], -1)
    values = flat[:, :KV_BLOCK * HEAD].reshape(-1, KV_BLOCK, HEAD).view(dtype).float()[KV_BLOCKS]
    return values.reshape(-1, HEAD)[:TOKENS // RATIO] * scales(cache)[:, None]


def gather(module, cache: torch.Tensor) -> torch.Tensor:
    """What gfx942 sees: vLLM's ROCm indexer prefill reader, dequantized."""
    module.current_platform.fnuz = True
    n = TOKENS // RATIO
    k_fp8 = torch.zeros(n, HEAD, dtype=torch.float8_e4m3fnuz)
    k_scale = torch.zeros(n, 4, dtype=torch.uint8)
    module.cp_gather_indexer_k_quant_cache_triton(
        cache, k_fp8, k_scale, torch.tensor([KV_BLOCKS], dtype=torch.int32),
        torch.tensor([0, n], dtype=torch.int32), torch.zeros(n, dtype=torch.int32))
    return k_fp8.float() * k_scale.view(torch.float32)


def v32_writer(module, k: torch.Tensor, keep=None) -> torch.Tensor:
    """The same K through V3.2's FNUZ indexer writer, whose layout AITER's preshuffled reader takes."""
    module.current_platform.fnuz = True
    cache = torch.zeros(4, KV_BLOCK, HEAD + 4, dtype=torch.uint8)
    entries = torch.arange(k.shape[0])
    slots = torch.tensor(KV_BLOCKS)[entries // KV_BLOCK] * KV_BLOCK + entries % KV_BLOCK
    if keep is not None:
        slots = torch.where(keep, slots, -1)
    module.indexer_k_quant_and_cache_triton(k.contiguous(), cache, slots, HEAD, "ue8m0")
    return cache


def same_bytes_as_v32_writer(module, reference: torch.Tensor, cache: torch.Tensor) -> dict:
    """Fed our dequantized K, V3.2's writer picks our power-of-two scale again except where the
    largest value of an entry sits exactly on an edge (112 or 224 times the scale), where it may
    pick half or double: same values, other bytes. Compare the entries where the scales agree."""
    keep = scales(v32_writer(module, reference)) == scales(cache)
    ours, theirs = write(module, fnuz=True, keep=keep), v32_writer(module, reference, keep)
    return {"v32_entries_compared": int(keep.sum()), "bytes_as_v32_fnuz_writer": bool(torch.equal(ours, theirs))}


def prove(args):
    module = load(*args)
    ocp_cache = write(module, fnuz=False)
    reference = row_major(ocp_cache, torch.float8_e4m3fn)  # what OCP hardware reads
    if not bool(torch.isfinite(reference).all()):
        raise _proof.CannotProve("the OCP write does not read back finite keys: the writer changed its contract")
    seen = gather(module, write(module, fnuz=True))
    error = float((seen - reference).abs().nan_to_num(float("inf")).max())
    same = bool(torch.equal(seen, reference))
    _proof.report(same, "gfx942 reads back exactly the keys OCP hardware reads" if same else
                  f"gfx942 reads back other keys: max error {error:g} on keys up to {float(reference.abs().max()):g}",
                  ocp_bytes_sha256=hashlib.sha256(ocp_cache.numpy().tobytes()).hexdigest(), max_abs_error=error,
                  **same_bytes_as_v32_writer(module, reference, write(module, fnuz=True)))


if __name__ == "__main__":
    _proof.main(prove)
