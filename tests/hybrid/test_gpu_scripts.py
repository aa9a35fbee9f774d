"""The scripts prepared for the first GPU run their CPU smoke mode (same code, fp32, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(args, tmp_path, timeout=600):
    """Run a script with its own temporary directory (TMPDIR): the tiny model it writes there is
    gone afterwards (torch's own caches, such as torchinductor_<user>, may stay)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", TMPDIR=str(scratch))
    p = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()
    if p.returncode == 0:
        left = [n for n in os.listdir(scratch) if n.startswith(("dapo_step_hf_", "feed_tp2_hf_"))]
        assert left == [], out[-2000:]
    return p.returncode, out


@pytest.mark.slow
def test_gpu_dapo_step_small_runs_the_hybrid_step(tmp_path):
    rc, out = _run(["benchmarks/gpu_dapo_step.py", "--small"], tmp_path)
    assert rc == 0, out[-4000:]
    lines = [l for l in out.splitlines() if l.startswith("[dapo-step]")]
    stages = [l.split()[1] for l in lines[:-1]]
    assert stages == [
        "build",
        "init-sync",
        "generate",
        "to-train",
        "old-logprob",
        "train",
        "sync+probe",
        "generate",
        "score",
    ]
    assert "trainer_offload" in out and "probe_engine" in out
    sync = next(l for l in lines if l.split()[1] == "sync+probe")
    fields = dict(f.split("=", 1) for f in sync.split() if "=" in f)
    assert int(fields["checksums"]) > 10, sync  # the exact half of the check compared every tensor
    assert lines[-1].startswith("[dapo-step] PASS probe")


@pytest.mark.slow
def test_gpu_feed_check_small_feeds_one_engine_from_two_ranks(tmp_path):
    rc, out = _run(["benchmarks/gpu_feed_check.py", "--small", "--bucket-kb", "64"], tmp_path)
    assert rc == 0, out[-4000:]
    syncs = [l for l in out.splitlines() if l.startswith("[feed-tp2] sync")]
    assert len(syncs) == 2, out[-4000:]
    for line in syncs:
        fields = dict(f.split("=", 1) for f in line.split()[3:] if "=" in f and not f.startswith("protocol"))
        assert int(fields["buckets"]) >= 6 and fields["mismatched"] == "0", line
        # the layout of production: the engine in a process of its own, never in the feeder that
        # exported the payload's handles (on the H200 that layout failed: "invalid device context")
        assert fields["engine_pid"] != fields["feeder_pid"], line
    assert out.rstrip().endswith("[feed-tp2] PASS")
