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
    """TP 2 x PP 2 on a two-node Ray cluster: each node holds one pipeline stage (a TP pair), so
    each engine's weights come from its own node's ranks (the TP gather) and from the other
    node's stage (the PP exchange) in one layout. (The single-node layouts TP 2, PP 2 and
    TP 2 x PP 2 with two engines: tests/hybrid/test_transport.py; one cluster build per
    layout here costs about a minute on two cores.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    with private_ray_tmpdir() as ray_tmp:
        done = run_in_session(
            [sys.executable, str(HERE / "ray_sync_check.py"), str(tmp_path), "2x2"],
            timeout=600,
            grace_s=RAY_SHUTDOWN_GRACE_S,  # grace: its cluster's own shutdown
            env={**env, "RAY_TMPDIR": ray_tmp},
        )
    proc, stdout, stderr, left = done, done.stdout, done.stderr, done.leftovers
    out = stdout + stderr
    assert proc.returncode == 0, out[-5000:]
    assert not left, f"ray_sync_check.py left processes running: {left}"
    assert "OK TP 2 x PP 2" in stdout, out[-5000:]
    for line in (
        "on its own node",
        "object store bytes per sync",
        "exactly the trainer's weights",
        "re-synced alone",
        "no shared-memory file outlived",
    ):
        assert line in stdout, (line, out[-5000:])
    assert stdout.count("object store bytes per sync") == 2, out[-5000:]  # two syncs
    assert "OK all ray sync checks" in stdout, out[-5000:]
