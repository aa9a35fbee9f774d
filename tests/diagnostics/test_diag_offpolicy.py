"""The engine/trainer mismatch (exploration) and the partial-rollout off-policy share (reward
interpretation) in the diagnosis and its dashboard."""

import diag_synthetic as S
import numpy as np

from megatron_dapo.diagnostics import History, diagnose, plot_diagnosis


def _history(**over):
    h = S.healthy()
    n = len(h["step"])
    rng = np.random.default_rng(7)
    h["mismatch_kl"] = np.abs(0.001 * (1 + 0.2 * rng.standard_normal(n)))
    h["tis_clip_frac"] = np.abs(0.002 * (1 + 0.2 * rng.standard_normal(n)))
    h["offpolicy_token_frac"] = np.abs(0.15 * (1 + 0.1 * rng.standard_normal(n)))
    for k, v in over.items():
        h[k] = v
    return h


def _run(h):
    return diagnose(History.from_records(S.records(h)))


def test_healthy_mismatch_and_offpolicy_share_raise_nothing():
    d = _run(_history())
    assert d.alerts == [] and d.warnings == []
    assert "mismatch_kl" in d.boundary("exploration").metrics
    assert "offpolicy_token_frac" in d.boundary("reward_interpretation").metrics


def test_engine_mismatch_alerts_exploration_only():
    d = _run(_history(mismatch_kl=S._ramp(S.STEPS, 0.001, 0.05)))
    assert d.alerting_boundaries() == {"exploration"}
    (a,) = [a for a in d.alerts if a.kind == "engine_mismatch_high"]
    assert a.metric == "mismatch_kl" and "--tis-mode" in a.message
    assert 0.4 * S.STEPS < a.step < S.STEPS


def test_stale_partial_rollout_tokens_alert_reward_interpretation_only():
    d = _run(_history(offpolicy_token_frac=S._ramp(S.STEPS, 0.15, 0.8)))
    assert d.alerting_boundaries() == {"reward_interpretation"}
    assert "offpolicy_tokens_high" in {a.kind for a in d.alerts}


def test_dashboard_plots_the_new_curves(tmp_path):
    h = History.from_records(S.records(_history(mismatch_kl=S._ramp(S.STEPS, 0.001, 0.05))))
    path = plot_diagnosis(diagnose(h), h, str(tmp_path / "d.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _ess(n, start, end):
    rng = np.random.default_rng(11)
    return np.clip(S._ramp(n, start, end) * (1 + 0.01 * rng.standard_normal(n)), 0.0, 1.0)


def test_a_healthy_ess_raises_nothing_and_is_read_in_exploration():
    d = _run(_history(is_ess_frac=_ess(S.STEPS, 0.95, 0.9)))
    assert d.alerts == [] and d.warnings == []
    assert "is_ess_frac" in d.boundary("exploration").metrics


def test_an_ess_collapse_with_stale_tokens_is_named_staleness_driven():
    """Issue 40: the off-policy section of the diagnosis names a staleness-driven collapse."""
    d = _run(_history(is_ess_frac=_ess(S.STEPS, 0.95, 0.2)))
    (a,) = [a for a in d.alerts if a.kind == "offpolicy_collapse"]
    assert a.boundary == "exploration" and a.metric == "is_ess_frac"
    assert "staleness-driven" in a.message and "--max-staleness" in a.message, a.message
    assert 0.4 * S.STEPS < a.step < S.STEPS


def test_an_ess_collapse_with_only_fresh_tokens_is_named_the_engine_mismatch():
    d = _run(_history(is_ess_frac=_ess(S.STEPS, 0.95, 0.2), offpolicy_token_frac=np.zeros(S.STEPS)))
    (a,) = [a for a in d.alerts if a.kind == "offpolicy_collapse"]
    assert "staleness" not in a.message and "mismatch_kl" in a.message, a.message
