"""--slurm: the job array is written and submitted with a stand-in sbatch on PATH; one array task
then runs as Slurm would start it (stand-in scontrol/srun from tests/launch/fake_slurm, DRY_RUN=1):
it asks which flags its run needs and calls examples/slurm/submit_dapo.sbatch, whose driver dry
run (the real megatron_dapo.train --dry-run) validates the cell's configuration."""

import json
import os

import pytest

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.launch.procs import run_in_session

pytestmark = [pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE_SLURM = os.path.join(ROOT, "tests", "launch", "fake_slurm")

FAKE_SBATCH = """#!/bin/sh
# stand-in sbatch: record the arguments, answer like `sbatch --parsable`
printf '%s\\n' "$@" > "$SBATCH_ARGS"
if [ -n "$FAKE_SBATCH_FAIL" ]; then echo "sbatch: error: invalid partition specified: nope" >&2; exit 1; fi
echo "4242;cluster"
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"), 16)


def test_slurm_array_submitted_and_one_task_run_under_fake_slurm(tmp_path, tiny, monkeypatch, capsys):
    from megatron_dapo.ablation.cli import main
    from megatron_dapo.ablation.plan import load_plan
    from tests.ablation.synthetic import write_config, write_metrics

    hf, prompts = tiny
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(FAKE_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_ARGS", str(tmp_path / "sbatch_args"))
    monkeypatch.chdir(tmp_path)
    grid = tmp_path / "grid"
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
        "--max-prompt-length",
        "64",
        "--max-response-length",
        "8",
        "--overlong-buffer-length",
        "4",
        "--num-rollout",
        "2",
        "--wandb-mode",
        "disabled",
    ]
    argv = [
        "run",
        "--grid",
        str(grid),
        "--factors",
        "clip-higher",
        "--slurm",
        "--sbatch-arg=--partition=gpu",
        "--max-parallel",
        "2",
        "--slurm-time",
        "2:00:00",
        "--",
        *base,
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[ablate] submitted job array 4242: 2 run(s) (A0:1, A1:1)" in out
    args = (tmp_path / "sbatch_args").read_text().splitlines()
    assert args[:2] == ["--parsable", "--partition=gpu"] and args[2].startswith(str(grid / "slurm" / "array-"))
    script = open(args[2]).read()
    for line in (
        "#SBATCH --array=0-1%2",
        "#SBATCH --nodes=1",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --time=2:00:00",
        f"#SBATCH --output={grid}/logs/slurm-%A_%a.out",
        "examples/slurm/submit_dapo.sbatch",
    ):
        assert line in script, line
    tasks = [x for x in os.listdir(grid / "slurm") if x.startswith("tasks-")]
    assert (grid / "slurm" / tasks[0]).read_text() == "A0:1\nA1:1\n"
    sub = [json.loads(x) for x in open(grid / "slurm" / "submissions.jsonl")]
    assert sub[0]["job"] == "4242" and sub[0]["runs"] == ["A0:1", "A1:1"]

    # array task 1 (A1: clip-higher on), as Slurm starts it; DRY_RUN=1: submit_dapo prints its plan and runs the
    # driver's dry run instead of starting Ray
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("RAY_ADDRESS", "DRY_RUN")}
    env.update(
        PATH=f"{FAKE_SLURM}:{env['PATH']}",
        PYTHONPATH=ROOT,
        SLURM_JOB_ID="99",
        SLURM_ARRAY_JOB_ID="4242",
        SLURM_ARRAY_TASK_ID="1",
        SLURM_JOB_NODELIST="fakehead",
        DRY_RUN="1",
    )
    t = run_in_session(["bash", args[2]], 300, env=env, cwd=tmp_path)
    out = t.stdout + t.stderr
    assert t.returncode == 0, out[-4000:]
    assert not t.leftovers
    assert "ablate: A1:1 (array task 1)" in out
    assert "[submit_dapo] dry run (job 99)" in out and "nodes (1): fakehead" in out
    assert f"--eps-clip-high 0.28 --seed 1 --run-dir {grid}/runs/A1/seed1" in out
    assert "=== megatron-dapo dry run: configuration valid, nothing started ===" in out
    assert "DAPO: eps 0.2/0.28" in out
    rec = [json.loads(x) for x in open(grid / "launch.jsonl")]
    assert rec[-1]["key"] == "A1:1" and rec[-1]["slurm_job"] == "4242" and rec[-1]["slurm_task"] == "1"
    assert not (grid / "runs" / "A1" / "seed1").exists()  # a dry run writes nothing there

    # a resubmission holds only what is not done; sbatch's refusal is one line naming it
    a0 = load_plan(str(grid)).runs[0]
    write_config(a0)
    write_metrics(a0, [{"step": 1}, {"step": 2}])
    monkeypatch.setenv("FAKE_SBATCH_FAIL", "1")
    with pytest.raises(SystemExit) as e:
        main(["run", "--grid", str(grid), "--slurm"])
    assert e.value.code == 2
    assert (
        "--slurm: sbatch failed (exit 1: sbatch: error: invalid partition specified: nope)" in capsys.readouterr().err
    )
    monkeypatch.delenv("FAKE_SBATCH_FAIL")
    assert main(["run", "--grid", str(grid), "--slurm"]) == 0
    assert "submitted job array 4242: 1 run(s) (A1:1)" in capsys.readouterr().out
