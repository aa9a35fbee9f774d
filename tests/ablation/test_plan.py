"""The plan (megatron_dapo/ablation/plan.py) and the command line's planning side: the dry run
(design, resolution, what it can and cannot separate, runs, cost), the budget, refusals naming
the flag, a rerun that must match the grid's plan, task-args for the Slurm array."""

import json
import os

import pytest

from megatron_dapo.ablation.cli import main
from megatron_dapo.ablation.plan import (
    DEFAULT_FACTORS,
    AblationError,
    build_plan,
    calibrated_step_seconds,
    estimate_step_seconds,
    expected_config,
    load_plan,
    parse_factor,
    resolve_factors,
)
from tests.ablation.synthetic import base_args, make_plan, write_config, write_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_default_factors_are_the_train_flags(tmp_path):
    """Each default factor's two levels parse with megatron_dapo.config and set its control."""
    plan = build_plan(str(tmp_path / "g"), base_args(tmp_path), resolve_factors(None, []), [1])
    assert [f.name for f in plan.factors] == list(DEFAULT_FACTORS)
    assert plan.factor_fields == {
        "clip-higher": ["algo.eps_clip_high"],
        "dynamic-sampling": ["algo.dynamic_sampling"],
        "token-level-loss": ["algo.loss_agg_mode"],
        "overlong-filter": ["algo.overlong_filter"],
        "soft-overlong-punishment": ["algo.overlong_penalty"],
    }
    want = {
        "clip-higher": (0.2, 0.28),
        "dynamic-sampling": (False, True),
        "token-level-loss": ("seq-mean-token-mean", "token-mean"),
        "overlong-filter": (False, True),
        "soft-overlong-punishment": (False, True),
    }
    lo = expected_config([*plan.base_args, *plan.cell_args(plan.cells[0]), "--run-dir", "x"])
    hi = expected_config([*plan.base_args, *plan.cell_args(plan.cells[-1]), "--run-dir", "x"])
    for name, (a, b) in want.items():
        field = plan.factor_fields[name][0]
        assert (lo[field], hi[field]) == (a, b), name
    assert plan.cells[0] == "A0B0C0D0E0" and plan.cells[-1] == "A1B1C1D1E1" and len(plan.runs) == 32
    # the run's own flags come last and the run directory is the grid's
    r = plan.runs[5]
    assert r.argv[-4:] == ["--seed", "1", "--run-dir", os.path.join(plan.grid, "runs", r.cell, "seed1")]


def test_dry_run_of_a_resolution_iv_fraction(tmp_path, capsys):
    grid = tmp_path / "grid"
    rc, out, err = run_cli(
        [
            "run",
            "--grid",
            str(grid),
            "--factors",
            "clip-higher,dynamic-sampling,token-level-loss,overlong-filter",
            "--fraction",
            "1",
            "--seeds",
            "1",
            "2",
            "--step-seconds",
            "90",
            "--dry-run",
            "--",
            *base_args(tmp_path),
        ],
        capsys,
    )
    assert rc == 0, err
    assert "=== ablation plan: 2^(4-1) fractional factorial, resolution IV, 8 cells x 2 seed(s) = 16 runs ===" in out
    assert "design: generators D=ABC; defining relation I = ABCD" in out
    assert (
        "can separate (main effects and two-factor interactions; interactions of 3+ factors assumed negligible): "
        "A, B, C, D\n" in out
    )
    assert "cannot separate (aliased: one contrast estimates their sum): AB = CD; AC = BD; AD = BC" in out
    assert "A1B1C0D0:2" in out and "-> runs/A1B1C0D0/seed2" in out
    # cost: 1 CPU worker x 4 steps x 90 s per run = 0.1 h; 16 runs = 1.6 worker-hours
    assert "A0B0C0D0: 1 CPU workers x 4 steps x 90.0 s/step = 0.10 CPU worker-hours per run" in out
    assert "total: 1.60 CPU worker-hours for 16 runs" in out
    assert "[ablate] dry run: nothing written, nothing started" in out
    assert not grid.exists()


def test_budget_picks_the_largest_design_that_fits(tmp_path, capsys):
    # 5 factors, 4 steps x 100 s x 1 worker: 2^5 = 3.56 h, 2^(5-1) = 1.78 h, 2^(5-2) = 0.89 h
    argv = ["run", "--grid", str(tmp_path / "g"), "--step-seconds", "100", "--dry-run"]
    rc, out, err = run_cli([*argv, "--budget-gpu-hours", "2", "--", *base_args(tmp_path)], capsys)
    assert rc == 0, err
    assert "2^(5-1) fractional factorial, resolution V, 16 cells" in out and "E=ABCD" in out
    rc, out, err = run_cli([*argv, "--budget-gpu-hours", "1", "--", *base_args(tmp_path)], capsys)
    assert rc == 0 and "2^(5-2) fractional factorial, resolution III" in out
    assert "cannot separate (aliased: one contrast estimates their sum): A = BD = CE" in out
    rc, out, err = run_cli([*argv, "--budget-gpu-hours", "0.5", "--", *base_args(tmp_path)], capsys)
    assert rc == 2 and "--budget-gpu-hours 0.5: no design fits (2^5 3.6; 2^(5-1) 1.8; 2^(5-2) 0.9 GPU-hours)" in err
    rc, out, err = run_cli(
        ["run", "--grid", str(tmp_path / "g"), "--budget-gpu-hours", "1", "--dry-run", "--", *base_args(tmp_path)],
        capsys,
    )
    assert rc == 2 and "--budget-gpu-hours: the step time is unknown on CPU: give --step-seconds or --calibrate" in err


@pytest.mark.parametrize(
    "extra, opts, msg",
    [
        (["--seed", "3"], [], "base command: --seed is set by the ablation (give the seeds with --seeds)"),
        (["--run-dir", "x"], [], "base command: --run-dir is set by the ablation"),
        (
            ["--eps-clip-high", "0.3"],
            [],
            "base command: --eps-clip-high is set by the ablation (it is the factor 'clip-higher'",
        ),
        (
            ["--no-dynamic-sampling"],
            [],
            "--no-dynamic-sampling is set by the ablation (it is the factor 'dynamic-sampling'",
        ),
        (["--bogus", "1"], [], "base command: unrecognized arguments: --bogus 1"),
        ([], ["--factors", "clip-higher,nope"], "--factor 'nope': not a known control"),
        ([], ["--factor", "lr=--lr 1e-6"], "give the two levels separated by one '|'"),
        (
            [],
            ["--factor", "lr=--lr 1e-6|--lr 1e-6"],
            "--factor lr: its two levels (--lr 1e-6 | --lr 1e-6) give the same",
        ),
        (
            [],
            ["--factors", "clip-higher", "--factor", "eps=--eps-clip-high 0.1|--eps-clip-high 0.4"],
            "factors 'clip-higher' and 'eps' both set algo.eps_clip_high",
        ),
        ([], ["--factors", "clip-higher", "--factor", "lr=--lr x|--lr 1e-6"], "factor lr (low level: --lr x): "),
        ([], ["--generators", "E=A"], "E would equal the main effect A in every run (resolution II"),
        ([], ["--factors", "clip-higher,dynamic-sampling", "--fraction", "1"], "no default generators for 2^(2-1)"),
        ([], ["--seeds", "1", "1"], "--seeds 1 1: a seed appears twice"),
        (
            ["--max-response-length", "4096"],
            ["--factors", "clip-higher"],
            "cell A0 (clip-higher-): --max-prompt-length 64 + --max-response-length 4096 = 4160 exceeds the model's "
            "max_position_embeddings 512",
        ),
    ],
)
def test_refusals_name_the_flag(tmp_path, capsys, extra, opts, msg):
    rc, out, err = run_cli(
        ["run", "--grid", str(tmp_path / "g"), *opts, "--dry-run", "--", *base_args(tmp_path), *extra], capsys
    )
    assert rc == 2, out
    assert err.startswith("ablate.py: error: ") and msg in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "g").exists()


def test_base_config_file_and_its_refusals(tmp_path, capsys):
    base = base_args(tmp_path)
    cfg = tmp_path / "base.yaml"
    cfg.write_text("lr: 2.0e-6\n")
    rc, out, err = run_cli(
        [
            "run",
            "--grid",
            str(tmp_path / "g"),
            "--factors",
            "clip-higher",
            "--base-config",
            str(cfg),
            "--dry-run",
            "--",
            *base,
        ],
        capsys,
    )
    assert rc == 0, err
    assert f"base command: --config {cfg}" in out
    plan = build_plan(str(tmp_path / "g"), ["--config", str(cfg), *base], resolve_factors("clip-higher", []), [1])
    assert expected_config(plan.runs[0].argv)["optim.lr"] == 2e-6
    cfg.write_text("save: /somewhere/ckpt\n")
    rc, out, err = run_cli(
        [
            "run",
            "--grid",
            str(tmp_path / "g"),
            "--factors",
            "clip-higher",
            "--base-config",
            str(cfg),
            "--dry-run",
            "--",
            *base,
        ],
        capsys,
    )
    assert rc == 2 and "base command: --save is set (in --config?) but the ablation gives each run its own" in err
    rc, out, err = run_cli(
        ["run", "--grid", str(tmp_path / "g"), "--base-config", str(tmp_path / "none.yaml"), "--dry-run", "--", *base],
        capsys,
    )
    assert rc == 2 and "--base-config" in err and "file not found" in err


def test_rerun_must_match_the_grids_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the plan's working directory (part of its identity: relative paths)
    plan = make_plan(tmp_path, seeds=(1, 2))
    assert load_plan(plan.grid).identity() == plan.identity()
    rc, out, err = run_cli(
        [
            "run",
            "--grid",
            plan.grid,
            "--factors",
            "clip-higher,dynamic-sampling,token-level-loss",
            "--seeds",
            "1",
            "3",
            "--dry-run",
            "--",
            *plan.base_args,
        ],
        capsys,
    )
    assert rc == 2 and f"--grid {plan.grid} holds another grid's plan (ablation_plan.json differs in: seeds)" in err
    # the same options, or none: the grid's own plan and the state of its runs
    write_config(plan.runs[0])
    write_metrics(plan.runs[0], [{"step": s} for s in (1, 2, 3, 4)])
    rc, out, err = run_cli(["run", "--grid", plan.grid, "--dry-run"], capsys)
    assert rc == 0, err
    assert "2^3 full factorial" in out and "16 runs: 1 done, 15 missing" in out
    assert "A0B0C0:1   done       4 steps" in out
    rc, out, err = run_cli(["status", plan.grid], capsys)
    assert rc == 0 and "16 runs: 1 done, 15 missing" in out
    rc, out, err = run_cli(["status", str(tmp_path / "nowhere")], capsys)
    assert rc == 2 and "no ablation_plan.json there" in err


def test_task_args_for_the_slurm_array(tmp_path, capsysbinary):
    plan = make_plan(tmp_path, seeds=(1,))
    run = plan.runs[1]
    rc = main(["task-args", plan.grid, run.key])
    out = capsysbinary.readouterr().out
    assert rc == 0 and out.split(b"\0")[:-1] == [a.encode() for a in run.argv]
    rec = [json.loads(x) for x in open(os.path.join(plan.grid, "launch.jsonl"))]
    assert rec[-1]["key"] == run.key and rec[-1]["action"] == "new"
    write_config(run)  # started, then killed before any step: started over
    main(["task-args", plan.grid, run.key])
    assert capsysbinary.readouterr().out.split(b"\0")[-2:] == [b"--start-over", b""]
    write_metrics(run, [{"step": s} for s in (1, 2, 3, 4)])
    assert main(["task-args", plan.grid, run.key]) == 0 and capsysbinary.readouterr().out == b""  # done: nothing


def test_resume_from_the_runs_own_checkpoint(tmp_path):
    from megatron_dapo.ablation.launch import action_for, grid_states

    plan = build_plan(
        str(tmp_path / "g"), base_args(tmp_path), resolve_factors("clip-higher", []), [1], checkpoint_every=2
    )
    plan.save()
    run = plan.runs[0]
    assert run.argv[-6:] == [
        "--save",
        os.path.join(run.run_dir, "checkpoints"),
        "--save-interval",
        "2",
        "--keep-last",
        "1",
    ]
    write_config(run)
    write_metrics(run, [{"step": 1}, {"step": 2}, {"step": 3}])
    ckpt = os.path.join(run.run_dir, "checkpoints")
    os.makedirs(os.path.join(ckpt, "step_000002"))
    open(os.path.join(ckpt, "step_000002", "trainer_state.pt"), "wb").close()
    with open(os.path.join(ckpt, "latest"), "w") as f:
        f.write("step_000002")
    st = grid_states(plan)[0]
    assert st.status == "incomplete" and st.detail.startswith("step 3 of 4")
    assert action_for(st) == ("resume", ["--load", ckpt])


def test_step_time_from_a_finished_run_and_the_rough_gpu_estimate(tmp_path):
    from megatron_dapo.config import parse_args
    from megatron_dapo.models import parse_hf_config

    write_metrics(
        type("R", (), {"run_dir": str(tmp_path / "r")})(),
        [
            {"step": 1, "time_step": 500.0},
            {"step": 2, "time_step": 30.0},
            {"step": 3, "time_step": 40.0},
            {"step": 4, "time_step": 20.0},
        ],
    )
    assert calibrated_step_seconds(str(tmp_path / "r")) == 30.0  # the first (warm-up) step left out
    with pytest.raises(AblationError, match="no metrics.jsonl there"):
        calibrated_step_seconds(str(tmp_path))
    shape = os.path.join(ROOT, "examples", "qwen2.5-32b")
    arch = parse_hf_config(shape)
    common = [
        "--hf-checkpoint",
        shape,
        "--bf16",
        "--actor-num-nodes",
        "16",
        "--actor-num-gpus-per-node",
        "8",
        "--rollout-batch-size",
        "512",
        "--n-samples-per-prompt",
        "16",
        "--global-batch-size",
        "512",
    ]
    off = estimate_step_seconds(parse_args([*common, "--dynamic-sampling", "false"]), arch)
    on = estimate_step_seconds(parse_args([*common, "--dynamic-sampling", "true"]), arch)
    assert 100 < off < on < 10 * 3600  # dynamic sampling generates more
    half = estimate_step_seconds(parse_args([*common, "--dynamic-sampling", "false", "--actor-num-nodes", "32"]), arch)
    assert half == pytest.approx(off / 2)


def test_parse_factor_specs():
    f = parse_factor("lr=--lr 1e-6|--lr 2e-6 --lr-warmup-iters 3")
    assert f.name == "lr" and f.low == ("--lr", "1e-6") and f.high == ("--lr", "2e-6", "--lr-warmup-iters", "3")
    assert f.flags() == ["--lr", "--lr-warmup-iters"]
    assert parse_factor("clip-higher") is DEFAULT_FACTORS["clip-higher"]
    with pytest.raises(AblationError, match="name 'Bad Name'"):
        parse_factor("Bad Name=--lr 1|--lr 2")
    with pytest.raises(AblationError, match="must be train flags starting with '--'"):
        parse_factor("lr=1e-6|--lr 2")
