"""compute_group_advantages: hand-computed values and properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.algo import compute_group_advantages

SETTINGS = settings(max_examples=60, deadline=None)


def test_hand_computed_group_of_three_unbiased_std():
    # group [3, 1, 2]: mean 2, deviations [1, -1, 0], unbiased var (1 + 1 + 0) / (3 - 1) = 1
    adv = compute_group_advantages(torch.tensor([3.0, 1.0, 2.0]), group_size=3, eps=0.0)
    assert adv.tolist() == [1.0, -1.0, 0.0]


def test_hand_computed_two_groups_with_eps():
    # group [1, -1]: mean 0, unbiased std sqrt((1 + 1) / 1) = 1.41421356; A = 1 / (1.41421356 + 1e-6)
    # group [1, 1, -1, -1] would be another call; here the second group [-1, -1] is uniform -> 0
    adv = compute_group_advantages(torch.tensor([1.0, -1.0, -1.0, -1.0]), group_size=2)
    expected = [0.70710643, -0.70710643, 0.0, 0.0]  # 1 / 1.41421456 = 0.7071064
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert adv[2].item() == 0.0 and adv[3].item() == 0.0


def test_hand_computed_group_of_four():
    # [1, 1, -1, -1]: mean 0, unbiased var 4/3, std 1.15470054 -> A = +-0.8660254
    adv = compute_group_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0]), group_size=4, eps=0.0)
    assert adv.tolist() == pytest.approx([0.8660254, 0.8660254, -0.8660254, -0.8660254], abs=1e-6)


def test_mean_centring_only():
    # [0.5, -1.5]: mean -0.5 -> [1, -1]; [2, 2]: 0
    adv = compute_group_advantages(torch.tensor([0.5, -1.5, 2.0, 2.0]), group_size=2, normalize_std=False)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]


def test_group_size_one_gives_zero():
    adv = compute_group_advantages(torch.tensor([1.0, -1.0, 0.3]), group_size=1)
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_dtype_and_int_input_and_no_grad():
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    adv = compute_group_advantages(r, 2)
    assert not adv.requires_grad and adv.dtype == torch.float32
    adv_int = compute_group_advantages(torch.tensor([1, 0, 1, 1]), 2, eps=0.0)
    assert adv_int.dtype == torch.float32
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5) = 0.70710678 -> +-0.70710678
    assert adv_int.tolist() == pytest.approx([0.70710678, -0.70710678, 0.0, 0.0], abs=1e-6)
    assert compute_group_advantages([1.0, 0.0], 2, eps=0.0).dtype == torch.float32
    assert compute_group_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), 2).dtype == torch.float64


@SETTINGS
@given(
    values=st.lists(
        st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False), min_size=1, max_size=6
    ),
    group_size=st.integers(1, 8),
    normalize=st.booleans(),
)
def test_uniform_groups_exactly_zero(values, group_size, normalize):
    rewards = torch.tensor([v for v in values for _ in range(group_size)], dtype=torch.float32)
    adv = compute_group_advantages(rewards, group_size, normalize_std=normalize)
    assert torch.equal(adv, torch.zeros_like(adv))


@SETTINGS
@given(
    groups=st.lists(
        st.lists(st.sampled_from([-1.0, 1.0, -1.5, 0.5, 0.0, 0.25]), min_size=2, max_size=8).filter(
            lambda g: len(set(g)) > 1
        ),
        min_size=1,
        max_size=4,
    )
)
def test_mixed_groups_zero_mean_unit_std(groups):
    g = min(len(x) for x in groups)
    rewards = torch.tensor([v for grp in groups for v in grp[:g]], dtype=torch.float64)
    rows = rewards.view(-1, g)
    adv = compute_group_advantages(rewards, g, eps=0.0).view(-1, g)
    for row, a in zip(rows, adv):
        if len(set(row.tolist())) == 1:
            assert torch.equal(a, torch.zeros_like(a))
            continue
        assert abs(a.sum().item()) < 1e-9
        assert a.std(unbiased=True).item() == pytest.approx(1.0, abs=1e-9)
        # ranking preserved
        order = torch.argsort(row)
        assert torch.all(a[order][1:] >= a[order][:-1])


def test_matches_formula_with_loops():
    torch.manual_seed(0)
    rewards = torch.randn(12)
    g = 4
    adv = compute_group_advantages(rewards, g, eps=1e-6)
    for k in range(3):
        grp = [rewards[k * g + j].item() for j in range(g)]
        mean = sum(grp) / g
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (g - 1))
        for j in range(g):
            assert adv[k * g + j].item() == pytest.approx((grp[j] - mean) / (std + 1e-6), abs=1e-5)
