"""benchmarks/bench_lora.py runs and prints its numbers (its figures: docs/benchmarks.md)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_lora_prints_the_computed_32b_numbers_and_the_measured_ratio():
    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_lora.py"), "--rank", "4", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.strip().splitlines()
    assert any(line.startswith("trainable parameters: full 32.76B, LoRA 33.6M") for line in lines), lines
    assert lines[-1].startswith("adapter sync time over full sync: ")
    float(lines[-1].rsplit(" ", 1)[1])
