"""End to end with the real trainer: a 2^1 grid (clip-higher) x 1 seed of one-step DAPO runs on a
tiny random Qwen2 (CPU, Ray, HF engine), through tools/ablate.py.

The dry run prints the plan and writes nothing; the first launch is stopped by SIGTERM while
its first run starts (nothing of it is left running: not the trainer, not its Ray); the rerun
starts that run over (its files moved aside by the trainer, nothing deleted) and runs the missing
one; the report has both runs, the held-out accuracy effect and each run's diagnosis; a third
call launches nothing."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_dapo.ablation.launch import session_pids
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.launch.procs import leftovers, run_in_session

pytestmark = [pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_grid_plan_launch_kill_resume_report(tmp_path, capsys, monkeypatch):
    from megatron_dapo.ablation.cli import main
    from megatron_dapo.ablation.launch import format_states, grid_states, launch_local
    from megatron_dapo.ablation.plan import load_plan

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"), 16)
    heldout = make_prompts(str(tmp_path / "heldout.jsonl"), 4)
    grid = tmp_path / "grid"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env["PYTHONPATH"] = ROOT  # the runs' --reward-fn tests.e2e.fixtures:parity_reward
    base = [
        "--hf-checkpoint",
        hf,
        "--prompt-data",
        prompts,
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "8",
        "--micro-batch-size",
        "8",
        "--max-response-length",
        "8",
        "--overlong-buffer-length",
        "4",
        "--max-prompt-length",
        "64",
        "--num-rollout",
        "1",
        "--lr",
        "1e-3",
        "--reward-fn",
        "tests.e2e.fixtures:parity_reward",
        "--reward-num-workers",
        "1",
        "--wandb-mode",
        "disabled",
        "--eval-data",
        heldout,
        "--eval-interval",
        "1",
        "--eval-k",
        "1",
        "--no-progress",
    ]
    tool = [sys.executable, os.path.join(ROOT, "tools", "ablate.py")]
    cmd = [
        *tool,
        "run",
        "--grid",
        str(grid),
        "--factors",
        "clip-higher",
        "--seeds",
        "7",
        "--kill-grace",
        "30",
        "--threshold",
        "0.5",
        "--",
        *base,
    ]

    # 1. the plan
    monkeypatch.chdir(tmp_path)
    assert main([*cmd[2 : -len(base) - 1], "--dry-run", "--", *base]) == 0
    out = capsys.readouterr().out
    assert "=== ablation plan: 2^1 full factorial, full (no aliasing), 2 cells x 1 seed(s) = 2 runs ===" in out
    assert "A0:7   clip-higher-  -> runs/A0/seed7" in out and "can separate" in out
    assert not grid.exists()

    # 2. launched, and stopped by SIGTERM while its first run starts
    first = grid / "runs" / "A0" / "seed7" / "config.json"
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 300
        while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert first.exists(), proc.communicate(timeout=60)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        left = leftovers(proc)
    assert not left, left
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    rec = [json.loads(x) for x in open(grid / "launch.jsonl")]
    assert [(r["key"], r["action"], r.get("interrupted")) for r in rec] == [("A0:7", "new", "SIGTERM")]
    assert session_pids(rec[0]["pid"]) == []  # the trainer's session (its Ray included) has ended
    plan = load_plan(str(grid))
    assert "2 runs: 1 incomplete, 1 missing" in format_states(plan, grid_states(plan))

    # 3. the rerun fills what is missing
    p = run_in_session([*tool, "run", "--grid", str(grid)], 900, env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:] + "".join(
        open(grid / "logs" / f).read()[-3000:] for f in os.listdir(grid / "logs")
    )
    assert not p.leftovers
    assert "[ablate] 2 run(s) to launch, 0 already done" in out
    assert "A0:7 (clip-higher-): restart" in out and "A1:7 (clip-higher+): new" in out
    aside = [d for d in os.listdir(grid / "runs" / "A0" / "seed7") if d.startswith("aside-")]
    assert aside and os.path.exists(grid / "runs" / "A0" / "seed7" / aside[0] / "config.json")  # moved, not deleted
    for cell, eps in (("A0", 0.2), ("A1", 0.28)):
        run_dir = grid / "runs" / cell / "seed7"
        cfg = json.load(open(run_dir / "config.json"))
        assert cfg["algo"]["eps_clip_high"] == eps and cfg["optim"]["seed"] == 7
        rows = [json.loads(x) for x in open(run_dir / "metrics.jsonl")]
        assert [r["step"] for r in rows] == [1] and "eval/heldout/pass@1" in rows[0]

    # 4. the report
    report = (grid / "report" / "report.md").read_text()
    assert "## Runs: 2 of 2 done (done 2)" in report
    assert "Outcome metric: `eval/heldout/pass@1`, held-out accuracy" in report
    assert "| A: clip-higher |" in report and "Replicates used: seed 7." in report
    js = json.load(open(grid / "report" / "report.json"))
    acc = {r["key"]: r["outcomes"]["final"] for r in js["runs"]}
    eff = [e for e in js["effects"]["final"] if e["effect"] == "A"][0]
    assert eff["estimate"] == pytest.approx(acc["A1:7"] - acc["A0:7"]) and eff["ci"] is None  # one seed: no interval
    assert all(r["diagnosis"] for r in js["runs"])
    for png in ("effects.png", "main_effects.png"):
        assert os.path.getsize(grid / "report" / png) > 0

    # 5. nothing left to do
    said = []
    assert launch_local(plan, echo=said.append)["ran"] == [] and said == ["[ablate] 0 run(s) to launch, 2 already done"]
