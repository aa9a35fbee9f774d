"""--dynamic-sampling-metric reaches the filter: the rollout manager filters on the named sample field."""

import pytest

from megatron_dapo.driver.rollout_manager import RolloutStallError
from tests.driver.test_rollout_manager import _mgr

ALL_RIGHT = lambda i, j: True  # noqa: E731
# 3, 5, 7, 9 tokens with L_max 8, L_cache 4: overlong penalties 0, -0.25, -0.75, -1 differ in every group
LENGTHS = lambda i, j: 3 + 2 * j  # noqa: E731
ROUNDS = ["--max-num-gen-batches", "2", "--over-sampling-batch-size", "4"]


def test_reward_metric_keeps_groups_whose_shaped_reward_varies():
    mgr, _, cfg = _mgr(ALL_RIGHT, [*ROUNDS, "--dynamic-sampling-metric", "reward"], LENGTHS)
    assert cfg.algo.dynamic_sampling_metric == "reward"
    res = mgr.collect(1)
    assert len(res.groups) == 4 and res.num_gen_batches == 1
    assert res.num_all_correct == 4  # the counts still come from acc
    for g in res.groups:
        assert all(g.accs) and len({s.reward for s in g.samples}) > 1


@pytest.mark.parametrize("metric", ["acc", "score"])
def test_acc_and_score_drop_uniformly_correct_groups(metric):
    # the same rollouts: correctness and the verifier's score are the same within every group
    mgr, _, _ = _mgr(ALL_RIGHT, [*ROUNDS, "--dynamic-sampling-metric", metric], LENGTHS)
    with pytest.raises(RolloutStallError, match="only 0 of --rollout-batch-size 4"):
        mgr.collect(1)
