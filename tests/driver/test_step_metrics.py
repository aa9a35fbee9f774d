"""The reduction of the trainer ranks' StepStats into the logged metrics (training/stats.py)."""

import math

import pytest

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


def test_the_step_line_shows_k_of_n_and_an_eta():
    """Issue 38, item 8: a newcomer sees how far the run is and how long the rest takes."""
    from megatron_dapo.driver.metrics import summary_line

    m = {
        "step": 3,
        "acc_mean": 0.5,
        "reward_mean": 0.0,
        "kept_group_ratio": 1.0,
        "num_gen_batches": 1,
        "response_length_mean": 10.0,
        "weight_sync_probe_diff": None,
        "time_step": 12.0,
        "time_generate": 8.0,
        "time_train": 3.0,
        "time_sync": 0.5,
    }
    line = summary_line(m, total=20, eta_s=17 * 12.0)
    assert line.startswith("[step 3/20] ") and line.endswith(" eta 3m24s")
    assert summary_line(m, total=20, eta_s=2 * 3600 + 5 * 60).endswith(" eta 2h05m")
    assert summary_line(m).startswith("[step 3] ") and " eta " not in summary_line(m)


def test_the_importance_weights_ess_is_reduced_from_their_sums_over_ranks_and_steps():
    """is_ess_frac = mean(w)^2 / mean(w^2) over every rank's loss tokens: weights 1, 2 on one DP
    rank and 3 on the other give algo.staleness.ess_fraction of [1, 2, 3]."""
    import torch

    from megatron_dapo.algo.staleness import ess_fraction

    def weighted(ws):
        return StepStats(
            loss=LossStats(
                is_weight_mean=(float(sum(ws)), float(len(ws))),
                is_weight_sq_mean=(float(sum(w * w for w in ws)), float(len(ws))),
            ),
            grad_norm=1.0,
            update_successful=True,
            lr=1e-5,
        )

    m = reduce_step_stats([[weighted([1.0, 2.0])], [weighted([3.0])]], {0: 0, 1: 1})
    want = float(ess_fraction(torch.tensor([[1.0, 2.0, 3.0]]), torch.ones(1, 3)))
    assert m["is_ess_frac"] == pytest.approx(want) and m["is_weight_mean"] == 2.0
    assert reduce_step_stats([[_out(1.0, 1, 1.0)]], {0: 0})["is_ess_frac"] == 1.0  # no weights reported


def test_the_staleness_histogram_counts_each_sample_by_its_oldest_token():
    from types import SimpleNamespace

    from megatron_dapo.driver.metrics import sample_staleness

    def s(*versions):
        return SimpleNamespace(token_versions=list(versions))

    m = sample_staleness(12, [s(12, 12), s(10, 11), s(11), s(11, 12), s(2, 12), s()])
    assert m["sample_staleness_max"] == 10 and m["sample_staleness_mean"] == (0 + 2 + 1 + 1 + 10) / 5
    hist = {k: v for k, v in m.items() if k.startswith("staleness_lag")}
    assert hist == {
        "staleness_lag0_samples": 1,
        "staleness_lag1_samples": 2,
        "staleness_lag2_samples": 1,
        "staleness_lag8_or_more_samples": 1,
    }
    assert sample_staleness(3, [s(), SimpleNamespace(token_versions=None)]) == {}  # no versions: nothing logged
