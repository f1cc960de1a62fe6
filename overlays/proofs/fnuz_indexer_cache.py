"""(d) Write DeepSeek V4's FP8 indexer K cache with the target's fused compressor kernel and read it
back the way gfx942 reads it, under Triton's interpreter.

Usage: python fnuz_indexer_cache.py WRITER_FILE READER_FILE
  WRITER_FILE: fused_compress_quant_cache.py (stock or patched)
  READER_FILE: rocm_aiter_mla_sparse.py (cp_gather_indexer_k_quant_cache_triton, the ROCm indexer's
               prefill reader)
`current_platform` is a stand-in whose FP8 flavour the script picks: gfx942 (FNUZ) or OCP hardware.
Reference, from the defect: a gfx942 reader must read back the keys OCP hardware reads from the
same writer (the keys the model computed). Those keys are decoded here from the OCP write's bytes
by this script's own E4M3 decoder (bias 7), row-major, times the stored scale. The gfx942 side is
read twice, and both must give exactly those keys for FIXED: by vLLM's own ROCm reader (the
kernel that runs in production), and by this script's own decoder of the layout that reader and
AITER's preshuffled paged-MQA-logits reader expect, taken from the reader's documented shape
[blocks, block/16, head/16 B, 16 tokens, 16 B] and the FNUZ E4M3 encoding (bias 8, 0x80 NaN).
Neither decoder uses torch's FP8 types or the patch's code. BROKEN: either reads other values
(scrambled tiles, halved magnitudes). AITER's own gfx942 reader is a Gluon kernel that cannot run
on a CPU.
"""

import hashlib
import os

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
    """The writer's launcher and kernel, and the ROCm reader, as one real module."""
    parts = ["from typing import Any\n\nimport torch\nimport triton\nimport triton.language as tl\n"
             "current_platform = None"]
    parts += [_proof.function_source(writer, n) for n in
              ("compress_norm_rope_store_triton", "_fused_kv_compress_norm_rope_insert_indexer_attn")]
    parts += [_proof.function_source(reader, n) for n in
              ("_cp_gather_indexer_quant_cache_kernel", "cp_gather_indexer_k_quant_cache_triton")]
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


def write(module, fnuz: bool) -> torch.Tensor:
    """The compressor's cache, as the target's writer leaves it for one platform's FP8 flavour."""
    module.current_platform.fnuz = fnuz
    cache = torch.zeros(4, KV_BLOCK, HEAD + 4, dtype=torch.uint8)
    module.compress_norm_rope_store_triton(kv_cache=cache, **inputs())
    return cache


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


def e4m3(codes: np.ndarray, bias: int, nan) -> np.ndarray:
    """FP8 E4M3 bytes to float64, from the bit layout: sign, 4 exponent bits, 3 mantissa bits;
    exponent 0 is subnormal. OCP (bias 7): 0x7F/0xFF are NaN. FNUZ (bias 8): 0x80 is NaN."""
    b = codes.astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exponent, mantissa = (b >> 3) & 0xF, b & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** (1 - bias), (1 + mantissa / 8) * 2.0 ** (exponent - bias))
    return np.where(nan(b), np.nan, sign * magnitude)


def decode(cache: torch.Tensor, shuffled: bool, bias: int, nan) -> np.ndarray:
    """[compressed entries, HEAD] keys from the cache's bytes: row-major, or in tiles of 16 tokens x
    16 bytes; each times its entry's float32 scale, which every layout keeps after the FP8 area."""
    flat = cache.view(cache.shape[0], -1).numpy()
    keys = np.empty((TOKENS // RATIO, HEAD))
    for entry in range(TOKENS // RATIO):
        block, token = KV_BLOCKS[entry // KV_BLOCK], entry % KV_BLOCK
        byte = np.arange(HEAD)
        at = ((token // 16) * HEAD * 16 + (byte // 16) * 16 * 16 + (token % 16) * 16 + byte % 16) if shuffled \
            else token * HEAD + byte
        scale = flat[block, KV_BLOCK * HEAD + 4 * token:KV_BLOCK * HEAD + 4 * token + 4].view(np.float32)[0]
        keys[entry] = e4m3(flat[block, at], bias, nan) * float(scale)
    return keys


def ocp_keys(cache: torch.Tensor) -> np.ndarray:
    return decode(cache, shuffled=False, bias=7, nan=lambda b: (b & 0x7F) == 0x7F)


def fnuz_keys(cache: torch.Tensor) -> np.ndarray:
    return decode(cache, shuffled=True, bias=8, nan=lambda b: b == 0x80)


def prove(args):
    module = load(*args)
    ocp_cache = write(module, fnuz=False)
    reference = ocp_keys(ocp_cache)  # what OCP hardware reads
    if not np.isfinite(reference).all():
        raise _proof.CannotProve("the OCP write does not read back finite keys: the writer changed its contract")
    fnuz_cache = write(module, fnuz=True)
    by_reader = gather(module, fnuz_cache).double().numpy()  # vLLM's ROCm reader
    by_layout = fnuz_keys(fnuz_cache)  # the tiled FNUZ layout, decoded here
    errors = {name: float(np.nan_to_num(np.abs(seen - reference), nan=np.inf).max())
              for name, seen in (("vLLM's ROCm reader", by_reader), ("the tiled FNUZ layout", by_layout))}
    wrong = [f"{name} reads back other keys (max error {error:g})" for name, error in errors.items() if error != 0]
    _proof.report(not wrong, "gfx942 reads back exactly the keys OCP hardware reads, by vLLM's reader and by the "
                             "layout's own decoding" if not wrong else
                  "; ".join(wrong) + f" on keys up to {float(np.abs(reference).max()):g}",
                  ocp_bytes_sha256=hashlib.sha256(ocp_cache.numpy().tobytes()).hexdigest(),
                  max_abs_error_reader=errors["vLLM's ROCm reader"], max_abs_error_layout=errors["the tiled FNUZ layout"])


if __name__ == "__main__":
    _proof.main(prove)
