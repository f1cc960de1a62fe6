"""bakery_kernels.top_k_top_p on the CPU: the PyTorch fallback equals the row-by-row reference bit for
bit, and both give hand-computed masks on tiny rows. No Docker, no GPU (the kernel's own check
against the same reference is tests/gpu/test_topk_sampler_gpu.py)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
INF = float("inf")
NAN = float("nan")


@pytest.fixture(scope="module")
def glue():
    spec = importlib.util.spec_from_file_location("bakery_kernels_cpu", ROOT / "hip" / "bakery_kernels" / "__init__.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def special_logits(rows: int, n: int, seed: int) -> torch.Tensor:
    """Random rows, plus rows of ties, NaN, +-inf and -0, some all -inf / all NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g) * 3
    x[1::4] = torch.randint(-2, 3, (x[1::4].shape[0], n), generator=g).float()  # heavy ties
    for row, value in ((2, NAN), (3, INF), (5, -INF), (6, -0.0)):
        if row < rows:
            x[row, torch.randint(0, n, (max(1, n // 7),), generator=g)] = value
    if rows > 7:
        x[7] = -INF
    if rows > 8:
        x[8] = NAN
    if rows > 9:
        x[9, :3] = INF
    return x


def per_row_k_p(rows: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    choices = torch.tensor([1, 2, 5, 20, 50, n, n + 7, 0, -3])
    k = choices[torch.randint(0, len(choices), (rows,), generator=g)].to(torch.int32)
    p = torch.tensor([0.9, 0.95, 1.0, 0.5, 0.0, 0.3, 1e-8, 0.999, NAN])[torch.randint(0, 9, (rows,), generator=g)]
    return k, p


def planted_boundary_ties(rows: int, n: int, k: int, seed: int) -> torch.Tensor:
    """The k-th and (k+1)-th best are equal (and equal to a few more): the lower indices must win."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=g)
    top = torch.sort(x, dim=-1, descending=True).values
    for r in range(rows):
        tie = top[r, k - 1].item()
        idx = torch.randperm(n, generator=g)[:4]
        x[r, idx] = tie
    return x


CASES = [
    ("random, per-row k and p", lambda: special_logits(12, 300, 1), lambda x: per_row_k_p(12, 300, 2)),
    ("k only", lambda: special_logits(12, 257, 3), lambda x: (per_row_k_p(12, 257, 4)[0], None)),
    ("p only", lambda: special_logits(12, 257, 5), lambda x: (None, per_row_k_p(12, 257, 6)[1])),
    ("k = 1", lambda: special_logits(10, 64, 7), lambda x: (torch.ones(10, dtype=torch.int64), None)),
    ("k = V, p = 1", lambda: special_logits(10, 64, 8), lambda x: (torch.full((10,), 64), torch.ones(10))),
    ("serving: p = 0.95, no k", lambda: torch.randn(4, 4000) * 4, lambda x: (None, torch.full((4,), 0.95))),
    ("planted ties at k", lambda: planted_boundary_ties(6, 500, 20, 9),
     lambda x: (torch.full((6,), 20, dtype=torch.int32), torch.tensor([1.0, 0.9, 0.5, 0.99, 1.0, 0.1]))),
]


@pytest.mark.parametrize("name, make, args", CASES, ids=[c[0] for c in CASES])
def test_fallback_equals_the_reference(glue, name, make, args):
    torch.manual_seed(0)
    x = make()
    k, p = args(x)
    want = glue.top_k_top_p_reference(x, k, p)
    got = glue.top_k_top_p(x.clone(), k, p)  # no extension here: the PyTorch path
    assert glue.HAVE_EXTENSION is False
    assert torch.equal(bits(got), bits(want)), f"{name}: {(bits(got) != bits(want)).sum().item()} elements differ"
    assert not torch.isnan(got).any()


def test_in_place_and_returns_logits(glue):
    x = torch.tensor([[1.0, 2.0, 3.0]])
    out = glue.top_k_top_p(x, torch.tensor([1]), None)
    assert out is x and x.tolist() == [[-INF, -INF, 3.0]]
    assert glue.top_k_top_p(x, None, None) is x


# -- hand-computed masks, independent of the reference ----------------------------------------------

def mask(glue, row, k=None, p=None):
    """Both implementations on one row; they must agree, and the kept positions are returned."""
    x = torch.tensor([row], dtype=torch.float32)
    kt = None if k is None else torch.tensor([k], dtype=torch.int32)
    pt = None if p is None else torch.tensor([p], dtype=torch.float32)
    ref = glue.top_k_top_p_reference(x, kt, pt)
    fast = glue.top_k_top_p(x.clone(), kt, pt)
    assert torch.equal(bits(ref), bits(fast))
    return [i for i, v in enumerate(fast[0].tolist()) if v != -INF]


def test_ties_at_the_k_boundary_go_to_the_lower_index(glue):
    assert mask(glue, [1.0, 3.0, 3.0, 2.0, 3.0], k=2) == [1, 2]
    assert mask(glue, [1.0, 3.0, 3.0, 2.0, 3.0], k=4) == [1, 2, 3, 4]
    assert mask(glue, [0.0, 0.0, 0.0], k=1) == [0]


def test_k_is_clamped_to_1_and_v(glue):
    assert mask(glue, [1.0, 5.0, 2.0], k=0) == [1]
    assert mask(glue, [1.0, 5.0, 2.0], k=-4) == [1]
    assert mask(glue, [1.0, 5.0, 2.0], k=99) == [0, 1, 2]


def test_nan_rows_and_infinities(glue):
    assert mask(glue, [NAN, 1.0, NAN, -INF], k=4) == [1]  # nothing cut, but NaN -> -inf
    assert mask(glue, [NAN, 1.0, NAN, -INF], k=2) == [1]  # the NaN at 0 is the 2nd best: -inf anyway
    assert mask(glue, [NAN, NAN, NAN], k=1, p=0.5) == []
    assert mask(glue, [-INF, NAN, 2.0, INF], k=1) == [3]
    # NaN ranks with -inf, not above it: the second survivor is the finite 2.0
    assert mask(glue, [NAN, -INF, 2.0, INF], k=2) == [2, 3]


def test_negative_zero_ties_with_zero_and_keeps_its_sign(glue):
    x = torch.tensor([[-0.0, 0.0, -1.0]])
    out = glue.top_k_top_p(x, torch.tensor([1]), None)
    assert out[0, 0].item() == 0.0 and math.copysign(1.0, out[0, 0].item()) == -1.0
    assert out[0, 1].item() == -INF


def test_p_boundary_with_equal_weights(glue):
    # four equal logits, weights 1 each (2^32 units), W = 4: position j is kept iff j < 4p
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=0.5) == [0, 1]  # j = 2: 2 < 2 is false
    above_half = float(torch.nextafter(torch.tensor(0.5), torch.tensor(1.0)))
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=above_half) == [0, 1, 2]
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=0.25) == [0]
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=0.0) == [0]  # position 0 always
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=1.0) == [0, 1, 2, 3]
    assert mask(glue, [0.0, 0.0, 0.0, 0.0], p=NAN) == [0, 1, 2, 3]  # NaN < 1 is false: no top-p


def test_p_with_unequal_weights(glue):
    # weights 1 and 1/3 (W = 4/3): the second is kept iff 1 < p * 4/3, i.e. p > 0.75
    row = [0.0, -math.log(3.0)]
    assert mask(glue, row, p=0.7) == [0]
    assert mask(glue, row, p=0.8) == [0, 1]
    # x_max - 30 weighs 0: never kept by top-p, even with p just below 1
    assert mask(glue, [5.0, -25.0], p=0.9999) == [0]


def test_plus_inf_survivors_weigh_one_each(glue):
    assert mask(glue, [INF, 1.0, INF, INF], p=0.5) == [0, 2]  # W = 3: j kept iff j < 1.5
    assert mask(glue, [INF, 1.0, INF, INF], p=0.9) == [0, 2, 3]
    assert mask(glue, [INF, 1.0, INF, INF], k=2, p=0.6) == [0, 2]  # W = 2: j < 1.2


def test_top_k_then_top_p(glue):
    row = [5.0, 4.0, 3.0, 2.0, 1.0]
    assert mask(glue, row, k=3) == [0, 1, 2]
    assert mask(glue, row, k=3, p=0.0) == [0]
    # survivors 5, 4, 3: weights 1, e^-1, e^-2 (W = 1.5032); the third is kept iff 1.3679 < 1.5032 p
    assert mask(glue, row, k=3, p=0.90) == [0, 1]
    assert mask(glue, row, k=3, p=0.92) == [0, 1, 2]


def test_weights_are_exp_to_2e_5_and_monotone(glue):
    v = torch.linspace(-23.5, 0.0, 200001)
    q = glue.topp_weights(v, torch.tensor(0.0))
    assert torch.all(q[1:] >= q[:-1]) and q[-1].item() == 1 << 32
    exact = torch.exp(v.double()) * 2.0 ** 32
    live = exact > 1e5
    assert ((q[live].double() - exact[live]).abs() / exact[live]).max().item() < 2e-5
    assert q[v < -23.0].eq(0).all()
