"""The driver's weight sync over Ray on a local two-node cluster (tests/hybrid/ray_sync_check.py,
in its own process so that its cluster never meets the session's Ray)."""

import os
import sys
from pathlib import Path

import pytest

from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, private_ray_tmpdir, run_in_session

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow]


def test_two_nodes_each_engine_fed_from_its_node(tmp_path):
    """TP 2 and PP 2 in turn on one two-node Ray cluster (one cluster start for both)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    with private_ray_tmpdir() as ray_tmp:
        done = run_in_session(
            [sys.executable, str(HERE / "ray_sync_check.py"), str(tmp_path), "2x1", "1x2"],
            timeout=600,
            grace_s=RAY_SHUTDOWN_GRACE_S,  # grace: its cluster's own shutdown
            env={**env, "RAY_TMPDIR": ray_tmp},
        )
    proc, stdout, stderr, left = done, done.stdout, done.stderr, done.leftovers
    out = stdout + stderr
    assert proc.returncode == 0, out[-5000:]
    assert not left, f"ray_sync_check.py left processes running: {left}"
    assert "OK TP 2 x PP 1" in stdout and "OK TP 1 x PP 2" in stdout, out[-5000:]
    for line in (
        "on its own node",
        "object store bytes per sync",
        "exactly the trainer's weights",
        "re-synced alone",
        "no shared-memory file outlived",
    ):
        assert stdout.count(line) >= 2, (line, out[-5000:])  # once per layout (sync: twice each)
    assert "OK all ray sync checks" in stdout, out[-5000:]
