"""The four-boundary diagnosis on synthetic histories: each failure mode raises its own
boundary's alert and no other; a healthy run raises none; missing keys are tolerated."""

import json

import diag_synthetic as S
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.diagnostics import (
    BOUNDARIES,
    History,
    Thresholds,
    diagnose,
    format_report,
    load_metrics,
    load_thresholds,
)

BOUNDARY_KEYS = [b.key for b in BOUNDARIES]


def run(h, th=None):
    return diagnose(History.from_records(S.records(h)), th)


@pytest.mark.parametrize("seed", range(8))
def test_healthy_history_raises_nothing(seed):
    d = run(S.healthy(seed=seed))
    assert d.alerts == [] and d.warnings == []
    assert not d.any_alert
    assert [b.status for b in d.boundaries] == ["ok"] * 4
    assert "verdict: no alerts" in format_report(d)


@pytest.mark.parametrize("n", [12, 20, 40])
def test_noisy_short_healthy_runs_raise_no_alert(n):
    for seed in range(10):
        d = run(S.noisy_healthy(n, seed))
        assert d.alerts == [], (seed, [a.message for a in d.alerts])


@pytest.mark.parametrize("mode", sorted(S.FAILURE_MODES))
def test_each_failure_mode_alerts_its_boundary_only(mode):
    boundary, make, kind = S.FAILURE_MODES[mode]
    d = run(make())
    assert d.alerting_boundaries() == {boundary}, [a.message for a in d.alerts]
    rep = d.boundary(boundary)
    assert rep.status == "alert"
    assert kind in {a.kind for a in rep.alerts}
    assert kind in rep.verdict
    for other in BOUNDARY_KEYS:
        if other != boundary:
            assert d.boundary(other).status == "ok"
    # the onset lies inside the run and after the failure began (the ramps start at 40%)
    onset = min(a.step for a in rep.alerts if a.kind == kind)
    assert 0 < onset <= S.STEPS - 1


def test_alert_details_are_meaningful():
    d = run(S.group_contrast_too_easy())
    kept = next(a for a in d.alerts if a.kind == "kept_groups_low")
    assert "too easy" in kept.message
    assert kept.value < 0.1
    d = run(S.entropy_collapse())
    a = next(a for a in d.alerts if a.kind == "entropy_collapse")
    assert "clip-higher" in a.message and a.value < 0.3 * 0.6
    s = d.boundary("exploration").metrics["entropy"]
    assert s.trend == "falling" and s.last == pytest.approx(S.entropy_collapse()["entropy"][-1])
    assert s.early == pytest.approx(float(np.median(S.entropy_collapse()["entropy"][:5])))


def test_all_wrong_groups_say_too_hard():
    h = S.healthy()
    h["all_wrong_ratio"] = S._ramp(S.STEPS, 0.30, 0.95)
    h["all_correct_ratio"] = S._ramp(S.STEPS, 0.15, 0.02)
    h["kept_group_ratio"] = 1 - h["all_wrong_ratio"] - h["all_correct_ratio"]
    d = run(h)
    assert d.alerting_boundaries() == {"group_contrast"}
    kinds = {a.kind for a in d.alerts}
    assert {"kept_groups_low", "all_wrong_ratio_high"} <= kinds
    assert "too hard" in next(a for a in d.alerts if a.kind == "kept_groups_low").message


def test_slow_length_drift_over_a_long_run():
    # 300 steps: the length drifts 900 -> 2600 tokens, never fast over 20 steps, accuracy flat
    d = run(S.token_credit_length(n=300))
    assert d.alerting_boundaries() == {"token_credit"}
    a = next(a for a in d.alerts if a.kind == "length_without_accuracy")
    assert "since the start" in a.message
    h = S.token_credit_length(n=300)
    h["acc_mean"] = S._ramp(300, 0.3, 0.6)
    assert run(h).alerts == []


def test_length_growing_with_accuracy_is_healthy():
    h = S.token_credit_length()
    h["acc_mean"] = S._ramp(S.STEPS, 0.3, 0.7)  # accuracy follows the length: learning to reason
    assert run(h).alerts == []


def test_sudden_drop_recent_is_alert_past_is_warning():
    h = S.healthy()
    h["entropy"][-3:] *= 0.3  # collapses in one update, three steps before the end
    d = run(h)
    assert d.alerting_boundaries() == {"exploration"}
    assert "sudden_drop" in {a.kind for a in d.alerts}

    h = S.healthy()
    h["truncation_ratio"][30] = 0.5  # a single bad step long ago
    d = run(h)
    assert d.alerts == []
    assert [w.kind for w in d.warnings] == ["sudden_rise"]
    assert d.boundary("reward_interpretation").status == "ok"
    assert "warning" in d.boundary("reward_interpretation").verdict


def test_recovered_condition_is_a_warning():
    h = S.healthy()
    h["no_answer_rate"][20:40] = 0.5  # a bad stretch that recovered
    d = run(h)
    assert d.alerts == []
    assert "no_answer_rising" in {w.kind for w in d.warnings}


def test_missing_keys_are_tolerated_and_reported():
    h = S.entropy_collapse()
    for k in (
        "kept_group_ratio",
        "all_correct_ratio",
        "all_wrong_ratio",
        "num_gen_batches",
        "clip_frac_low",
        "clip_frac_high",
        "acc_mean",
    ):
        del h[k]
    d = run(h)
    assert d.boundary("group_contrast").status == "no_data"
    assert "no data" in d.boundary("group_contrast").verdict
    assert d.alerting_boundaries() == {"exploration"}
    tc = d.boundary("token_credit")
    assert tc.status == "ok" and any("acc_mean" in n for n in tc.notes)
    # nothing at all
    d = diagnose(History.from_records([]))
    assert d.num_steps == 0 and not d.alerts
    assert {b.status for b in d.boundaries} == {"no_data"}
    assert "no steps" in format_report(d)


def test_short_history_has_no_relative_alerts():
    h = S.entropy_collapse(n=5)
    d = run(h)
    assert "entropy_collapse" not in {a.kind for a in d.alerts}
    assert any("only 5" in n for n in d.boundary("exploration").notes)
    # absolute thresholds still apply to a short run
    h = S.healthy(n=5)
    h["truncation_ratio"][:] = 0.5
    assert run(h).alerting_boundaries() == {"reward_interpretation"}


def test_thresholds_change_the_verdict(tmp_path):
    h = S.reward_truncation()
    assert run(h).alerting_boundaries() == {"reward_interpretation"}
    lax = Thresholds(truncation_ratio_max=0.9, overlong_penalty_max=0.9)
    assert run(h, lax).alerts == []
    strict = Thresholds().with_overrides(["truncation_ratio_max=0.005"])
    assert run(S.healthy(), strict).alerting_boundaries() == {"reward_interpretation"}
    f = tmp_path / "th.yaml"
    f.write_text("truncation_ratio_max: 0.9\noverlong_penalty_max: 0.9\n")
    assert load_thresholds(str(f)) == lax
    f.write_text("thresholds:\n  window: 4\n")
    assert load_thresholds(str(f)).window == 4 and isinstance(load_thresholds(str(f)).window, int)
    with pytest.raises(ValueError, match="unknown"):
        Thresholds.from_mapping({"truncation_max": 0.1})
    with pytest.raises(ValueError):
        Thresholds().with_overrides(["truncation_ratio_max"])
    with pytest.raises(ValueError):
        Thresholds().with_overrides(["truncation_ratio_max=high"])
    with pytest.raises(ValueError):
        Thresholds(window=0)


def test_load_metrics_is_tolerant(tmp_path):
    lines = [
        json.dumps({"step": 1, "entropy": 0.5, "note": "x"}),
        "",
        json.dumps({"step": 0, "entropy": 0.6}),
        json.dumps({"step": 1, "entropy": 0.4, "kept_group_ratio": None}),  # re-logged step
        "[1, 2]",
        '{"step": 2, "entropy": NaN, "grad_norm": Infinity}',
        '{"step": 3, "entr',
    ]  # cut short by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    h = load_metrics(str(tmp_path))
    assert h.steps.tolist() == [0, 1, 2]
    assert h.get("entropy")[:2].tolist() == [0.6, 0.4]
    assert np.isnan(h.get("entropy")[2]) and np.isnan(h.get("grad_norm")[2])
    assert h.bad_lines == 2 and h.duplicate_steps == 1
    assert not h.has("kept_group_ratio") and np.isnan(h.get("absent")).all()
    d = diagnose(h)
    assert any("unreadable" in n for n in d.notes) and any("re-logged" in n for n in d.notes)
    assert load_metrics(str(tmp_path / "metrics.jsonl")).steps.tolist() == [0, 1, 2]


def test_to_dict_is_json_serialisable():
    d = run(S.reward_no_answer())
    out = json.loads(json.dumps(d.to_dict()))
    assert out["any_alert"] is True
    assert [b["key"] for b in out["boundaries"]] == BOUNDARY_KEYS


METRIC_KEYS = [k for b in BOUNDARIES for k in b.metrics + b.context]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(METRIC_KEYS + ["step", "time_step", "extra"]),
            st.one_of(
                st.none(),
                st.floats(allow_nan=True, allow_infinity=True, width=32),
                st.integers(-5, 5),
                st.text(max_size=3),
            ),
            max_size=8,
        ),
        max_size=40,
    )
)
def test_diagnose_never_crashes_on_odd_histories(recs):
    d = diagnose(History.from_records(recs))
    json.dumps(d.to_dict())
    format_report(d, verbose=True)
    for b in d.boundaries:
        assert b.status in ("ok", "alert", "no_data")
