"""The stop of a run is bounded (issue 38, item 7): after SIGTERM (or Ctrl-C) the driver's
cleanup gets driver/signals.STOP_BOUND_S, then the driver exits with the signal's code anyway;
its Ray node is then ended by the reaper (tests/launch/test_ray_reaper.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the real SIGTERM handler; a cleanup that hangs (as Ray's shutdown waiting on a GCS that is gone)
_HANGING_CLEANUP = r"""
import sys, time
from megatron_dapo.driver import signals
signals.STOP_BOUND_S = float(sys.argv[1])
try:
    signals.stop_on_sigterm()
    print("ready", flush=True)
    time.sleep(60)
except signals.Terminated:
    time.sleep(60)  # the cleanup never ends by itself
"""


def test_a_cleanup_that_hangs_after_sigterm_is_cut_at_the_bound():
    bound = 2.0
    p = subprocess.Popen(
        [sys.executable, "-c", _HANGING_CLEANUP, str(bound)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=50)
        elapsed = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert code == 128 + signal.SIGTERM, err
    assert elapsed >= bound, elapsed  # the cleanup had its time
    lines = err.strip().splitlines()
    assert lines[0] == "megatron_dapo.train: SIGTERM: stopping the run (checkpoints already committed are kept)"
    assert lines[-1].startswith(f"megatron_dapo.train: SIGTERM: the cleanup took more than {bound:.0f} s, exiting now")
    assert "Traceback" not in err
