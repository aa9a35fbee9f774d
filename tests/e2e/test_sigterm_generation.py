"""SIGTERM while a generation round is in progress (issue #24: "the run loop can never spin
silently ... SIGTERM stops it within seconds").

The driver (``megatron_dapo.train.main`` over a tiny real model, tests/e2e/sigterm_generation_driver.py)
waits in the real ``EnginePool.wait`` on two engine actors whose generation takes an hour.
SIGTERM to the driver alone (what scancel sends) must end it long before the round would have:
exit code 143, the engine actors killed by ``main``'s cleanup, no process of its session left
after Ray's own shutdown grace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, alive, leftovers

pytestmark = [pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Far below the round's hour, far above what a loaded machine needs to clean up (Ray's
#: ``ray.wait`` in the round returns every 5 s; killing two actors and ray.shutdown take seconds).
STOP_BOUND_S = 120


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_sigterm_during_a_generation_round_stops_the_run_and_its_engines(tmp_path, sig):
    """SIGTERM (scancel) and Ctrl-C (SIGINT, issue 38): one stopping line, no traceback, the same
    cleanup; exit codes 143 and 130."""
    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"), n=8)
    marker = tmp_path / "shutdown"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MEGATRON_DAPO_DEBUG")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    script = os.path.join(ROOT, "tests", "e2e", "sigterm_generation_driver.py")
    p = subprocess.Popen(
        [sys.executable, script, str(marker), hf, prompts, str(tmp_path / "run")],
        cwd=str(tmp_path),
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    left = ["(not reached)"]
    code = elapsed = None
    engine_pids = []
    try:
        line = ""
        while not line.startswith("generating"):  # preflight lines ([check] ...) come first
            line = p.stdout.readline()
            assert line, "the driver ended before generating:\n" + p.stderr.read()[-3000:]
        engine_pids = [int(x) for x in line.split()[1:]]
        assert len(engine_pids) == 2 and all(alive(x) for x in engine_pids), line
        time.sleep(3)  # inside the round: EnginePool.wait waits in ray.wait
        t0 = time.monotonic()
        os.kill(p.pid, sig)  # the driver only, as scancel (or a terminal's Ctrl-C to the driver) does
        try:
            code = p.wait(timeout=STOP_BOUND_S)
            elapsed = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            code = None
    finally:
        left = leftovers(p, grace_s=RAY_SHUTDOWN_GRACE_S)  # the whole session; killed if still there
        p.wait()
    stderr = p.stderr.read()
    assert code == 128 + sig, (
        f"exit code {code} (None: still running {STOP_BOUND_S} s after {sig!r}):\n{stderr[-3000:]}"
    )
    assert "Traceback" not in stderr, stderr[-3000:]
    if sig == signal.SIGTERM:
        assert "SIGTERM: stopping the run" in stderr
    else:
        assert "[stop] interrupted (Ctrl-C): stopping the engines" in stderr
    assert marker.read_text() == "shutdown 2 engines\n"  # main's cleanup killed the generating engines
    assert not any(alive(x) for x in engine_pids), engine_pids
    assert left == [], left
    print(f"stopped {elapsed:.1f} s after {sig!r}")
