"""benchmarks/gpu_check.py --small: every section of the GPU check (build, train, weight-sync
buckets, the probe's megatron half through the trainer's logprob path, offload) runs its
logic on the CPU with gloo, so a lent GPU's first run does not meet a Python error."""

import os
import sys

import pytest

from megatron_dapo.distributed import free_port
from tests.launch.procs import run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow]


def test_every_section_passes_on_the_cpu():
    done = run_in_session(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--small", "--port", str(free_port())],
        timeout=600,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert not done.leftovers, done.leftovers
    for name in ("env", "nccl", "build", "train", "sync", "probe", "offload", "lora"):
        assert any(line.startswith(f"PASS  {name}") for line in out.splitlines()), (name, out[-3000:])
    assert "8/8 sections passed" in out
