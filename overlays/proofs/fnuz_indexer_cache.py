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

import _proof  # beside this script; first: it picks Triton's interpreter or the GPU
import numpy as np
import torch

_proof.USES_DEVICE = True  # its kernels run where --device says
HEAD, ROPE, RATIO, KV_BLOCK = 128, 64, 4, 64  # DeepSeek V4 indexer: head 128, cache block 256 / 4
TOKENS = 4 * 80  # 80 compressed entries: one full cache block and a partial one
KV_BLOCKS = [3, 1]  # physical blocks of the request, out of 4


class Platform:
    """vllm.platforms.current_platform on a ROCm GPU whose FP8 flavour the proof picks."""
    fnuz = False

    def is_rocm(self):
        return True

    def is_fp8_fnuz(self):
        return self.fnuz

    def fp8_dtype(self):
        return torch.float8_e4m3fnuz if self.fnuz else torch.float8_e4m3fn


def kernel_launcher(call):
    """vLLM's declarative launcher (0.33 on): the method returns (grid, launch arguments); the rest
    is bound as _proof.bind_launch models it, and the kernel launched."""
    def launch(self, **given):
        grid, spec = call(self, **given)[:2]
        spec = dict(spec)
        kernel = spec.pop("kernel", None) or self.kernel
        kernel[grid](**_proof.bind_launch(kernel, given, spec))
    return launch


class LauncherBase:
    def __class_getitem__(cls, key):
        return cls


SHIPPED = "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache"
READER = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
MODELED = {
    "vllm.platforms": {"current_platform": Platform()},
    "vllm.platforms.rocm": {"_ON_GFX942": True, "_ON_GFX950": False},  # gfx942: MI300X
    "vllm.utils.deep_gemm": {"mqa_logits_use_mx_scales": lambda: False},  # no MX scales on gfx942
    "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b), "round_up": lambda a, b: -(-a // b) * b},
    "vllm.model_executor.warmup.jit_warmup": {"kernel_launcher": kernel_launcher},
    "vllm.model_executor.warmup.jit_warmup_triton_helper": {"VllmTritonJitKernel": LauncherBase},
}


def load(writer: str, reader: str):
    """The writer's module and the ROCm reader's, loaded as vLLM imports them."""
    modules = _proof.load_vllm({SHIPPED: writer, READER: reader}, MODELED)
    return (_proof.need(modules[SHIPPED], "compress_norm_rope_store_triton"),
            _proof.need(modules[READER], "cp_gather_indexer_k_quant_cache_triton"))


PLATFORM = MODELED["vllm.platforms"]["current_platform"]


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


def write(writer, fnuz: bool) -> torch.Tensor:
    """The compressor's cache, as the target's writer leaves it for one platform's FP8 flavour."""
    PLATFORM.fnuz = fnuz
    cache = torch.zeros(4, KV_BLOCK, HEAD + 4, dtype=torch.uint8, device=_proof.DEVICE)
    given = {k: v.to(_proof.DEVICE) if torch.is_tensor(v) else v for k, v in inputs().items()}
    given["k_cache_metadata"].slot_mapping = given["k_cache_metadata"].slot_mapping.to(_proof.DEVICE)
    _proof.call(writer, dict(kv_cache=cache, **given), "compress_norm_rope_store_triton")
    return cache.cpu()


def gather(reader, cache: torch.Tensor) -> torch.Tensor:
    """What gfx942 sees: vLLM's ROCm indexer prefill reader, dequantized."""
    PLATFORM.fnuz = True
    n, on = TOKENS // RATIO, _proof.DEVICE
    k_fp8 = torch.zeros(n, HEAD, dtype=torch.float8_e4m3fnuz, device=on)
    k_scale = torch.zeros(n, 4, dtype=torch.uint8, device=on)
    reader(
        cache.to(on), k_fp8, k_scale, torch.tensor([KV_BLOCKS], dtype=torch.int32, device=on),
        torch.tensor([0, n], dtype=torch.int32, device=on), torch.zeros(n, dtype=torch.int32, device=on))
    return k_fp8.cpu().float() * k_scale.cpu().view(torch.float32)


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


def without_fnuz(error: Exception) -> bool:
    """Triton compiling for a GPU without FNUZ FP8 (NVIDIA's) refuses the type this proof is about."""
    return _proof.DEVICE != "cpu" and "fp8e4b8 not supported" in str(error)


def observe(args):
    """The writer's cache for each FP8 flavour, and what vLLM's ROCm reader reads of the FNUZ one
    (this runs the target's code)."""
    try:
        writer, reader = load(*args)
        ocp_cache = write(writer, fnuz=False)
        fnuz_cache = write(writer, fnuz=True)
        return {"ocp_cache": ocp_cache, "fnuz_cache": fnuz_cache,
                "by_reader": gather(reader, fnuz_cache).double()}  # vLLM's ROCm reader
    except Exception as e:
        if without_fnuz(e):
            raise _proof.CannotProve("this GPU has no FNUZ FP8 (Triton: fp8e4b8 not supported): only an AMD GPU "
                                     "(or --device cpu) can run the gfx942 reader") from None
        raise


def judge(observed, args):
    shape = (4, KV_BLOCK, HEAD + 4)
    ocp_cache, fnuz_cache = (torch.from_numpy(observed[k]) for k in ("ocp_cache", "fnuz_cache"))
    by_reader = observed["by_reader"]
    if ocp_cache.shape != shape or fnuz_cache.shape != shape or ocp_cache.dtype != torch.uint8 or \
            fnuz_cache.dtype != torch.uint8 or by_reader.shape != (TOKENS // RATIO, HEAD) or \
            by_reader.dtype != np.float64:
        raise ValueError("the caches or the keys read are not of the shapes the proof's run gives")
    reference = ocp_keys(ocp_cache)  # what OCP hardware reads
    if not np.isfinite(reference).all():
        raise _proof.CannotProve("the OCP write does not read back finite keys: the writer changed its contract")
    if np.count_nonzero(reference) < reference.size // 2:  # normalized random keys: an empty write proves nothing
        raise _proof.CannotProve("the OCP write reads back mostly zero keys: the writer wrote no keys the proof can "
                                 "compare")
    by_layout = fnuz_keys(fnuz_cache)  # the tiled FNUZ layout, decoded here
    errors = {name: float(np.nan_to_num(np.abs(seen - reference), nan=np.inf).max())
              for name, seen in (("vLLM's ROCm reader", by_reader), ("the tiled FNUZ layout", by_layout))}
    wrong = [f"{name} reads back other keys (max error {error:g})" for name, error in errors.items() if error != 0]
    return _proof.report(not wrong, "gfx942 reads back exactly the keys OCP hardware reads, by vLLM's reader and by "
                                    "the layout's own decoding" if not wrong else
                         "; ".join(wrong) + f" on keys up to {float(np.abs(reference).max()):g}",
                         ocp_bytes_sha256=hashlib.sha256(ocp_cache.numpy().tobytes()).hexdigest(),
                         max_abs_error_reader=errors["vLLM's ROCm reader"],
                         max_abs_error_layout=errors["the tiled FNUZ layout"])


if __name__ == "__main__":
    _proof.main(observe, judge)
