"""metrics.jsonl (flat, one object per line, truncated on resume) and tensorboard output."""

from __future__ import annotations

import json
import math
import os

from megatron_dapo.driver.logging import MetricsLogger


def test_jsonl_tensorboard_and_resume_truncation(tmp_path):
    log = MetricsLogger(str(tmp_path), {"a": 1}, None, "disabled", tensorboard=True)
    for step in (1, 2, 3):
        log.log({"step": step, "acc_mean": 0.1 * step, "grad_norm": float("nan") if step == 2 else 1.0})
    log.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[1]["grad_norm"] is None  # NaN is written as null (valid JSON), not as NaN
    assert math.isclose(rows[2]["acc_mean"], 0.3)
    events = [f for _, _, fs in os.walk(tmp_path / "tensorboard") for f in fs if "tfevents" in f]
    assert events
    again = MetricsLogger(str(tmp_path), {}, None, "disabled", tensorboard=False)
    again.truncate_after(1)  # resuming from the step-1 checkpoint drops steps 2 and 3
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1]
