"""Advantage estimators: the registry, hand-computed values of each estimator, the driver's dispatch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.algo import (
    ADVANTAGE_ESTIMATORS,
    AlgorithmConfig,
    compute_advantages,
    group_mean_advantages,
    group_norm_advantages,
    reinforce_pp_baseline_advantages,
)
from megatron_dapo.algo.registry import Registry
from megatron_dapo.driver.batch import Group, Sample, assign_advantages

SETTINGS = settings(max_examples=60, deadline=None)


def test_registry_names_are_the_flag_choices():
    assert ADVANTAGE_ESTIMATORS.names() == ("group-norm", "group-mean", "reinforce-pp-baseline")
    field = {f.name: f for f in AlgorithmConfig.__dataclass_fields__.values()}["advantage_estimator"]
    assert tuple(field.metadata["choices"]) == ADVANTAGE_ESTIMATORS.names()
    assert AlgorithmConfig().advantage_estimator == "group-norm"  # the default is the GRPO/DAPO one


def test_registry_rejects_duplicates_and_names_unknown():
    reg = Registry("thing", flag="--thing")
    reg.register("a", 1)
    with pytest.raises(ValueError, match="'a' is registered twice"):
        reg.register("a", 2)
    with pytest.raises(ValueError, match=r"--thing: unknown thing 'b'; one of a"):
        reg.get("b")
    with pytest.raises(
        ValueError, match=r"--advantage-estimator: unknown advantage estimator 'gae'; one of group-norm"
    ):
        compute_advantages("gae", torch.tensor([1.0, 0.0]), 2)


# Two groups of G = 3: [3, 1, 2] (mean 2, deviations [1, -1, 0]) and [0, 0, 3] (mean 1,
# deviations [-1, -1, 2]).
REWARDS = torch.tensor([3.0, 1.0, 2.0, 0.0, 0.0, 3.0])


def test_group_norm_hand_computed():
    # group stds (unbiased): sqrt((1 + 1 + 0) / 2) = 1 and sqrt((1 + 1 + 4) / 2) = sqrt(3) = 1.7320508
    adv = group_norm_advantages(REWARDS, 3, eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, -0.5773503, -0.5773503, 1.1547005], abs=1e-6)


def test_group_mean_hand_computed():
    adv = group_mean_advantages(REWARDS, 3)
    assert adv.tolist() == [1.0, -1.0, 0.0, -1.0, -1.0, 2.0]  # no division, eps unused


def test_reinforce_pp_baseline_hand_computed():
    # centred [1, -1, 0, -1, -1, 2]: batch mean 0, unbiased batch var (1+1+0+1+1+4) / 5 = 1.6,
    # std 1.2649111 -> [0.7905694, -0.7905694, 0, -0.7905694, -0.7905694, 1.5811388]
    adv = reinforce_pp_baseline_advantages(REWARDS, 3, eps=0.0)
    assert adv.tolist() == pytest.approx([0.7905694, -0.7905694, 0.0, -0.7905694, -0.7905694, 1.5811388], abs=1e-6)
    # the same deviations in both groups get the same advantage (one batch scale), unlike group-norm
    assert adv[1].item() == pytest.approx(adv[3].item(), abs=1e-12)


def test_reinforce_pp_baseline_uniform_group_exactly_zero():
    # [1, -1] -> centred [1, -1]; [1, 1] uniform -> 0. Batch [1, -1, 0, 0]: var (1 + 1) / 3, std 0.8164966
    adv = reinforce_pp_baseline_advantages(torch.tensor([1.0, -1.0, 1.0, 1.0]), 2, eps=0.0)
    assert adv.tolist() == pytest.approx([1.2247449, -1.2247449, 0.0, 0.0], abs=1e-6)
    assert adv[2].item() == 0.0 and adv[3].item() == 0.0
    assert torch.equal(reinforce_pp_baseline_advantages(torch.tensor([1.0, 1.0, -1.0, -1.0]), 2), torch.zeros(4))
    assert torch.equal(reinforce_pp_baseline_advantages(torch.tensor([0.3, -2.0]), 1), torch.zeros(2))


def test_eps_is_added_to_the_batch_std():
    adv = reinforce_pp_baseline_advantages(torch.tensor([1.0, -1.0, 1.0, 1.0]), 2, eps=0.5)
    assert adv[0].item() == pytest.approx(1.0 / (0.8164966 + 0.5), abs=1e-6)


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_estimator_checks_its_inputs(name):
    with pytest.raises(ValueError, match="group_size"):
        compute_advantages(name, torch.zeros(6), 4)
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(name, torch.zeros(0), 2)
    with pytest.raises(ValueError, match="eps"):
        compute_advantages(name, torch.zeros(4), 2, eps=-1.0)


@SETTINGS
@given(
    values=st.lists(st.sampled_from([-1.0, 1.0, -1.5, 0.5, 0.0, 0.25]), min_size=2, max_size=24),
    g=st.integers(1, 4),
    name=st.sampled_from(ADVANTAGE_ESTIMATORS.names()),
)
def test_every_estimator_is_shift_invariant_and_keeps_order_within_a_group(values, g, name):
    n = len(values) // g * g
    if n == 0:
        return
    r = torch.tensor(values[:n], dtype=torch.float64)
    adv = compute_advantages(name, r, g, eps=0.0)
    shifted = compute_advantages(name, r + 3.0, g, eps=0.0)
    assert torch.allclose(adv, shifted, atol=1e-9)  # a baseline removes any constant
    for row, a in zip(r.view(-1, g), adv.view(-1, g)):
        if len(set(row.tolist())) == 1:
            assert torch.equal(a, torch.zeros_like(a))
        order = torch.argsort(row)
        assert torch.all(a[order][1:] >= a[order][:-1] - 1e-12)


def _groups(rewards, g):
    samples = [
        Sample(
            prompt_index=i // g,
            prompt_ids=[1],
            response_ids=[2],
            engine_logprobs=[-0.1],
            finish_reason="stop",
            ground_truth="x",
            reward=float(r),
        )
        for i, r in enumerate(rewards)
    ]
    return [Group(k, samples[k * g : (k + 1) * g]) for k in range(len(samples) // g)]


@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_driver_dispatches_through_the_registry(name):
    algo = AlgorithmConfig(advantage_estimator=name, adv_eps=0.0)
    out = assign_advantages(_groups(REWARDS.tolist(), 3), algo)
    assert [s.advantage for s in out] == compute_advantages(name, REWARDS.double(), 3, eps=0.0).tolist()


def test_a_registered_estimator_is_selectable_and_called(monkeypatch):
    calls = []

    def constant(rewards, group_size, eps):
        calls.append((group_size, eps))
        return torch.full_like(rewards, 0.5)

    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._items, "constant", constant)
    algo = AlgorithmConfig(advantage_estimator="constant", adv_eps=0.25).validate()
    out = assign_advantages(_groups([1.0, 0.0, 1.0, 0.0], 2), algo)
    assert [s.advantage for s in out] == [0.5] * 4 and calls == [(2, 0.25)]


def test_unknown_estimator_refused_by_validation():
    with pytest.raises(
        ValueError, match=r"--advantage-estimator must be one of group-norm, group-mean, reinforce-pp-baseline"
    ):
        AlgorithmConfig(advantage_estimator="gae").validate()
