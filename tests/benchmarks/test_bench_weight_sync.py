"""benchmarks/bench_weight_sync.py's Ray part runs through the driver's Cluster (small model,
2 engines) and prints its lines; the sync moves no bytes through Ray's object store."""

import os
import sys

import pytest

from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, run_in_session

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow]


def test_small_ray_part_prints_its_lines():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    done = run_in_session(
        [
            sys.executable,
            os.path.join(ROOT, "benchmarks", "bench_weight_sync.py"),
            "--small",
            "--ray-only",
            "--engines",
            "2",
            "--repeats",
            "1",
            "--ray-bucket-mb",
            "2",
        ],
        timeout=420,
        grace_s=RAY_SHUTDOWN_GRACE_S,
        env=env,
    )
    proc, out, err, left = done, done.stdout, done.stderr, done.leftovers
    assert proc.returncode == 0, (out + err)[-4000:]
    assert not left, f"bench_weight_sync.py left processes running: {left}"
    last = dict(line.rsplit(": ", 1) for line in out.strip().splitlines()[-4:])
    assert set(last) == {
        "sync CPU-seconds per engine, 2 engines over 1",
        "sync weak scaling 1->2 engines",
        "object store bytes per sync",
        "sync/memcpy ratio",
    }, out[-2000:]
    assert int(last["object store bytes per sync"]) < 2**20
    assert all(float(v) > 0 for k, v in last.items() if k != "object store bytes per sync"), last
