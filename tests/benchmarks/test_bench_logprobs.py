"""benchmarks/bench_logprobs.py runs (a small shape) and compares like with like."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_small_benchmark_prints_the_ratios():
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_logprobs.py"),
            "--tokens",
            "256",
            "--vocab",
            "1024",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-3:]
    assert [line.split(":")[0] for line in last] == [
        "train fwd+bwd (logprobs + entropy) / megatron CE",
        "train fwd+bwd with entropy gradient / megatron CE",
        "old-logprob forward / megatron CE forward",
    ]
    assert all(float(line.rsplit(":", 1)[1]) > 0 for line in last)
