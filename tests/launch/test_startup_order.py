"""The driver launches the engines first and lets them release their memory before any
trainer actor builds its model (an engine sizes its KV cache from the memory free when it
starts: SGLang's mem_fraction_static). Run in its own process (tests/launch/startup_order_check.py)
so that its Ray never meets the session's."""

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from megatron_dapo.rollout.base import MEMORY_TAGS
from tests.launch.procs import RAY_SHUTDOWN_GRACE_S, run_in_session

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow]


def test_engines_are_launched_and_released_before_the_first_trainer_actor(tmp_path):
    temp = f"/tmp/rt-{uuid.uuid4().hex[:8]}"  # its own Ray temp dir (short: Ray's socket paths)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["RAY_TMPDIR"] = temp
    try:
        done = run_in_session(
            [sys.executable, str(HERE / "startup_order_check.py"), str(tmp_path)],
            timeout=420,
            grace_s=RAY_SHUTDOWN_GRACE_S,
            pattern=temp,
            env=env,
            cwd=tmp_path,
        )
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    out = done.stdout + done.stderr
    assert not done.leftovers, f"startup_order_check.py left processes running: {done.leftovers}"
    assert done.returncode == 0, out[-5000:]
    result = json.loads([x for x in done.stdout.splitlines() if x.startswith("RESULT ")][0][len("RESULT ") :])
    # both engines were up, with all their memory released, when the first trainer actor was created
    assert result["engines_before_trainer"] == [list(MEMORY_TAGS)] * result["num_engines"], result
