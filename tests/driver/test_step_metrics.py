"""The reduction of the trainer ranks' StepStats into the logged metrics (training/stats.py)."""

import math

from megatron_dapo.training.stats import LossStats, StepStats, reduce_step_stats


def _out(s, c, norm, ok=True, imbalance=1.0, lr=1e-5, rmax=1.0):
    return StepStats(
        loss=LossStats(pg_loss=(s, c), ratio_max=rmax),
        grad_norm=norm,
        update_successful=ok,
        dp_token_imbalance=imbalance,
        lr=lr,
    )


def test_token_weighted_means_over_reporters_and_steps():
    # ranks 0 and 1 report for DP ranks 0 and 1; rank 2 (another PP stage) is ignored
    outs = [
        [_out(2.0, 4, 1.0, imbalance=1.2), _out(1.0, 1, 3.0, imbalance=1.5, lr=2e-5)],
        [_out(3.0, 5, 1.0, rmax=1.7), _out(0.0, 0, 3.0)],
        [_out(100.0, 1, 9.0)],
    ]
    m = reduce_step_stats(outs, {0: 0, 1: 1})
    assert m["pg_loss"] == (2.0 + 1.0 + 3.0) / (4 + 1 + 5)
    assert m["ratio_max"] == 1.7 and m["grad_norm"] == 2.0 and m["optimizer_steps"] == 2
    assert m["dp_token_imbalance"] == 1.5 and m["lr"] == 2e-5 and m["skipped_optimizer_steps"] == 0


def test_skipped_steps_and_non_finite_norms():
    outs = [[_out(1.0, 1, float("nan"), ok=False), _out(1.0, 1, 2.0)]]
    m = reduce_step_stats(outs, {0: 0})
    assert m["skipped_optimizer_steps"] == 1 and m["grad_norm"] == 2.0
    m = reduce_step_stats([[_out(1.0, 1, float("inf"), ok=False)]], {0: 0})
    assert math.isnan(m["grad_norm"])
