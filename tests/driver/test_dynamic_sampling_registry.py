"""--dynamic-sampling-metric is a registry (algo/dynamic_sampling.DYNAMIC_SAMPLING_METRICS): one
registered function is a --help choice, passes validation, is listed in the docs' table and is what
the rollout manager filters with; no config, CLI or driver code names it."""

import pytest
import torch

from megatron_dapo.algo import AlgorithmConfig
from megatron_dapo.algo.dynamic_sampling import DYNAMIC_SAMPLING_METRICS
from megatron_dapo.config import build_parser
from megatron_dapo.config.registries import markdown
from megatron_dapo.driver.rollout_manager import RolloutStallError
from tests.driver.test_dynamic_sampling_metric import ALL_RIGHT, LENGTHS, ROUNDS
from tests.driver.test_rollout_manager import _mgr


def _choices():
    return {a.option_strings[0]: a.choices for a in build_parser()._actions if a.option_strings}


@pytest.fixture
def length_metric():
    seen = []

    @DYNAMIC_SAMPLING_METRICS.register("test-length")
    def length(samples):
        """Response length (test only): a group is kept iff its responses differ in length."""
        seen.append(len(samples))
        return torch.tensor([float(len(s.response_ids)) for s in samples], dtype=torch.float64)

    try:
        yield seen
    finally:
        DYNAMIC_SAMPLING_METRICS._items.pop("test-length")


def test_the_shipped_metrics_and_their_order():
    assert DYNAMIC_SAMPLING_METRICS.names() == ("acc", "score", "reward")
    assert _choices()["--dynamic-sampling-metric"] == ["acc", "score", "reward"]
    assert DYNAMIC_SAMPLING_METRICS.get("acc")([object()]) is None  # the DAPO rule: dynamic_sampling_mask on acc


def test_a_registered_metric_is_a_choice_validated_documented_and_used(length_metric):
    assert "test-length" in _choices()["--dynamic-sampling-metric"]
    AlgorithmConfig(max_response_length=16, overlong_buffer_length=16, dynamic_sampling_metric="test-length").validate()
    assert "| `--dynamic-sampling-metric` | `test-length` | Response length (test only)" in markdown()
    # every response right: acc drops every group (tests/driver/test_dynamic_sampling_metric.py), lengths differ
    mgr, _, cfg = _mgr(ALL_RIGHT, [*ROUNDS, "--dynamic-sampling-metric", "test-length"], LENGTHS)
    res = mgr.collect(1)
    assert len(res.groups) == 4 and res.num_all_correct == 4 and length_metric and set(length_metric) == {4}
    for g in res.groups:
        assert len({len(s.response_ids) for s in g.samples}) > 1


def test_an_unregistered_metric_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--dynamic-sampling-metric must be one of acc, score, reward"):
        AlgorithmConfig(dynamic_sampling_metric="test-length").validate()
    mgr, _, _ = _mgr(ALL_RIGHT, [*ROUNDS, "--dynamic-sampling-metric", "acc"], LENGTHS)
    with pytest.raises(RolloutStallError):
        mgr.collect(1)
