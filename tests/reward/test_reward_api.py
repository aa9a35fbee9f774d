"""Public API: ground-truth errors, result normalisation, reward-fn loading."""

from __future__ import annotations

import pytest

from megatron_dapo import reward
from megatron_dapo.reward import RewardResult, compute_score, is_equivalent, load_reward_fn
from megatron_dapo.reward.result import to_reward_result


def test_public_names():
    for name in ("is_equivalent", "compute_score", "RewardResult", "BatchScorer", "load_reward_fn"):
        assert hasattr(reward, name)


@pytest.mark.parametrize("mode", ["dapo", "math"])
@pytest.mark.parametrize("bad", [None, "", "  \n", 540, 5.0, ["540"], b"540"])
def test_bad_ground_truth_raises(mode, bad):
    with pytest.raises(ValueError, match="ground_truth"):
        compute_score("Answer: 540", bad, mode=mode)
    with pytest.raises(ValueError, match="ground_truth"):
        is_equivalent(bad, "540", mode=mode)


def test_bad_mode_and_response():
    with pytest.raises(ValueError, match="mode"):
        compute_score("Answer: 1", "1", mode="strict")
    with pytest.raises(TypeError, match="response"):
        compute_score(None, "1")
    assert is_equivalent("1", None) is False


def test_result_fields():
    r = compute_score("Answer: 7", "7")
    assert (r.score, r.acc, r.pred, r.reason) == (1.0, True, "7", "ok")
    with pytest.raises(ValueError, match="reason"):
        RewardResult(1.0, True, "", "great")


@pytest.mark.parametrize(
    "value,expected",
    [
        (1.0, (1.0, True, "ok")),
        (-1, (-1.0, False, "wrong")),
        (True, (1.0, True, "ok")),
        (False, (-1.0, False, "wrong")),
        ({"score": 0.5, "pred": "x"}, (0.5, True, "ok")),
        ({"score": 1.0, "acc": False}, (1.0, False, "wrong")),
        (RewardResult(0.0, False, "p", "no_answer"), (0.0, False, "no_answer")),
    ],
)
def test_reward_fn_results_are_normalised(value, expected):
    r = to_reward_result(value)
    assert (r.score, r.acc, r.reason) == expected


@pytest.mark.parametrize("value", ["1.0", None, {"acc": True}, float("nan")])
def test_bad_reward_fn_results(value):
    with pytest.raises((TypeError, ValueError)):
        to_reward_result(value)


def test_load_reward_fn():
    fn = load_reward_fn("reward_test_plugins:as_dict")
    r = fn("42", "42", data_source="x")
    assert isinstance(r, RewardResult) and (r.score, r.acc, r.pred) == (1.0, True, "42")
    assert load_reward_fn("reward_test_plugins:exact")("1", "2").reason == "wrong"
    assert load_reward_fn("reward_test_plugins:as_result")("1", "2").score == 0.5
    # Built-ins are plug-ins too.
    assert load_reward_fn("megatron_dapo.reward:compute_score")("Answer: 3", "3").acc


@pytest.mark.parametrize(
    "spec,error",
    [
        ("no_colon", ValueError),
        ("a:b:c", ValueError),
        (":fn", ValueError),
        ("no_such_module_xyz:fn", ImportError),
        ("reward_test_plugins:missing", AttributeError),
        ("reward_test_plugins:not_callable", TypeError),
    ],
)
def test_load_reward_fn_errors(spec, error):
    with pytest.raises(error):
        load_reward_fn(spec)
