"""benchmarks/bench_weight_sync.py's Ray part runs through the driver's Cluster (small model,
2 engines) and prints its lines; the sync moves no bytes through Ray's object store."""

import os
import subprocess
import sys

import pytest

from tests.launch.procs import leftovers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.slow]


def test_small_ray_part_prints_its_lines():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "benchmarks", "bench_weight_sync.py"), "--small",
                             "--ray-only", "--engines", "2", "--repeats", "1", "--ray-bucket-mb", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=420)
    except subprocess.TimeoutExpired:
        leftovers(proc)
        out, err = proc.communicate()
        err += "\nbench_weight_sync.py timed out"
    finally:
        left = leftovers(proc, grace_s=15)
        proc.wait()
    assert proc.returncode == 0, (out + err)[-4000:]
    assert not left, f"bench_weight_sync.py left processes running: {left}"
    last = dict(line.rsplit(": ", 1) for line in out.strip().splitlines()[-4:])
    assert set(last) == {"sync CPU-seconds per engine, 2 engines over 1", "sync weak scaling 1->2 engines",
                         "object store bytes per sync", "sync/memcpy ratio"}, out[-2000:]
    assert int(last["object store bytes per sync"]) < 2**20
    assert all(float(v) > 0 for k, v in last.items() if k != "object store bytes per sync"), last
