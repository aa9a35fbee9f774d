"""Public API: ground-truth errors, result normalisation, reward-fn loading."""

from __future__ import annotations

import pytest

from megatron_dapo import reward
from megatron_dapo.reward import RewardInput, RewardResult, RewardRouter, compute_score, is_equivalent, load_reward_fn
from megatron_dapo.reward.api import as_reward_input
from megatron_dapo.reward.result import to_reward_result


def test_public_names():
    for name in (
        "is_equivalent",
        "compute_score",
        "RewardResult",
        "BatchScorer",
        "load_reward_fn",
        "RewardInput",
        "RewardRouter",
        "RemoteRewardModel",
    ):
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


def test_reward_fn_gets_the_whole_record_as_keywords():
    fn = load_reward_fn("reward_test_plugins:echo_record")
    r = fn("resp", "", prompt="the prompt", data_source="src", extra_info={"k": 1})
    assert r.pred == "resp||the prompt|src|{'k': 1}"


def test_router_picks_the_reward_by_data_source():
    router = RewardRouter("math", None, ["code=reward_test_plugins:exact", "rm=http://127.0.0.1:9/score", "gsm8k=dapo"])
    assert [router.key(s) for s in ("code", "rm", "gsm8k", "other", "")] == [
        "reward_test_plugins:exact",
        "http://127.0.0.1:9/score",
        "dapo",
        "math",
        "math",
    ]
    assert [router.needs_label(s) for s in ("code", "rm", "gsm8k", "other")] == [False, False, True, True]
    assert set(router.local_specs()) == {"reward_test_plugins:exact", "dapo", "math"}
    assert router.remote_specs() == {"http://127.0.0.1:9/score": "http://127.0.0.1:9/score"}
    # --reward-fn replaces the built-in checker as the default
    fn_router = RewardRouter("dapo", "reward_test_plugins:exact", {"gsm8k": "math"})
    assert (fn_router.key("x"), fn_router.needs_label("x"), fn_router.needs_label("gsm8k")) == (
        "reward_test_plugins:exact",
        False,
        True,
    )


@pytest.mark.parametrize(
    "entries,error,match",
    [
        (["no-equals"], ValueError, "DATA_SOURCE=SPEC"),
        (["=math"], ValueError, "DATA_SOURCE=SPEC"),
        (["a=math", "a=dapo"], ValueError, "'a' is given twice"),
        (["a=reward_test_plugins:missing"], AttributeError, "reward_test_plugins:missing"),
        (["a=http://"], ValueError, "URL"),
    ],
)
def test_router_errors_name_the_entry(entries, error, match):
    with pytest.raises(error, match=match):
        RewardRouter("dapo", None, entries)


def test_needs_label_from_a_run_config():
    from megatron_dapo.config import parse_args
    from megatron_dapo.reward import reward_needs_label

    cfg = parse_args(["--reward-source", "judge=http://127.0.0.1:9/rm", "--reward-mode", "math"])
    needs = reward_needs_label(cfg.reward)
    assert (needs("judge"), needs("aime")) == (False, True)


@pytest.mark.parametrize(
    "item,match",
    [
        (("r", None), "ground_truth must be a str"),
        (("r",), "RewardInput or a"),
        (RewardInput("r", "1", metadata=["x"]), "metadata must be a mapping"),
        (RewardInput("r", "1", data_source=3), "data_source must be a str"),
    ],
)
def test_bad_items_are_named(item, match):
    with pytest.raises(ValueError, match=match):
        as_reward_input(item, 0)
