"""The report (megatron_dapo/ablation/report.py) on synthetic run directories with known effects:
estimates and intervals against hand computations, missing and unfinished cells reported, and
grids whose runs differ in more than the factors refused, naming the fields."""

import json
import math
import os

import pytest

from megatron_dapo.ablation.cli import main
from megatron_dapo.ablation.launch import action_for, grid_states
from megatron_dapo.ablation.plan import AblationError, load_plan
from megatron_dapo.ablation.report import build_report, format_markdown, write_report
from tests.ablation.synthetic import make_plan, write_config, write_metrics

T975_1 = 12.7062  # t(0.975, 1 df): two seeds
EFFECT_A = {1: 0.10, 2: 0.14}  # clip-higher: differs between the seeds
EFFECT_B = -0.06  # dynamic sampling
EFFECT_AB = 0.04
SEED_SHIFT = {1: 0.0, 2: 0.05}


def final_value(levels, seed):
    a, b = levels["clip-higher"], levels["dynamic-sampling"]
    return 0.4 + SEED_SHIFT[seed] + EFFECT_A[seed] / 2 * a + EFFECT_B / 2 * b + EFFECT_AB / 2 * a * b


def fill(plan, runs=None, last_step=None):
    """Every run (or ``runs``): held-out accuracy at steps 2 and 4 (y - 0.1, y), training metrics every step;
    entropy 0.5 + 0.1 x clip-higher; truncation 0.5 (an alert) without the token-level loss."""
    for run in plan.runs if runs is None else runs:
        lv = plan.levels(run.cell)
        y = final_value(lv, run.seed)
        recs = []
        for step in range(1, (last_step or 4) + 1):
            r = {
                "step": step,
                "acc_mean": 0.3,
                "entropy": 0.5 + 0.1 * lv["clip-higher"],
                "clip_frac_high": 0.01,
                "kept_group_ratio": 0.6,
                "response_length_mean": 8.0,
                "truncation_ratio": 0.5 if lv["token-level-loss"] < 0 else 0.0,
                "time_step": 12.0,
            }
            if step % 2 == 0:
                r["eval/heldout/pass@1"] = y - 0.1 if step == 2 else y
            recs.append(r)
        write_config(run)
        write_metrics(run, recs)


def hand_contrast(plan, values, factor_names):
    """mean(y | product of the factors' levels = +1) - mean(... = -1), by hand."""
    plus, minus = [], []
    for cell, y in values.items():
        sign = 1
        for n in factor_names:
            sign *= plan.levels(cell)[n]
        (plus if sign > 0 else minus).append(y)
    return sum(plus) / len(plus) - sum(minus) / len(minus)


def test_effects_and_intervals_from_synthetic_runs(tmp_path):
    plan = make_plan(tmp_path)
    fill(plan)
    md, rep = write_report(plan)
    assert rep["metric"] == "eval/heldout/pass@1" and "held-out accuracy" in rep["metric_why"]
    eff = {e.column.name: e for e in rep["effects"]["final"]}
    assert sorted(eff) == ["A", "AB", "AC", "B", "BC", "C"]
    # A: per seed exactly the seed's effect; the mean 0.12 with the t interval on 1 df
    assert eff["A"].per_seed == {1: pytest.approx(0.10), 2: pytest.approx(0.14)}
    sd = math.sqrt((0.02**2 + 0.02**2) / 1)
    half = T975_1 * sd / math.sqrt(2)
    assert eff["A"].estimate == pytest.approx(0.12)
    assert (eff["A"].low, eff["A"].high) == (pytest.approx(0.12 - half, abs=1e-4), pytest.approx(0.12 + half, abs=1e-4))
    assert eff["B"].estimate == pytest.approx(EFFECT_B) and eff["B"].low == pytest.approx(EFFECT_B)
    assert eff["AB"].estimate == pytest.approx(EFFECT_AB)
    for name in ("C", "AC", "BC"):
        assert eff[name].estimate == pytest.approx(0.0, abs=1e-12)
    assert all(e.separable for e in eff.values())
    # the same numbers by hand from the run values, seed by seed
    for seed in (1, 2):
        vals = {c: final_value(plan.levels(c), seed) for c in plan.cells}
        assert eff["A"].per_seed[seed] == pytest.approx(hand_contrast(plan, vals, ["clip-higher"]))
        assert eff["AB"].per_seed[seed] == pytest.approx(hand_contrast(plan, vals, ["clip-higher", "dynamic-sampling"]))
    # auc: trapezoid over steps 2..4 / 2 = y - 0.05, so the same effects
    auc = {e.column.name: e.estimate for e in rep["effects"]["auc"]}
    assert auc["A"] == pytest.approx(0.12) and auc["AB"] == pytest.approx(EFFECT_AB)
    r0 = rep["results"]["A1B1C0:2"]
    y = final_value(plan.levels("A1B1C0"), 2)
    assert r0.outcomes["final"] == pytest.approx(y) and r0.outcomes["auc"] == pytest.approx(y - 0.05)
    # steps to 0.45: by hand from the two logged values (never reached: last step + 1)
    steps = {}
    for run in plan.runs:
        y = final_value(plan.levels(run.cell), run.seed)
        steps[run.key] = 2 if y - 0.1 >= 0.45 else 4 if y >= 0.45 else 5
        assert rep["results"][run.key].outcomes["steps_to_threshold"] == steps[run.key]
        assert rep["results"][run.key].censored == (steps[run.key] == 5)
    s_eff = {e.column.name: e for e in rep["effects"]["steps_to_threshold"]}
    for seed in (1, 2):
        vals = {c: steps[f"{c}:{seed}"] for c in plan.cells}
        assert s_eff["A"].per_seed[seed] == pytest.approx(hand_contrast(plan, vals, ["clip-higher"]))
    # mechanism: clip-higher raised the final entropy by 0.2; the others did nothing to it
    ent = rep["mechanisms"]["entropy (last)"]["effects"]
    assert [e.estimate for e in ent] == [pytest.approx(0.2), pytest.approx(0.0), pytest.approx(0.0)]
    # diagnosis: truncation 0.5 alerts on reward interpretation in every run without the token-level loss
    assert "reward_interpretation: truncation_high" in rep["results"]["A0B0C0:1"].diagnosis
    assert rep["results"]["A0B0C1:1"].diagnosis.startswith("no alerts")
    rows = {(r["factor"], r["level"]): r for r in rep["alert_table"]}
    assert rows[("token-level-loss", "-")]["reward_interpretation"] == 8
    assert rows[("token-level-loss", "+")]["reward_interpretation"] == 0
    assert rows[("clip-higher", "+")]["reward_interpretation"] == 4
    # files
    out = os.path.join(plan.grid, "report")
    for name in ("report.md", "report.json", "effects.png", "main_effects.png", "interactions.png"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    js = json.load(open(os.path.join(out, "report.json")))
    assert js["counts"] == {"done": 16} and js["ci"] == "95% Student t over seeds"
    a = [e for e in js["effects"]["final"] if e["effect"] == "A"][0]
    assert a["estimate"] == pytest.approx(0.12) and a["ci"][0] == pytest.approx(0.12 - half, abs=1e-4)
    assert "## Runs: 16 of 16 done" in md and "| A: clip-higher | +0.12 |" in md
    assert "Student t over the replicates' estimates" in md


def test_missing_and_unfinished_cells_are_reported_never_dropped(tmp_path):
    plan = make_plan(tmp_path)
    runs = {r.key: r for r in plan.runs}
    fill(plan, [r for k, r in runs.items() if k not in ("A1B0C0:2", "A0B1C0:2")])
    fill(plan, [runs["A0B1C0:2"]], last_step=2)  # killed after step 2
    states = {s.key: s for s in grid_states(plan)}
    assert states["A1B0C0:2"].status == "missing" and states["A0B1C0:2"].status == "incomplete"
    assert states["A0B1C0:2"].detail.startswith("step 2 of 4")
    assert action_for(states["A1B0C0:2"]) == ("new", [])
    assert action_for(states["A0B1C0:2"]) == ("restart", ["--start-over"])
    assert action_for(states["A0B1C0:2"], skip_incomplete=True) is None
    assert action_for(states["A0B0C0:1"]) is None
    rep = build_report(plan)
    assert rep["counts"] == {"done": 14, "incomplete": 1, "missing": 1}
    assert rep["left_out"]["final"] == {2: "A1B0C0 missing, A0B1C0 incomplete"}
    eff = {e.column.name: e for e in rep["effects"]["final"]}
    # seed 1 alone: its own effect, no interval
    assert eff["A"].per_seed == {1: pytest.approx(0.10)} and eff["A"].low is None
    md = format_markdown(rep)
    assert "## Runs: 14 of 16 done (done 14, incomplete 1, missing 1)" in md
    assert "`A1B0C0:2` (clip-higher+, dynamic-sampling-, token-level-loss-): **missing**, never started" in md
    assert "`A0B1C0:2` (clip-higher-, dynamic-sampling+, token-level-loss-): **incomplete**, step 2 of 4" in md
    assert "seed 2 left out (A1B0C0 missing, A0B1C0 incomplete)" in md
    assert "| A1B0C0:2 | clip-higher+, dynamic-sampling-, token-level-loss- | missing |" in md


def test_report_refuses_runs_that_differ_outside_the_factors(tmp_path, capsys):
    plan = make_plan(tmp_path, seeds=(1,))
    fill(plan)
    odd = plan.runs[3]
    write_config(odd, **{"optim.lr": 1e-4, "rollout.n_samples_per_prompt": 8})
    with pytest.raises(AblationError) as e:
        build_report(plan)
    msg = str(e.value)
    assert "differ in more than the factors" in msg
    assert "optim.lr (1e-06 in A0B0C0:1, A1B0C0:1, A0B1C0:1 ...; 0.0001 in A1B1C0:1)" in msg
    assert "rollout.n_samples_per_prompt" in msg
    assert "algo.eps_clip_high" in msg  # the factors' fields are named as the allowed ones
    # the command line: one line naming the fields, exit 2, no report written
    with pytest.raises(SystemExit) as ex:
        main(["report", plan.grid])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ablate.py: error: grid ") and "optim.lr" in err and len(err.splitlines()) == 1
    assert not os.path.exists(os.path.join(plan.grid, "report", "report.md"))


def test_report_refuses_a_run_that_is_not_its_cell(tmp_path):
    plan = make_plan(tmp_path, seeds=(1,))
    fill(plan)
    a1 = [r for r in plan.runs if r.cell == "A1B0C0"][0]
    write_config(a1, **{"algo.eps_clip_high": 0.2})  # clip-higher+ cell run without clip-higher
    assert {s.key: s.status for s in grid_states(plan)}["A1B0C0:1"] == "foreign"
    with pytest.raises(
        AblationError,
        match=r"is not the configuration of cell A1B0C0 .*algo\.eps_clip_high \(0\.2, "
        r"the plan: 0\.28\)",
    ):
        build_report(plan)


def test_fractional_grid_labels_aliased_effects_and_custom_factors(tmp_path):
    plan = make_plan(
        tmp_path,
        factors="clip-higher,dynamic-sampling,token-level-loss",
        seeds=(1,),
        fraction=0,
        specs=["lr=--lr 1e-6|--lr 2e-6"],
    )
    assert plan.factor_fields["lr"] == ["optim.lr"]
    plan4 = make_plan(
        tmp_path / "frac",
        factors="clip-higher,dynamic-sampling,token-level-loss",
        seeds=(1,),
        fraction=1,
        specs=["lr=--lr 1e-6|--lr 2e-6"],
    )
    assert plan4.design.name == "2^(4-1)" and len(plan4.runs) == 8
    for run in plan4.runs:
        lv = plan4.levels(run.cell)
        y = 0.5 + 0.05 * lv["lr"] + 0.02 * lv["clip-higher"] * lv["dynamic-sampling"]
        write_config(run)
        write_metrics(run, [{"step": s, "acc_mean": y} for s in range(1, 5)])
    rep = build_report(load_plan(plan4.grid))
    assert rep["metric"] == "acc_mean" and "no held-out evaluation" in rep["metric_why"]
    labels = {e.column.label: e for e in rep["effects"]["final"]}
    assert sorted(labels) == ["A", "AB = CD", "AC = BD", "AD = BC", "B", "C", "D"]
    assert labels["D"].estimate == pytest.approx(0.10)
    assert labels["AB = CD"].estimate == pytest.approx(0.04) and not labels["AB = CD"].separable
    md = format_markdown(rep)
    assert "resolution IV (generators D=ABC)" in md and "no (aliased)" in md
