"""metrics.jsonl (flat, one object per line, truncated on resume) and tensorboard output."""

from __future__ import annotations

import ast
import json
import math
import os
from pathlib import Path

from megatron_dapo.driver.logging import REQUIRED_KEYS, MetricsLogger
from tests.metrics_doc import documented_keys, table_keys

PACKAGE = Path(__file__).resolve().parents[2] / "megatron_dapo"


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


def test_docs_list_what_is_logged():
    """docs/metrics.md documents every required key, and documents no key that the code never
    names (a key that appears as no string literal in megatron_dapo/, nor as a field of
    training/stats.LossStats, is never logged)."""
    literals = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
    from megatron_dapo.training.stats import LossStats

    literals |= set(LossStats.pair_names())  # the loss metrics are logged under LossStats' field names
    assert set(REQUIRED_KEYS) - table_keys() == set()
    documented = documented_keys()
    assert len(documented) > len(REQUIRED_KEYS)
    assert sorted(documented - literals) == []
