"""AITER's paged-MQA-logits overlay (aiter-paged-mqa-logits-64bit-offsets) on AITER's own releases,
and its proof's reading of compiled IR against kernels written here from the defect's description.

The kernels are Gluon for CDNA3: they cannot run here, nor on the lent NVIDIA GPU. The proof
compiles them for gfx942 with the installed Triton (no GPU needed) and reads the IR's integer
arithmetic exactly (overlays/proofs/ttgir_offsets.py). The references below are small kernels
whose gathers are written each way the defect can be written or fixed; what each must be judged
follows from the description alone: an address past 2^31 bytes formed in 32 bits is wrong, one
formed in 64 bits is right, and a 32-bit one that cannot get there is right too.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from bakery.inputs import overlays as overlays_mod, patch as patch_mod
from bakery.proofs import runner as prove
from support import ROOT

pytest.importorskip("triton.experimental.gluon", reason="the proof compiles Gluon kernels: Triton 3.6 or later")

ID = "aiter-paged-mqa-logits-64bit-offsets"
RELEASES = {  # the target's bytes upstream (tests/fixture/aiter/README.md, overlays/README.md)
    "v0.1.19": "7059ef6954c5cfcb30115ad260091141980ed9b5e2c401d752b2f65fbc1cf3e9",
    "v0.1.19.post1 = 4db400a": "47e34fa39dd2e1fceac40d3bde82132e791b372744be4642f6a0c2a638334a9f",
    "v0.1.20": "7d74048ff024fa0ca9917e3c74db703ed0fa8368c5baa7e0bd962332c5506359",
}


def overlay():
    return next(o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml") if o.id == ID)


@pytest.mark.slow  # a few seconds a release: `invoke test --fast` skips it
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_each_upstream_release_is_broken_here_and_fixed_overlaid(release, tmp_path, monkeypatch):
    """Stock BROKEN on each release, 0.1.20 included (#4774 widened only the pipeline block sizes up
    to 128 take: at 256, 5 of the preshuffle kernel's 8 gathers and every other kernel's still
    wrap); the overlay, by the port its bytes choose, FIXED."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    o = overlay()
    assert o.proof is not None
    sha = RELEASES[release]
    stock = (ROOT / "overlays" / "stock" / sha).read_bytes()
    chosen = {base: data for base, _, data in o.ports}.get(sha, o.patch_bytes)  # as the build picks it: by bytes
    assert chosen is not None
    overlaid, _ = patch_mod.apply(patch_mod.parse(chosen, ID), stock)
    before, after = prove.run_batch(o.proof, [stock, overlaid], {})
    assert (before.verdict, after.verdict) == (prove.BROKEN, prove.FIXED), (before.reason, after.reason)
    wrapping = before.measured["gathers_that_wrap"]
    fixed_upstream = release == "v0.1.20"  # #4774: the first pipeline (block 64) only
    assert wrapping == {"kernel@1": "4 of 4", "kernel_preshuffle@256": "5 of 8" if fixed_upstream else "8 of 8",
                        "kernel_preshuffle@64": "0 of 8" if fixed_upstream else "8 of 8",
                        "kernel_preshuffle_varctx@256": "8 of 8", "kernel_preshuffle_varctx@64": "8 of 8"}, wrapping
    assert set(after.measured["gathers_that_wrap"].values()) == {"0 of 4", "0 of 8"}


KERNELS = '''
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def buffer_i32(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    gl.store(out + i, gl.amd.cdna3.buffer_load(ptr=KV, offsets=block * stride + i))


@gluon.jit
def pointer_i32(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    gl.store(out + i, gl.load(KV + (block * stride + i)))


@gluon.jit
def pointer_i64(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    gl.store(out + i, gl.load(KV + (block.to(gl.int64) * stride + i)))


@gluon.jit
def shifted(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    gl.store(out + i, gl.load(KV + ((block << 15) + i)))


@gluon.jit
def bitcast(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    words = KV.to(gl.pointer_type(gl.int32), bitcast=True)
    gl.store(out + i, gl.load(words + (block * stride + i)).to(gl.int8))


@gluon.jit
def buffer_i64_truncated(KV, stride, table, out):
    layout: gl.constexpr = gl.BlockedLayout([1], [64], [4], [0])
    i = gl.arange(0, 256, layout=layout)
    block = gl.load(table + i)
    gl.store(out + i, gl.amd.cdna3.buffer_load(ptr=KV, offsets=(block.to(gl.int64) * stride).to(gl.int32) + i))
'''

STRIDE = 33_792  # one block of 256 tokens of the indexer's rows, in bytes
# name: (wrong at a 20 GB pool, wrong at a pool of 2^31 - 1 bytes); None: what the reading does not
# model (a shift of a block id, a bitcast of the buffer's pointer), where it must give no verdict
EXPECTED = {"buffer_i32": (True, False), "pointer_i32": (True, False), "pointer_i64": (False, False),
            "buffer_i64_truncated": (True, False), "shifted": None, "bitcast": None}


@pytest.fixture(scope="module")
def reference_irs(tmp_path_factory):
    """{name: the TTGIR of each reference kernel, compiled for gfx942}."""
    import os

    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton"))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    path = tmp_path_factory.mktemp("kernels") / "reference_gathers.py"
    path.write_text(textwrap.dedent(KERNELS))
    spec = importlib.util.spec_from_file_location("reference_gathers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    signature = {"KV": "*i8", "stride": "i32", "table": "*i32", "out": "*i8"}
    return {name: triton.compile(GluonASTSource(fn=getattr(module, name), signature=signature, constexprs={}),
                                 target=GPUTarget("hip", "gfx942", 64),
                                 options={"num_warps": 4}).asm["ttgir"] for name in EXPECTED}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_ir_reading_judges_each_way_a_gather_can_be_written(reference_irs, name):
    sys.path.insert(0, str(ROOT / "overlays" / "proofs"))
    try:
        import ttgir_offsets  # type: ignore[import-not-found]  # beside the proofs, outside mypy's files
    finally:
        sys.path.pop(0)
    expected = EXPECTED[name]
    if expected is None:
        with pytest.raises(ttgir_offsets.Unmodelled, match="does not model"):
            ttgir_offsets.analyse(reference_irs[name], name, {"stride": (STRIDE, STRIDE)}, "table", 1000, ("KV",))
        return
    for pool, wrong in zip((20 * 10**9, 2**31 - 1), expected, strict=True):
        blocks = pool // STRIDE
        accesses = ttgir_offsets.analyse(reference_irs[name], name, {"stride": (STRIDE, STRIDE)}, "table", blocks,
                                         ("KV",))
        assert accesses, f"{name}: no gather of KV found"
        judged = any(a.wraps or (a.reach is not None and a.reach >= ttgir_offsets.BUFFER_REACH) for a in accesses)
        assert judged == wrong, (name, pool, accesses)


@pytest.mark.slow
def test_the_proof_reads_the_same_ttgir_a_whole_compile_gives(tmp_path):
    """The proof ends Triton's compile after TTGIR (the later stages were most of its time): the text
    it reads must be what a whole triton.compile keeps as asm["ttgir"], for each reference kernel."""
    import subprocess

    (tmp_path / "reference_gathers.py").write_text(textwrap.dedent(KERNELS))
    script = textwrap.dedent(f"""
        import importlib.util, os, sys
        sys.path.insert(0, {str(ROOT / "overlays" / "proofs")!r})
        import aiter_pa_mqa_logits_i64 as proof  # its import of _proof leaves Triton compiling (no interpreter)
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.experimental.gluon._runtime import GluonASTSource
        spec = importlib.util.spec_from_file_location("reference_gathers", {str(tmp_path / "reference_gathers.py")!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        target = GPUTarget("hip", "gfx942", 64)
        for name in {sorted(EXPECTED)!r}:
            source = GluonASTSource(fn=getattr(module, name), signature={{"KV": "*i8", "stride": "i32", "table": "*i32",
                                                                         "out": "*i8"}}, constexprs={{}})
            os.environ["TRITON_CACHE_DIR"] = {str(tmp_path)!r} + "/whole-" + name
            whole = triton.compile(source, target=target, options={{"num_warps": 4}})
            os.environ["TRITON_CACHE_DIR"] = {str(tmp_path)!r} + "/ttgir-" + name
            read = proof.ttgir(triton, source, target, {{"num_warps": 4}})
            assert "hsaco" in whole.asm and read == whole.asm["ttgir"] and "tt.func" in read, name
            print(name, "same")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [w for name in sorted(EXPECTED) for w in (name, "same")]
