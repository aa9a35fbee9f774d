"""algo/staleness.py (issue 40): versions and the admission rule, ESS and ratio tails, A-3PO's
interpolated proximal policy, the decoupled loss against a hand computation, and the
staleness controller's decisions on synthetic ESS traces."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_dapo.algo import AlgorithmConfig
from megatron_dapo.algo.policy_losses import POLICY_LOSSES
from megatron_dapo.algo.staleness import (
    RATIO_TAIL,
    ControllerSettings,
    StalenessController,
    admit,
    ess_fraction,
    ess_step_scale,
    interpolated_proximal_logprobs,
    interpolation_alpha,
    ratio_tail,
    staleness,
    staleness_histogram,
)
from megatron_dapo.algo.tis import loss_token_weights

# ------------------------------------------------------------------ versions, admission


def test_staleness_and_the_admission_rule():
    assert staleness(7, 7) == 0 and staleness(7, 4) == 3
    with pytest.raises(ValueError, match="newer than the trainer"):
        staleness(3, 4)
    assert admit(5, 7, 2) and admit(7, 7, 0)
    assert not admit(4, 7, 2)  # 3 versions behind, k = 2
    assert not admit(6, 7, 0)  # synchronous: only the trainer's own version
    with pytest.raises(ValueError, match="max_staleness"):
        admit(7, 7, -1)
    assert staleness_histogram([0, 1, 1, 3, 9, 12], top=8) == {"0": 1, "1": 2, "3": 1, "8+": 2}


# ------------------------------------------------------------------ ESS, tails


def test_ess_fraction_by_hand():
    m = torch.ones(1, 3)
    assert float(ess_fraction(torch.tensor([[1.0, 2.0, 3.0]]), m)) == pytest.approx(36 / (3 * 14))
    assert float(ess_fraction(torch.full((2, 5), 0.7), torch.ones(2, 5))) == pytest.approx(1.0)
    one_hot = torch.zeros(1, 10)
    one_hot[0, 3] = 5.0
    assert float(ess_fraction(one_hot, torch.ones(1, 10))) == pytest.approx(0.1)
    # masked positions count in nothing, whatever their weight
    w = torch.tensor([[1.0, 2.0, 1000.0], [3.0, -7.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert float(ess_fraction(w, mask)) == pytest.approx(36 / (3 * 14))
    assert float(ess_fraction(w, torch.zeros(2, 3))) == 1.0


def test_ratio_tail_by_hand():
    lr = torch.log(torch.tensor([[0.5, 1.0, 4.0, 100.0]]))
    mx, p50 = ratio_tail(lr, torch.tensor([[1, 1, 1, 0]]), q=0.5)
    assert mx == pytest.approx(4.0) and p50 == pytest.approx(1.0)
    assert ratio_tail(lr, torch.zeros(1, 4)) == (1.0, 1.0)


# ------------------------------------------------------------------ A-3PO


def test_interpolation_weight_and_proximal_logprobs_by_hand():
    a = interpolation_alpha(torch.tensor([5, 4, 3, 0]), 5)
    assert a.tolist() == pytest.approx([0.0, 1 / 2, 2 / 3, 5 / 6])
    with pytest.raises(ValueError, match="newer than the trainer"):
        interpolation_alpha(torch.tensor([6]), 5)
    behav = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    cur = torch.tensor([[-1.5, -1.0], [-0.25, -2.0]], requires_grad=True)
    prox = interpolated_proximal_logprobs(behav, cur, torch.tensor([5, 3]), 5)  # one version per sample
    # sample 0 on-policy (alpha 0): the behaviour policy itself; sample 1 two versions behind (alpha 2/3)
    want = torch.tensor([[-1.0, -2.0], [-0.5 + 2 / 3 * 0.25, -3.0 + 2 / 3 * 1.0]])
    assert torch.allclose(prox, want)
    assert not prox.requires_grad  # a constant of the loss
    per_token = interpolated_proximal_logprobs(behav, cur, torch.tensor([[5, 4], [3, 3]]), 5)
    assert float(per_token[0, 1]) == pytest.approx(-2.0 + 0.5 * 1.0)


def test_the_decoupled_loss_is_the_clip_at_the_proximal_policy_times_the_behaviour_weight():
    """``decoupled-clip`` with old_logprobs = the proximal policy, times ``loss_token_weights``
    for stale tokens (``offpolicy="correct"``: w = min(pi_prox / pi_behav, C)), against the
    decoupled objective computed by hand for four tokens."""
    cfg = AlgorithmConfig()  # eps_low 0.2, eps_high 0.28, no dual clip
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -1.2]], requires_grad=True)
    prox = torch.tensor([[-1.2, -0.9], [-1.5, -1.2]])
    behav = torch.tensor([[-1.0, -1.0], [-1.4, -2.5]])
    adv = torch.tensor([1.0, -2.0])
    mask = torch.ones(2, 2)
    stale = torch.ones(2, 2)  # every token older than the trainer's weights
    cap = 2.0
    loss, _ = POLICY_LOSSES.get("decoupled-clip")(logp, prox, adv, mask, cfg)
    w = loss_token_weights(prox, behav, mask, stale=stale, tis_mode="token-truncate", tis_cap=cap, offpolicy="correct")
    got = (loss * w.weight).detach()
    want = torch.zeros(2, 2)
    for i in range(2):
        for t in range(2):
            u = math.exp(float(logp[i, t].detach()) - float(prox[i, t]))
            weight = min(math.exp(float(prox[i, t]) - float(behav[i, t])), cap)
            a = float(adv[i])
            want[i, t] = -weight * min(u * a, min(max(u, 0.8), 1.28) * a)
    assert torch.allclose(got, want, atol=1e-6), (got, want)
    assert float(w.weight[1, 1]) == cap  # exp(1.3) = 3.7 truncated at the cap


# ------------------------------------------------------------------ the controller


def _run(ctrl, trace):
    return [ctrl.observe(e, r).k for e, r in trace]


def test_the_controller_lowers_the_lag_at_once_and_raises_it_only_after_patience():
    c = StalenessController(ControllerSettings(max_staleness=4, ess_low=0.6, ess_high=0.85, patience=3))
    assert c.k == 4
    # a collapse: ESS falls step after step -> lag 4 -> 3 -> 2 -> 1 -> 0, and stays 0
    ks = _run(c, [(0.5, 1.5), (0.4, 1.5), (0.3, 2.0), (0.2, 2.0), (0.1, 5.0)])
    assert ks == [3, 2, 1, 0, 0]
    assert c.history[0].changed and "ESS/N 0.50 < 0.60 at lag 4: lag lowered to 3" == c.history[0].reason
    assert "lag stays 0" in c.history[-1].reason and "ratio p99 5.00 > 3.00" in c.history[-1].reason
    # recovery: three healthy steps per raise
    ks = _run(c, [(0.9, 1.2)] * 7)
    assert ks == [0, 0, 1, 1, 1, 2, 2]
    assert "for 3 steps at lag 0: lag raised to 1" in c.history[7].reason


def test_the_controller_holds_in_the_band_and_a_tail_alone_counts_as_degraded():
    c = StalenessController(ControllerSettings(max_staleness=2, start=1))
    ks = _run(c, [(0.7, 1.1), (0.9, 1.1), (0.7, 1.1), (0.9, 1.1), (0.9, 1.1), (0.7, 1.1)] * 3)
    assert set(ks) == {1}  # in the band [0.6, 0.85) the healthy run restarts: no raise, no oscillation
    assert _run(c, [(0.95, 3.5)]) == [0]  # a heavy ratio tail with a good ESS: lowered
    assert _run(c, [(float("nan"), 1.0)]) == [0] and "non-finite" in c.history[-1].reason
    assert _run(StalenessController(ControllerSettings(max_staleness=1, start=1)), [(0.99, 1.0)] * 5) == [1] * 5


def test_a_fixed_lag_that_collapses_ess_is_held_above_the_threshold_by_the_controller():
    """A synthetic run whose ESS/N depends on the lag (each step of lag halves the distance to
    collapse): at a fixed lag of 4 it sits at 0.35, below the 0.6 threshold; the controller
    finds the largest lag whose ESS/N stays above it and keeps the run there."""

    def ess_at(k):  # 1.0 on-policy, 0.9 at lag 1, 0.75 at 2, 0.55 at 3, 0.35 at 4
        return [1.0, 0.9, 0.75, 0.55, 0.35][k]

    settings = ControllerSettings(max_staleness=4, ess_low=0.6, ess_high=0.7, patience=2)
    c = StalenessController(settings)
    measured = []
    for _ in range(30):
        e = ess_at(c.k)
        measured.append(e)
        c.observe(e, 1.5)
    tail = measured[5:]
    assert sum(x >= settings.ess_low for x in tail) / len(tail) > 0.8, measured
    assert all(x >= settings.ess_low for x in measured[-10:]), measured  # failed probes ever rarer
    assert max(d.k for d in c.history[5:]) <= 3  # lag 4 (ESS 0.35) never comes back
    assert ess_at(4) < settings.ess_low  # the fixed lag would have stayed below it every step
    probes = [i for i, d in enumerate(c.history) if d.changed and "raised to 3" in d.reason]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and len(set(gaps)) == len(gaps), probes  # each failed raise waits longer


def test_the_tail_as_a_share_above_the_threshold_decides_as_the_p99_does():
    """``tail_frac`` (the share of ratios above ``ratio_high``, what the trainer sums exactly over
    ranks) degrades exactly when the 99th-percentile ratio of the same tokens is above it."""
    gen = torch.Generator().manual_seed(0)
    for scale in (0.1, 0.5, 0.8, 1.2):
        ratios = torch.exp(torch.randn(1000, generator=gen) * scale)
        p99 = float(torch.quantile(ratios, 0.99))
        frac = float((ratios > RATIO_TAIL).float().mean())
        by_p99 = StalenessController(ControllerSettings(max_staleness=2)).observe(0.9, p99)
        by_frac = StalenessController(ControllerSettings(max_staleness=2)).observe(0.9, tail_frac=frac)
        assert by_p99.k == by_frac.k, (scale, p99, frac)
        assert (by_frac.k == 1) == (p99 > RATIO_TAIL)
    assert (
        "2.0% of the ratios > 3.00"
        in StalenessController(ControllerSettings(max_staleness=2)).observe(0.9, tail_frac=0.02).reason
    )
    with pytest.raises(ValueError, match="ratio tail"):
        StalenessController(ControllerSettings(max_staleness=2)).observe(0.9)


def test_a_resumed_controller_decides_as_the_uninterrupted_one():
    trace = [(0.5, 1.0), (0.9, 1.0), (0.9, 1.0), (0.9, 1.0), (0.4, 1.0), (0.9, 1.0)] * 3
    whole = StalenessController(ControllerSettings(max_staleness=3))
    ks_whole = _run(whole, trace)
    first = StalenessController(ControllerSettings(max_staleness=3))
    ks = _run(first, trace[:7])
    resumed = StalenessController(ControllerSettings(max_staleness=3))
    resumed.load_state_dict(first.state_dict())
    assert ks + _run(resumed, trace[7:]) == ks_whole
    with pytest.raises(ValueError, match="does not fit max_staleness 1"):
        StalenessController(ControllerSettings(max_staleness=1)).load_state_dict(first.state_dict())


def test_settings_are_checked_and_the_step_scale_is_bounded():
    with pytest.raises(ValueError, match="ess_low < ess_high"):
        ControllerSettings(max_staleness=2, ess_low=0.9, ess_high=0.8)
    with pytest.raises(ValueError, match="start lag"):
        StalenessController(ControllerSettings(max_staleness=2, start=3))
    assert ess_step_scale(0.4) == 0.4 and ess_step_scale(0.01) == 0.1 and ess_step_scale(1.7) == 1.0
