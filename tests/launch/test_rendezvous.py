"""The trainers' rendezvous on a cluster whose nodes have different addresses and the driver
sits on a third (tests/launch/rendezvous_check.py): Ray nodes in network namespaces of their
own (a port opened on one is not reachable from another except at its address, as between
hosts), all inside fresh PID, network and mount namespaces that end every process with them."""

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, run_in_session

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow]
DRIVER_TIMEOUT_S = (
    180  # the cluster is up in < 1 min on 2 loaded cores; with the rendezvous at the wrong address, never
)


def _namespaces():
    """The unshare prefix that gives PID, network and mount namespaces (a user namespace too
    when not root), or None where this machine refuses them."""
    base = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--mount"]
    if os.geteuid() != 0:
        base[1:1] = ["--user", "--map-root-user"]
    if not shutil.which("unshare") or not shutil.which("nsenter") or not shutil.which("ip"):
        return None
    probe = subprocess.run(
        base + ["sh", "-c", "ip link add br0 type bridge && mount -t tmpfs tmpfs /dev/shm"],
        capture_output=True,
        timeout=60,
    )
    return base if probe.returncode == 0 else None


def test_trainers_rendezvous_on_rank0s_node_not_the_drivers(tmp_path):
    from tests.e2e.fixtures import make_tiny_qwen2_dir

    prefix = _namespaces()
    if prefix is None:
        pytest.skip("this machine does not allow PID/network/mount namespaces (unshare) or lacks ip/nsenter")
    make_tiny_qwen2_dir(str(tmp_path / "hf"))
    temp = f"/tmp/rt-{uuid.uuid4().hex[:8]}"  # Ray's socket paths must stay short
    cmd = prefix + [
        "bash",
        "-c",
        'python="$1"; shift; "$python" "$@"; rc=$?; exit $rc',
        "bash",
        sys.executable,
        str(HERE / "rendezvous_check.py"),
        "orchestrate",
        str(tmp_path),
        temp,
        str(DRIVER_TIMEOUT_S),
    ]
    try:
        done = run_in_session(
            cmd, timeout=DRIVER_TIMEOUT_S + 300, grace_s=RAY_SHUTDOWN_GRACE_S, pattern=temp, cwd=tmp_path
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    out = done.stdout + done.stderr
    assert not done.leftovers, f"processes left running: {done.leftovers}"
    assert done.returncode == 0, out[-6000:]
    for line in (
        "OK three network namespaces",
        "OK Ray nodes up",
        "by address), the driver on 10.231.0.4",
        "OK all_reduce over the two nodes",
        "OK megatron TP 2 forward across the two nodes",
    ):
        assert line in done.stdout, out[-6000:]
