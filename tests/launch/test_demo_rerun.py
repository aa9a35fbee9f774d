"""README's main command resumes when re-run after an interruption (issue 38, item 8): the real
script's decision (examples/run_smollm2_cpu.sh --print-plan: it decides, prints and exits before
setting anything up)."""

from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _plan(run_dir, *args) -> list[str]:
    env = dict(os.environ, RUN_DIR=str(run_dir))
    p = subprocess.run(
        ["bash", "examples/run_smollm2_cpu.sh", "--print-plan", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()


def test_the_demo_starts_fresh_then_resumes_from_its_last_checkpoint_unless_told_fresh(tmp_path):
    run = tmp_path / "run"
    plan, train = _plan(run)
    assert plan == f"[demo] plan: start {run} fresh", plan
    assert "--pretrained-checkpoint" in train and "--start-over" in train and "--load" not in train, train
    assert not run.exists()  # --print-plan sets up nothing

    (run / "checkpoints").mkdir(parents=True)  # an interrupted run: its checkpoint and 'latest'
    (run / "checkpoints" / "latest").write_text("step_000006\n")
    plan, train = _plan(run, "--num-rollout", "20")
    assert plan == f"[demo] plan: resume {run} from step_000006", plan
    assert f"--load {run}/checkpoints" in train and "--start-over" not in train, train
    assert train.endswith("--num-rollout 20"), train  # the user's flags go on to the trainer

    plan, train = _plan(run, "--fresh")
    assert plan == f"[demo] plan: start {run} fresh", plan
    assert "--start-over" in train and "--load" not in train and "--fresh" not in train, train
    plan, train = _plan(run, "--dry-run")  # a dry run of the resume: validates the --load
    assert "resume" in plan and "--load" in train and train.endswith("--dry-run"), train
