"""overlong_penalty (Eq. 13) and overlong_filter_mask."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.algo import overlong_filter_mask, overlong_penalty

SETTINGS = settings(max_examples=60, deadline=None)


def test_hand_computed_small():
    # L_max 20, L_cache 5: ramp from 15 (0) to 20 (-1): 16 -> -1/5, 18 -> -3/5
    out = overlong_penalty(torch.tensor([0, 15, 16, 18, 20, 21, 100]), 20, 5)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.2, -0.6, -1.0, -1.0, -1.0])
    half = overlong_penalty([16, 18, 25], 20, 5, penalty_factor=0.5)
    assert half.tolist() == pytest.approx([-0.1, -0.3, -0.5])


def test_hand_computed_paper_lengths():
    # L_max 20480, L_cache 4096: 16384 -> 0, 17408 -> -1024/4096, 18432 -> -0.5, 20480 -> -1
    out = overlong_penalty(torch.tensor([100, 16384, 17408, 18432, 20480]), 20480, 4096)
    assert out.tolist() == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0])
    assert out.dtype == torch.float32


def test_zero_buffer_is_a_hard_step():
    assert overlong_penalty([10, 11], 10, 0).tolist() == [0.0, -1.0]


def test_float_lengths_and_float64():
    out = overlong_penalty(torch.tensor([15.5], dtype=torch.float64), 20, 5)
    assert out.dtype == torch.float64 and out.item() == pytest.approx(-0.1)


@SETTINGS
@given(l_max=st.integers(1, 50000), frac=st.floats(0.0, 1.0), factor=st.floats(0.0, 5.0), delta=st.floats(1e-6, 1e-2))
def test_continuous_at_ramp_start_and_at_l_max(l_max, frac, factor, delta):
    l_cache = max(1, int(l_max * frac))
    start = l_max - l_cache
    at = overlong_penalty(
        torch.tensor([start, start + delta, l_max - delta, l_max, l_max + delta], dtype=torch.float64),
        l_max,
        l_cache,
        factor,
    )
    assert at[0].item() == 0.0
    assert abs(at[1].item()) <= delta / l_cache * factor * (1 + 1e-6) + 1e-9
    assert abs(at[2].item() - at[3].item()) <= delta / l_cache * factor * (1 + 1e-6) + 1e-9
    assert at[3].item() == pytest.approx(-factor) and at[4].item() == pytest.approx(-factor)


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 30000), min_size=1, max_size=30),
    l_max=st.integers(1, 25000),
    frac=st.floats(0.0, 1.0),
    factor=st.floats(0.0, 3.0),
)
def test_monotone_and_bounded(lengths, l_max, frac, factor):
    l_cache = int(l_max * frac)
    ys = sorted(lengths)
    out = overlong_penalty(torch.tensor(ys), l_max, l_cache, factor)
    assert torch.all(out[1:] <= out[:-1] + 1e-7)
    assert torch.all(out <= 0) and torch.all(out >= -factor - 1e-6)


def test_filter_mask_from_flags_and_reasons():
    assert overlong_filter_mask(torch.tensor([True, False, True])).tolist() == [0.0, 1.0, 0.0]
    assert overlong_filter_mask([0, 1]).tolist() == [1.0, 0.0]
    reasons = ["stop", "length", {"type": "length", "length": 20480}, {"type": "stop", "matched": 151643}, "abort"]
    assert overlong_filter_mask(reasons).tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]


def test_filter_mask_applied_to_loss_mask():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    out = overlong_filter_mask(["stop", "length", "stop"], loss_mask=mask)
    assert out.tolist() == [[1, 1, 0], [0, 0, 0], [1, 0, 0]]
    assert out.dtype == mask.dtype
    out_bool = overlong_filter_mask(torch.tensor([1, 0, 0]), loss_mask=mask.bool())
    assert out_bool.dtype == torch.bool and out_bool.tolist() == [[False] * 3, [True] * 3, [True, False, False]]


def test_filter_mask_numpy_inputs():
    import numpy as np

    assert overlong_filter_mask([np.bool_(True), np.int64(0), "stop"]).tolist() == [0.0, 1.0, 1.0]
    assert overlong_filter_mask(np.array([True, False])).tolist() == [0.0, 1.0]
