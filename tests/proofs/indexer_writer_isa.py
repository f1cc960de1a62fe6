"""Compile vLLM 0.26.0's FP8 indexer-cache writer kernel for an AMD GPU with Triton's real
compiler (ahead of time: no GPU needed) and report what the machine code does with FP8.

Usage: python indexer_writer_isa.py WRITER_FILE ARCH FP8_MAX [FNUZ PRESHUFFLE]
  ARCH: gfx942 (MI300X, FNUZ FP8) or gfx950 (MI355X, OCP FP8)
  FNUZ, PRESHUFFLE: the overlaid kernel's flags (0 or 1), as its launcher passes them on FNUZ
  hardware; elsewhere the launcher leaves them at their default, False, which is what 0 0 gives.
Prints JSON: the sha256 of the AMDGCN assembly (line info off, so only the code counts) and the
FP8 conversion instructions in it.
"""

import hashlib
import json
import os
import re
import sys
from pathlib import Path

os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # the source's line numbers differ between versions
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "overlays" / "proofs"))
import _proof as lift  # noqa: E402  (the overlay proofs' helper)

os.environ.pop("TRITON_INTERPRET", None)  # set by the helper for CPU proofs: here Triton compiles for real
import triton  # noqa: E402  (after TRITON_INTERPRET is unset)
from triton.backends.compiler import GPUTarget  # noqa: E402  (after TRITON_INTERPRET is unset)
from triton.compiler import ASTSource  # noqa: E402  (after TRITON_INTERPRET is unset)

KERNEL = "_fused_kv_compress_norm_rope_insert_indexer_attn"
# the launcher's argument types for DeepSeek V4's indexer (head 128, one float32 scale per token)
SIGNATURE = {
    "state_cache_ptr": "*fp32", "state_cache_stride0": "i32", "state_cache_stride1": "i32",
    "token_to_req_indices_ptr": "*i32", "positions_ptr": "*i64", "slot_mapping_ptr": "*i64",
    "block_table_ptr": "*i32", "block_table_stride": "i32", "block_size": "i32",
    "rms_norm_weight_ptr": "*bf16", "rms_norm_eps": "fp32", "cos_sin_cache_ptr": "*fp32",
    "cos_sin_stride": "i32", "k_cache_ptr": "*u8", "kv_slot_mapping_ptr": "*i64", "kv_cache_block_size": "i32",
}


def kernel(path: str):
    return getattr(lift.module("writer_under_test", ["import triton\nimport triton.language as tl",
                                                      lift.function_source(path, KERNEL)]), KERNEL)


def main() -> None:
    path, arch, fp8_max = sys.argv[1], sys.argv[2], float(sys.argv[3])
    constants = {"HEAD_SIZE": 128, "TRITON_BLOCK_SIZE": 128, "STATE_WIDTH": 256, "COMPRESS_RATIO": 4, "OVERLAP": True,
                 "ROPE_HEAD_DIM": 64, "FP8_MAX": fp8_max, "QUANT_BLOCK": 128, "TOKEN_STRIDE": 128, "SCALE_DIM": 4,
                 "KV_BLOCK_STRIDE": 64 * 132}
    if len(sys.argv) > 4:  # the overlaid kernel's flags
        constants.update(FNUZ=sys.argv[4] == "1", PRESHUFFLE=sys.argv[5] == "1")
    signature = dict(SIGNATURE, **dict.fromkeys(constants, "constexpr"))
    compiled = triton.compile(ASTSource(kernel(path), signature, constexprs=constants),
                              target=GPUTarget("hip", arch, 64), options={"num_warps": 1})
    asm = compiled.asm["amdgcn"]
    print(json.dumps({"sha256": hashlib.sha256(asm.encode()).hexdigest(),
                      "fp8_instructions": sorted(set(re.findall(r"\bv_cvt\w*_fp8_\w*", asm)))}))


if __name__ == "__main__":
    main()
