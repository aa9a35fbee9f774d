"""A driver's Ray node ends with it, however it ends (launch/ray_reaper.py; issue 38, item 7):
the reaper against real processes, and a real run killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from megatron_dapo.launch import ray_reaper
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.launch.procs import alive, leftovers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a driver that starts two processes that would outlive it (their own sessions, as Ray's agents
# end up re-parented to init), one that ends by itself, hands them to a reaper and waits
_DRIVER = r"""
import subprocess, sys, time
from megatron_dapo.launch import ray_reaper
stay = [subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(2)]
quick = subprocess.Popen(["sleep", "0.5"], start_new_session=True)
ray_reaper.watch([p.pid for p in stay] + [quick.pid], grace_s=float(sys.argv[1]))
print(" ".join(str(p.pid) for p in stay), quick.pid, flush=True)
time.sleep(300)
"""


def test_the_reaper_ends_the_node_after_the_driver_is_killed_and_only_after_its_grace(tmp_path):
    grace = 3.0
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, str(grace)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids = []
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
        assert len(pids) == 3, p.stderr.read()
        stay, quick = pids[:2], pids[2]
        time.sleep(1.0)
        assert all(alive(x) for x in stay)  # nothing is touched while the driver lives
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        p.wait(timeout=30)
        time.sleep(grace / 2)
        assert all(alive(x) for x in stay), "killed before the grace was over"
        while any(alive(x) for x in stay) and time.monotonic() - t0 < grace + 30:
            time.sleep(0.1)
        assert not any(alive(x) for x in stay), f"still alive {time.monotonic() - t0:.0f} s after the driver"
        line = p.stderr.read().strip().splitlines()[-1]  # the reaper's stderr is the driver's
        assert line == (
            f"[ray] the Ray node of driver {p.pid} outlived it by {grace:.0f} s: ended pids {stay[0]}, {stay[1]}"
        ), line
        assert str(quick) not in line  # it ended by itself
    finally:
        for x in pids:
            if alive(x):
                os.kill(x, signal.SIGKILL)
        leftovers(p)


def test_a_pid_reused_by_another_process_is_never_killed():
    other = subprocess.Popen(["sleep", "30"])
    try:
        started = ray_reaper._started(other.pid)
        assert ray_reaper.reap([(other.pid, started - 5.0)], grace_s=0.0) == []  # another start time: not ours
        assert other.poll() is None
        assert ray_reaper.reap([(other.pid, started)], grace_s=0.0) == [other.pid]
        assert other.wait(timeout=10) == -signal.SIGKILL
    finally:
        if other.poll() is None:
            other.kill()


@pytest.mark.slow
def test_a_run_killed_with_sigkill_leaves_no_ray_process_behind(tmp_path):
    """The real entry point, its local Ray node, an engine and a trainer rank; SIGKILL to the
    driver alone (the OOM killer, kill -9) mid-generation. Before the reaper, Ray's agents outlived
    it by about 60 s (their report to the dead GCS)."""
    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"), n=8)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MEGATRON_DAPO_DEBUG")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    args = ["--hf-checkpoint", hf, "--prompt-data", prompts, "--run-dir", str(tmp_path / "run"), "--wandb-mode"]
    args += ["disabled", "--num-rollout", "50", "--max-prompt-length", "64", "--max-response-length", "12"]
    args += ["--overlong-buffer-length", "4", "--reward-num-workers", "1", "--rollout-batch-size", "2"]
    args += ["--n-samples-per-prompt", "2", "--global-batch-size", "4", "--max-num-gen-batches", "1000"]
    p = subprocess.Popen(
        [sys.executable, "-m", "megatron_dapo.train", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    left = ["(not reached)"]
    try:
        line = ""
        while not line.startswith("[rollout] step 1: round"):  # generating, Ray's node fully up
            line = p.stdout.readline()
            assert line, "the driver ended before generating"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=60)
    finally:
        left = leftovers(p, grace_s=ray_reaper.REAP_GRACE_S + 20)  # Ray's own: 60 s and more
    assert left == [], left
