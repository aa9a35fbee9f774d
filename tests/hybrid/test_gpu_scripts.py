"""The scripts prepared for the first GPU run their CPU smoke mode (same code, fp32, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, timeout=600):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    return p.returncode, out


@pytest.mark.slow
def test_gpu_dapo_step_small_runs_the_hybrid_step():
    rc, out = _run(["benchmarks/gpu_dapo_step.py", "--small"])
    assert rc == 0, out[-4000:]
    lines = [l for l in out.splitlines() if l.startswith("[dapo-step]")]
    stages = [l.split()[1] for l in lines[:-1]]
    assert stages == ["build", "init-sync", "generate", "to-train", "old-logprob", "train", "sync+probe", "generate",
                      "score"]
    assert "trainer_offload" in out and "probe_engine" in out
    assert lines[-1].startswith("[dapo-step] PASS probe")
