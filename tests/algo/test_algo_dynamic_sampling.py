"""dynamic_sampling_mask: groups with mixed correctness only, on raw acc."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.algo import compute_group_advantages, dynamic_sampling_mask, overlong_penalty


def test_hand_computed():
    # groups of 2: [1,1] all correct, [0,0] all wrong, [1,0] and [0,1] mixed
    res = dynamic_sampling_mask(torch.tensor([1, 1, 0, 0, 1, 0, 0, 1]), group_size=2)
    assert res.keep_mask.tolist() == [False, False, False, False, True, True, True, True]
    assert (res.num_kept, res.num_all_correct, res.num_all_wrong) == (2, 1, 1)
    keep, kept, all_correct, all_wrong = res  # unpacks as a tuple
    assert keep.dtype == torch.bool and kept == 2


def test_plus_minus_one_and_bool_acc():
    res = dynamic_sampling_mask(torch.tensor([1.0, -1.0, -1.0, -1.0, -1.0, 1.0]), group_size=3)
    assert res.keep_mask.tolist() == [True] * 3 + [True] * 3 and res.num_kept == 2
    res = dynamic_sampling_mask([True, True, False, True], group_size=2)
    assert res.keep_mask.tolist() == [False, False, True, True]
    assert (res.num_kept, res.num_all_correct, res.num_all_wrong) == (1, 1, 0)


def test_group_size_one_keeps_nothing():
    res = dynamic_sampling_mask(torch.tensor([1, 0, 1]), 1)
    assert res.keep_mask.tolist() == [False] * 3 and (res.num_kept, res.num_all_correct, res.num_all_wrong) == (0, 2, 1)


def test_other_metric_std_mode():
    # all correct, but the first group's scores differ (length penalty): kept only in metric mode
    acc = torch.tensor([1, 1, 1, 1])
    score = torch.tensor([0.5, 0.3, 1.0, 1.0])
    assert dynamic_sampling_mask(acc, 2).num_kept == 0
    res = dynamic_sampling_mask(acc, 2, metric=score)
    assert res.keep_mask.tolist() == [True, True, False, False]
    assert (res.num_kept, res.num_all_correct, res.num_all_wrong) == (1, 2, 0)


def test_filters_on_acc_not_on_shaped_score():
    """The peers' bug: an all-wrong group whose shaped scores differ only by the length
    penalty must still be dropped under the acc rule."""
    acc = torch.tensor([0, 0, 1, 0])
    lengths = torch.tensor([20480, 100, 100, 100])
    score = torch.where(acc > 0, 1.0, -1.0) + overlong_penalty(lengths, 20480, 4096)
    assert score[:2].tolist() == [-2.0, -1.0]
    res = dynamic_sampling_mask(acc, 2)
    assert res.keep_mask.tolist() == [False, False, True, True]
    # on the shaped score the first group would have passed
    assert dynamic_sampling_mask(acc, 2, metric=score).keep_mask.tolist() == [True, True, True, True]


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=8))
def test_kept_groups_are_exactly_those_with_nonzero_advantages(groups):
    acc = torch.tensor([v for g in groups for v in g])
    res = dynamic_sampling_mask(acc, 4)
    adv = compute_group_advantages(acc.float(), 4)
    assert torch.equal(res.keep_mask, (adv != 0).view(-1, 4).any(dim=1).repeat_interleave(4))
    assert res.num_kept + res.num_all_correct + res.num_all_wrong == len(groups)
