"""The proofs load any vLLM release: on the newest release on PyPI (the oldest, 0.26.0, is the fixture
base, which tests/test_overlay_proofs.py proves), every required overlay's stock proof gives a
verdict, FIXED or BROKEN, never CANNOT-PROVE. The expected verdicts are bench/README.md's dated
table (bench/proofs_by_release.py, every release from 0.26.0 on): upstream fixed the CPU-KV fence
in 0.28.0 and keyed the draft's Gumbel noise apart in 0.29.0; the other three defects are still
there. A change here means upstream changed, or a proof stopped loading it.
And the loader's promises: a symbol or parameter the proof needs and the target lacks is
CANNOT-PROVE naming it; the interpreter's numpy Philox gives Triton's bits.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile

import pytest

from bakery.dev import fixture as fixture_mod
from bakery.inputs import overlays as overlays_mod
from bakery.proofs import runner as prove
from support import ROOT

pytest.importorskip("torch", reason="the overlay proofs need CPU torch (pip install -e '.[test]')")

SITE = "/usr/local/lib/python3.12/dist-packages/"
NEWEST = {"name": "vllm", "file": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
          "sha256": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"}
EXPECTED_ON_NEWEST = {
    "mxfp4-bitmatrix-padding-mask": prove.BROKEN,
    "cpu-kv-transfer-fence": prove.FIXED,
    "fnuz-indexer-cache-writer": prove.BROKEN,
    "exact-swiglu-clamp-kernel": prove.BROKEN,
    "independent-draft-gumbel": prove.FIXED,
    "deterministic-sampler-topk-topp": prove.BROKEN,
}


def required() -> dict:
    """The required overlays of vLLM files with a proof script (AITER's are tested against AITER's own
    releases in tests/test_aiter_offsets.py)."""
    return {o.id: o for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml")
            if o.baked and o.proof and o.proof.script and o.target.startswith(SITE + "vllm/")}


@pytest.fixture(scope="module")
def newest():
    """read(image path) -> bytes of the newest release's wheel, at the paths the ROCm image has them."""
    archive = zipfile.ZipFile(fixture_mod.wheel(NEWEST, lambda line: print(line, file=sys.stderr)))
    return lambda path: archive.read(path.removeprefix(SITE))


def test_every_required_overlay_is_checked_here():
    assert set(required()) == set(EXPECTED_ON_NEWEST)


@pytest.mark.parametrize("overlay_id", sorted(EXPECTED_ON_NEWEST))
@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_stock_proof_gives_a_verdict_on_the_newest_release(newest, overlay_id, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))  # proven now, not read from a cache
    o = required()[overlay_id]
    verdict = prove.run(o.proof, newest(o.target), {r: newest(r) for r in o.proof.reads})
    assert verdict.verdict == EXPECTED_ON_NEWEST[overlay_id], verdict.reason


def _gumbel_inputs(newest):
    o = required()["independent-draft-gumbel"]
    return o.proof, newest(o.target), {r: newest(r) for r in o.proof.reads}


REJECTION = SITE + "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py"


@pytest.mark.parametrize("edit, named", [
    ((b"def rejection_sample(", b"def rejection_sample_v2("), "rejection_sample is not in the target"),
    ((b"def rejection_sample(\n", b"def rejection_sample(\n    lane: int,\n"),
     "rejection_sample now takes lane"),
], ids=["symbol renamed", "parameter added"])
@pytest.mark.slow
def test_what_the_proof_needs_and_the_base_lacks_is_cannot_prove_naming_it(newest, edit, named, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path))
    spec, target, reads = _gumbel_inputs(newest)
    assert reads[REJECTION].count(edit[0]) == 1
    reads[REJECTION] = reads[REJECTION].replace(*edit)
    verdict = prove.run(spec, target, reads)
    assert verdict.verdict == prove.CANNOT and named in verdict.reason, verdict.reason


PHILOX_CHECK = r'''
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, sys.argv[1])
import numpy as np, torch, triton, triton.language as tl

@triton.jit
def draw(seeds, out_int, out_float, n, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    seed = tl.load(seeds + i)
    lanes = tl.arange(0, BLOCK)
    a, b, c, d = tl.randint4x(seed, lanes + i * 7919)
    tl.store(out_int + i * 4 * BLOCK + lanes, a)
    tl.store(out_int + i * 4 * BLOCK + BLOCK + lanes, b)
    tl.store(out_int + i * 4 * BLOCK + 2 * BLOCK + lanes, c)
    tl.store(out_int + i * 4 * BLOCK + 3 * BLOCK + lanes, d)
    tl.store(out_float + i * BLOCK + lanes, tl.rand(tl.randint(seed, i), lanes))

def run():
    seeds = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**62 + 12345, -1, -2**63, 987654321987], dtype=torch.int64)
    ints = torch.zeros(len(seeds) * 4 * 64, dtype=torch.int32)
    floats = torch.zeros(len(seeds) * 64)
    draw[(len(seeds),)](seeds, ints, floats, len(seeds), BLOCK=64)
    return ints.numpy().copy(), floats.numpy().copy()

triton_ints, triton_floats = run()
import _proof
_proof._interpreter_philox()
numpy_ints, numpy_floats = run()
assert (numpy_ints == triton_ints).all() and (numpy_floats.view(np.int32) == triton_floats.view(np.int32)).all()
assert len(set(triton_ints.tolist())) > 0.99 * triton_ints.size
print("same bits")
'''


@pytest.mark.slow
def test_the_interpreters_numpy_philox_gives_tritons_bits():
    """The proofs draw Gumbel noise through a numpy Philox under the interpreter (ten times fewer
    interpreter steps); it must give, bit for bit, what Triton's own Philox gives there."""
    done = subprocess.run([sys.executable, "-c", PHILOX_CHECK, str(ROOT / "overlays" / "proofs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same bits" in done.stdout, done.stdout + done.stderr
