"""The local launcher (megatron_dapo/ablation/launch.py) with a stand-in trainer (``--python``):
SIGTERM stops the running run and everything it started (a grandchild that ignores SIGTERM is
killed after --kill-grace), a rerun fills only what is missing (the killed run started over with
--start-over, its files moved aside by the trainer), a crashing run is reported with its log, a
run directory holding another run is never touched. The real trainer: tests/ablation/test_ablation_e2e.py."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_dapo.ablation.launch import format_states, grid_states, launch_local
from megatron_dapo.ablation.plan import AblationError, build_plan, expected_config, load_plan, resolve_factors
from tests.ablation.synthetic import base_args, unflatten
from tests.launch.procs import leftovers, run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_TRAINER = r"""
import json, os, shutil, signal, subprocess, sys, time

assert sys.argv[1:3] == ["-m", "megatron_dapo.train"], sys.argv
args = sys.argv[3:]
val = lambda f: args[args.index(f) + 1]
rd, steps = val("--run-dir"), int(val("--num-rollout"))
cell = os.path.basename(os.path.dirname(rd))
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"cell": cell, "start_over": "--start-over" in args}) + "\n")
present = [m for m in ("config.json", "metrics.jsonl") if os.path.exists(os.path.join(rd, m))]
if present:  # what the real trainer does (outputs/run_dir.py)
    if "--start-over" not in args:
        print(f"--run-dir {rd} holds a previous run's files", file=sys.stderr)
        sys.exit(2)
    aside = os.path.join(rd, "aside-1")
    os.makedirs(aside)
    for m in present:
        shutil.move(os.path.join(rd, m), aside)
os.makedirs(rd, exist_ok=True)
with open(os.environ["FAKE_CONFIGS"]) as f:  # the config.json the real trainer writes (computed by the test)
    cfg = json.load(f)[rd]
cfg["checkpoint"]["start_over"] = "--start-over" in args
with open(os.path.join(rd, "config.json"), "w") as f:
    json.dump(cfg, f)
print("fake trainer:", cell, flush=True)
if os.environ.get("FAKE_MODE") == "hang":
    # a grandchild that ignores SIGTERM, then wait to be stopped
    g = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(600)"])
    with open(os.environ["FAKE_READY"], "w") as f:
        f.write(str(g.pid))
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    time.sleep(600)
if os.environ.get("FAKE_CRASH_CELL") == cell:
    print("Traceback: a bug in step 2", file=sys.stderr)
    sys.exit(1)
with open(os.path.join(rd, "metrics.jsonl"), "w") as f:
    for s in range(1, steps + 1):
        f.write(json.dumps({"step": s, "acc_mean": 0.25 + 0.1 * s * (cell == "A1"), "time_step": 1.0}) + "\n")
"""


def setup(tmp_path):
    """The ablate command with the stand-in trainer (which writes the config.json each run's flags give:
    computed here, so that the stand-in starts in a blink), its environment and the plan."""
    fake = tmp_path / "fake-python"
    (tmp_path / "fake_trainer.py").write_text(FAKE_TRAINER)
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_trainer.py"} "$@"\n')
    fake.chmod(0o755)
    base = base_args(tmp_path)
    grid = tmp_path / "grid"
    plan = build_plan(str(grid), base, resolve_factors("clip-higher", []), [1], cwd=str(tmp_path))
    (tmp_path / "configs.json").write_text(
        json.dumps({r.run_dir: unflatten(expected_config(r.argv)) for r in plan.runs})
    )
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        FAKE_LOG=str(tmp_path / "calls.jsonl"),
        FAKE_READY=str(tmp_path / "ready"),
        FAKE_CONFIGS=str(tmp_path / "configs.json"),
    )
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "ablate.py"),
        "run",
        "--grid",
        str(grid),
        "--factors",
        "clip-higher",
        "--python",
        str(fake),
        "--kill-grace",
        "3",
        "--no-plot",
        "--",
        *base,
    ]
    return cmd, env, fake


def calls(tmp_path):
    p = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_stops_the_run_and_a_rerun_fills_what_is_missing(tmp_path):
    cmd, env, fake = setup(tmp_path)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**env, "FAKE_MODE": "hang"},
        cwd=tmp_path,
    )
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "ready").exists(), proc.communicate(timeout=30)
        grandchild = int((tmp_path / "ready").read_text())
        assert alive(grandchild)
        # a second launcher of the same grid would start the running run over: refused
        with pytest.raises(AblationError, match=r"another launch of this grid is running \(pid \d+ since "):
            launch_local(load_plan(str(tmp_path / "grid")), echo=lambda s: None, python=str(fake))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        left = leftovers(proc)
    assert not left, left
    assert proc.returncode == 128 + signal.SIGTERM, out + err
    assert "SIGTERM: stopping A0:1" in out and "interrupted (SIGTERM): rerun the same command to go on" in out
    assert "killed 1 process(es) left in A0:1's session" in out  # the grandchild that ignored SIGTERM
    assert not alive(grandchild)
    rec = [json.loads(x) for x in open(tmp_path / "grid" / "launch.jsonl")]
    assert [(r["key"], r["action"], r["rc"], r.get("interrupted")) for r in rec] == [("A0:1", "new", 143, "SIGTERM")]
    plan = load_plan(str(tmp_path / "grid"))
    st = format_states(plan, grid_states(plan))
    assert "2 runs: 1 incomplete, 1 missing" in st and "last launch exited 143 (SIGTERM)" in st

    # the rerun: the killed run starts over (its files moved aside, nothing deleted), the missing one starts
    p = run_in_session(cmd, 300, env={**env, "FAKE_MODE": "ok"}, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert not p.leftovers
    assert calls(tmp_path) == [
        {"cell": "A0", "start_over": False},
        {"cell": "A0", "start_over": True},
        {"cell": "A1", "start_over": False},
    ]
    assert "[ablate] 2 run(s) to launch, 0 already done" in p.stdout
    assert "A0:1 (clip-higher-): restart" in p.stdout and "A1:1 (clip-higher+): new" in p.stdout
    assert (tmp_path / "grid" / "runs" / "A0" / "seed1" / "aside-1" / "config.json").exists()
    assert "## Runs: 2 of 2 done" in p.stdout and "| A: clip-higher | +0.4 |" in p.stdout  # acc_mean at step 4
    log = (tmp_path / "grid" / "logs" / "A0-seed1.log").read_text()
    assert log.count("=== ") == 2 and "fake trainer: A0" in log
    # once more: nothing to do
    said = []
    assert launch_local(plan, echo=said.append, python=str(fake)) == {
        "ran": [],
        "failed": [],
        "skipped": [],
        "interrupted": None,
    }
    assert said == ["[ablate] 0 run(s) to launch, 2 already done"] and len(calls(tmp_path)) == 3


def test_a_crashed_run_is_reported_and_a_foreign_run_dir_never_touched(tmp_path):
    cmd, env, fake = setup(tmp_path)
    p = run_in_session(cmd, 300, env={**env, "FAKE_MODE": "ok", "FAKE_CRASH_CELL": "A1"}, cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "A1:1: FAILED (exit 1, incomplete: no step finished of 4; last launch exited 1, log " in p.stdout
    assert "    Traceback: a bug in step 2" in p.stdout  # the end of its log
    assert "2 runs: 1 done, 1 incomplete" in p.stdout
    assert "`A1:1` (clip-higher+): **incomplete**" in p.stdout and "seed 1 left out (A1 incomplete)" in p.stdout
    report = tmp_path / "grid" / "report" / "report.md"
    assert "**incomplete**" in report.read_text()
    # a run directory that holds another configuration: not launched, reported
    a1 = tmp_path / "grid" / "runs" / "A1" / "seed1" / "config.json"
    cfg = json.loads(a1.read_text())
    cfg["optim"]["lr"] = 0.5
    a1.write_text(json.dumps(cfg))
    said = []
    summary = launch_local(load_plan(str(tmp_path / "grid")), echo=said.append, python=str(fake))
    assert summary["failed"] == ["A1:1"] and summary["ran"] == []
    assert said[0].startswith("[ablate] A1:1: NOT launched: ") and "optim.lr (0.5, plan 1e-06)" in said[0]
    assert len(calls(tmp_path)) == 2
