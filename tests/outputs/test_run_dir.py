"""A run never deletes or overwrites what it did not write (megatron_dapo/outputs/run_dir.py):
the run directory and --save are checked before anything is written, --start-over moves what is
in the way aside, and the real driver leaves a previous run's files as they were when it refuses
(or when it fails on a mistyped path)."""

import json
import os
import subprocess
import sys

import pytest
import torch

from megatron_dapo.config import ConfigError, parse_args
from megatron_dapo.driver.logging import MetricsLogger
from megatron_dapo.outputs import checkpoint_dirs as cd
from megatron_dapo.outputs import run_lock
from megatron_dapo.outputs.run_dir import prepare_outputs
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cfg(run_dir, *extra):
    return parse_args(["--run-dir", str(run_dir), *extra])


def _previous_run(run_dir):
    os.makedirs(run_dir / "rollouts")
    (run_dir / "config.json").write_text('{"old": true}')
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run_dir / "hybrid_events.jsonl").write_text('{"step": 0}\n')
    (run_dir / "rollouts" / "step_000001.jsonl").write_text("{}\n")
    (run_dir / "notes.txt").write_text("the user's own")


def _checkpoint(save, step, run_id):
    os.makedirs(cd.tmp_dir(str(save), step))
    torch.save({"step": step, "run_id": run_id}, os.path.join(cd.tmp_dir(str(save), step), cd.STATE_FILE))
    cd.commit(str(save), step, 10, run_id)


def _tree(d):
    """The files under ``d``, the live run's lock file (this test process's) left out."""
    return sorted(
        os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs if f != run_lock.LOCK_NAME
    )


@pytest.fixture(autouse=True)
def _release_locks():
    yield
    run_lock.release_all()


def test_fresh_run_refuses_a_previous_runs_directory_then_start_over_moves_it_aside(tmp_path):
    run = tmp_path / "run"
    _previous_run(run)
    before = _tree(run)
    with pytest.raises(
        ConfigError,
        match=r"--run-dir .*run holds a previous run's files \(config.json, metrics.jsonl, "
        r"hybrid_events.jsonl\).*--load.*new --run-dir.*--start-over",
    ):
        prepare_outputs(_cfg(run))
    assert _tree(run) == before
    dry = prepare_outputs(_cfg(run, "--start-over"), dry_run=True)
    assert any("would move 4 entries aside" in line for line in dry.lines) and _tree(run) == before
    out = prepare_outputs(_cfg(run, "--start-over"))
    aside = [n for n in os.listdir(run) if n.startswith("aside-")]
    assert len(aside) == 1 and sorted(os.listdir(run)) == sorted(
        aside + ["notes.txt", run_lock.LOCK_NAME]
    )  # not the user's file
    assert _tree(run / aside[0]) == [
        "config.json",
        "hybrid_events.jsonl",
        "metrics.jsonl",
        "rollouts/step_000001.jsonl",
    ]
    assert out.resume_dir is None and len(out.run_id) == 16


def test_fresh_run_refuses_another_runs_checkpoints_and_keeps_a_save_dir_inside_the_run_dir(tmp_path):
    run, save = tmp_path / "run", tmp_path / "run" / "ckpt"
    _previous_run(run)
    _checkpoint(save, 4, "old-run")
    with pytest.raises(ConfigError, match=r"--run-dir"):
        prepare_outputs(_cfg(run, "--save", str(save)))
    (run / "config.json").unlink(), (run / "metrics.jsonl").unlink(), (run / "hybrid_events.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"--save .*ckpt holds checkpoints of another run \(step_000004\)"):
        prepare_outputs(_cfg(run, "--save", str(save)))
    _previous_run_files = ["config.json"]
    (run / _previous_run_files[0]).write_text("{}")
    out = prepare_outputs(_cfg(run, "--save", str(save), "--start-over"))
    assert os.path.isdir(save) and cd.steps(str(save)) == []  # the save dir stayed where it is, emptied by a move
    moved = [n for n in os.listdir(save) if n.startswith("aside-")]
    assert len(moved) == 1 and sorted(os.listdir(save / moved[0])) == ["latest", "step_000004"]
    assert any("moved" in line for line in out.lines)


def test_resume_accepts_its_own_run_and_refuses_a_rollback_without_start_over(tmp_path):
    run, save = tmp_path / "run", tmp_path / "save"
    _previous_run(run)
    for s in (5, 8, 9):
        _checkpoint(save, s, "R")
    out = prepare_outputs(_cfg(run, "--save", str(save), "--load", str(save)))
    assert (out.run_id, out.resume_step) == ("R", 9) and out.resume_dir.endswith("step_000009")
    with pytest.raises(ConfigError, match=r"after step 5 \(2 checkpoints, step_000008 .. step_000009\).*--start-over"):
        prepare_outputs(_cfg(run, "--save", str(save), "--load", str(save / "step_000005")))
    prepare_outputs(_cfg(run, "--save", str(save), "--load", str(save / "step_000005"), "--start-over"))
    assert [n for _, n in cd.steps(str(save))] == ["step_000005"]


def test_bad_load_and_unwritable_paths_are_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"--load .*nothing: no checkpoint found"):
        prepare_outputs(_cfg(tmp_path / "run", "--load", str(tmp_path / "nothing")))
    bad = tmp_path / "step_000003"
    bad.mkdir()
    (bad / cd.STATE_FILE).write_bytes(b"truncated")
    with pytest.raises(ConfigError, match=r"trainer_state.pt cannot be read"):
        prepare_outputs(_cfg(tmp_path / "run", "--load", str(bad)))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"--save .*file/ckpt: cannot write there"):
        prepare_outputs(_cfg(tmp_path / "run", "--save", str(tmp_path / "file" / "ckpt")))


def test_resume_truncation_keeps_the_dropped_metrics_aside(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    log = MetricsLogger(str(tmp_path), {}, None, "disabled", False)
    assert log.truncate_after(3) is None  # nothing dropped, nothing copied
    kept = log.truncate_after(1)
    assert [json.loads(x)["step"] for x in open(tmp_path / "metrics.jsonl")] == [1]
    assert [json.loads(x)["step"] for x in open(kept)] == [1, 2, 3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"))


def _train(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("MEGATRON_DAPO_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "megatron_dapo.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_the_driver_leaves_a_previous_run_untouched_when_it_refuses_or_fails(tiny, tmp_path):
    hf, prompts = tiny
    run = tmp_path / "run"
    _previous_run(run)
    before = {p: (run / p).read_bytes() for p in _tree(run)}
    base = [
        "--hf-checkpoint",
        hf,
        "--run-dir",
        str(run),
        "--wandb-mode",
        "disabled",
        "--num-rollout",
        "1",
        "--max-prompt-length",
        "64",
        "--max-response-length",
        "12",
        "--overlong-buffer-length",
        "4",
    ]
    p = _train(*base, "--prompt-data", str(tmp_path / "typo.jsonl"))  # fails on the mistyped path
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(p.stderr.strip().splitlines()) == 1 and "typo.jsonl" in p.stderr, p.stderr
    p = _train(*base, "--prompt-data", prompts)  # a fresh run into the previous run's directory
    assert p.returncode == 2 and "holds a previous run's files" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert {q: (run / q).read_bytes() for q in _tree(run)} == before  # config.json, metrics, events: as they were
