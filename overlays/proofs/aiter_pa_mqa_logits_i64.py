"""AITER's paged-MQA-logits Gluon kernels (the gfx942 indexer's decode reader): can a KV gather wrap
at a 20 GB KV pool?

Usage: python aiter_pa_mqa_logits_i64.py TARGET   (.../aiter/ops/triton/gluon/pa_mqa_logits.py, stock or overlaid)
The target's kernels are compiled as AITER's launcher compiles them (its signature and attributes:
the block table *i32, both strides i32) for gfx942 by the installed Triton, on the CPU (no GPU: the
kernels are never run, the compiler's IR is read), as far as TTGIR (what is read; the LLVM and code
object stages after it, four fifths of the compile, would read no differently): the preshuffle kernel and its varctx variant at
the deployment's block size (image/image.yaml serves --block-size=256: their second pipeline) and at
64 (their first), with ChunkK=256, the plain kernel at one token a block (the only paging it takes),
64 heads of 128 dims. What the launcher gives the kernels (the signature, the attributes: no
pointer_range on KV) is v0.1.19's launcher's, written here: a launcher that changes them is not seen.
Reference, from the defect: a pool of 20 GB (the seed deployment's; 16 GB today) holds blocks up to
20e9 / stride, so a gather at block_id * stride reaches 2e10 bytes; computed in 32 bits it wraps
past 2^31 (a buffer load then reads zeros: every logit of those blocks is 0.0) or 2^32 (it reads
another block). FIXED: no gather of KV_buffer or scale_buffer in any of the three kernels can wrap
or pass what its load reaches. BROKEN: names each that can, in the IR. Independent of the patch:
the widths and ranges are the compiler's IR read with exact integer semantics (ttgir_offsets),
not the patched text; a kernel that no longer compiles to TTGIR, or reads its blocks another way, is
CANNOT-PROVE (one that reaches TTGIR and fails only in LLVM is judged by its TTGIR: such a kernel
would not load at all, which the MI300X smoke finds). The IR is the proof's Triton's, not the
base's (3.9 here; the nightly ships 3.7).
"""

import os
import sys
import tempfile
import types

import _proof  # beside this script

os.environ.pop("TRITON_INTERPRET", None)  # compiled for gfx942, never interpreted: nothing runs

POOL = 20 * 10**9  # bytes of GPU KV: the seed deployment's at publication
HEADS, HIDDEN, CHUNK_K, BLOCK = 64, 128, 256, 256  # the DeepSeek-V4 indexer; image.yaml's --block-size
BYTES_PER_TOKEN = HIDDEN + 4  # fp8 K and one fp32 scale a token: stride in bytes of one token's row
PLAIN, PRESHUFFLE = "_gluon_deepgemm_fp8_paged_mqa_logits", "_gluon_deepgemm_fp8_paged_mqa_logits_preshuffle"
VARCTX = PRESHUFFLE + "_varctx"
SPLIT, SCHEDULE = ("SplitKV", "i32"), ("safe_chunks_per_cta_ptr", "*i32")  # the launcher's last argument
# (kernel, block size, last argument): the plain kernel at one token a block (its only paging); the
# preshuffle kernels at the deployment's 256 (their second pipeline) and at 64 (their first: a block
# size dividing ChunkK/2), so a fix of one pipeline alone is not taken for a fix of both
KERNELS = [(PLAIN, 1, SPLIT), (PRESHUFFLE, BLOCK, SPLIT), (PRESHUFFLE, 64, SPLIT), (VARCTX, BLOCK, SCHEDULE),
           (VARCTX, 64, SCHEDULE)]
SIGNATURE = {"batch_size": "i32", "next_n": "i32", "heads_num": "i32", "Q_buffer": "*fp8e4b8",
             "stride_q_batch": "i32", "stride_q_next_n": "i32", "stride_q_heads": "i32", "KV_buffer": "*fp8e4b8",
             "stride_k_seq": "i32", "scale_buffer": "*fp32", "stride_scale_seq": "i32", "context_len_ptr": "*i32",
             "kv_indices": "*i32", "weights": "*fp32", "stride_w_batch": "i32", "OutLogits_buffer": "*fp32",
             "stride_out_batch": "i64", "max_model_len": "i32", "max_block_len": "i32", "num_block": "i32"}


def pool(block: int) -> dict:
    """The arguments a 20 GB pool of this block size gives (strides in elements: fp8 bytes, fp32 words)."""
    stride = block * BYTES_PER_TOKEN
    blocks = POOL // stride
    return {"stride_k_seq": (stride, stride), "stride_scale_seq": (stride // 4, stride // 4),
            "num_block": (blocks, blocks), "blocks": blocks}


def load(path: str):
    """The target as a module of its own; its one import from AITER (get_cdna_version, which only
    says which CDNA the GPU is) answers gfx942's: 3."""
    import importlib.util

    names = ["aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.gluon",
             "aiter.ops.triton.gluon.pa_decode_gluon"]
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[names[-1]].get_cdna_version = lambda: 3
    spec = importlib.util.spec_from_file_location("pa_mqa_logits_under_test", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # an import this proof does not provide, a Triton without Gluon
        raise _proof.CannotProve(f"the target does not load here: {type(e).__name__}: {str(e)[:200]}")
    return module


def observe(args):
    """Each kernel's TTGIR, compiled for gfx942 (this runs AITER's kernel-building code, never a kernel)."""
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
    import triton
    from triton.backends.compiler import GPUTarget
    try:
        from triton.experimental.gluon._runtime import GluonASTSource
    except ImportError as e:
        raise _proof.CannotProve(f"this Triton ({triton.__version__}) has no Gluon: {e}")

    module = load(args[0])
    observed = {}
    for name, block, (last, kind) in KERNELS:
        fn = _proof.need(module, name)
        signature = {**SIGNATURE, last: kind, "ChunkQ": "constexpr", "ChunkK": "constexpr",
                     "KVBlockSize": "constexpr", "HiddenDim": "constexpr", "CDNA_VERSION": "constexpr",
                     "ARCH": "constexpr"}
        source = GluonASTSource(fn=fn, signature=signature, constexprs={
            "ChunkQ": HEADS, "ChunkK": CHUNK_K, "KVBlockSize": block, "HiddenDim": HIDDEN, "CDNA_VERSION": 3,
            "ARCH": "gfx942"}, attrs={(2,): [["tt.divisibility", 16]],
                                      (3,): [["tt.divisibility", 16], ["tt.pointer_range", 32]],
                                      (11,): [["tt.pointer_range", 32]], (12,): [["tt.pointer_range", 32]],
                                      (13,): [["tt.divisibility", 16], ["tt.pointer_range", 32]]})
        try:
            observed[f"{name}@{block}"] = ttgir(triton, source, GPUTarget("hip", "gfx942", 64), {
                "num_warps": 4, "waves_per_eu": 2, "num_stages": 2, "num_ctas": 1})
        except Exception as e:
            raise _proof.CannotProve(f"{name} does not compile for gfx942: {type(e).__name__}: {str(e)[:300]}")
    return observed


class _Lowered(Exception):
    """Raised by the stage after TTGIR, carrying the TTGIR's text: the compile ends there."""


def ttgir(triton, source, target, options: dict) -> str:
    """The kernel's TTGIR, as triton.compile makes it, the stages after it left out (through Triton's
    add_stages_inspection_hook; a Triton without the hook runs them all)."""
    from triton import knobs

    def stop_after_ttgir(*args):
        if not args:  # compile() asks for what the hook adds to its cache key
            return "bakery-proof-stops-after-ttgir", "1"
        stages = args[1]
        names = list(stages)
        if "ttgir" in names[:-1]:
            stages[names[names.index("ttgir") + 1]] = _raise_lowered

    hooked = hasattr(knobs, "runtime") and hasattr(knobs.runtime, "add_stages_inspection_hook")
    if hooked:
        knobs.runtime.add_stages_inspection_hook = stop_after_ttgir
    try:
        return triton.compile(source, target=target, options=options).asm["ttgir"]
    except _Lowered as stopped:
        return stopped.args[0]
    finally:
        if hooked:
            knobs.runtime.add_stages_inspection_hook = None


def _raise_lowered(module, metadata):
    raise _Lowered(str(module))


def judge(observed, args):
    import ttgir_offsets  # beside this script

    bad, counts = [], {}
    for name, block, _ in KERNELS:
        given = pool(block)
        ir = str(observed[f"{name}@{block}"])
        try:
            accesses = ttgir_offsets.analyse(ir, name, {k: v for k, v in given.items() if k != "blocks"},
                                             "kv_indices", given["blocks"], ("KV_buffer", "scale_buffer"))
        except ttgir_offsets.Unmodelled as e:  # fails closed: no verdict rests on what it cannot read
            raise _proof.CannotProve(f"{name}: {e}")
        if {a.buffer for a in accesses} != {"KV_buffer", "scale_buffer"}:
            raise _proof.CannotProve(f"{name}: no gather of both KV_buffer and scale_buffer found in its IR")
        wrong = [a for a in accesses if a.wraps or (a.reach is not None and a.reach >= ttgir_offsets.BUFFER_REACH)]
        counts[f"{name.replace(PLAIN, 'kernel')}@{block}"] = f"{len(wrong)} of {len(accesses)}"
        bad += [(f"{name} at block size {block}", a) for a in wrong]
    if not bad:
        return _proof.report(True, f"every KV and scale gather of the three kernels (both preshuffle pipelines) stays "
                                   f"within its range at a {POOL / 1e9:.0f} GB pool (64-bit where it must be)",
                             gathers_that_wrap=counts)
    where, first = bad[0]
    why = sorted(first.wraps)[0] if first.wraps else f"a buffer load reaching {first.reach} bytes"
    return _proof.report(False, f"{len(bad)} gathers can wrap at a {POOL / 1e9:.0f} GB pool; the first, in {where}: "
                                f"{first.buffer} at IR line {first.line}, by {why}", gathers_that_wrap=counts)


if __name__ == "__main__":
    _proof.main(observe, judge)
