"""Reading ``RUN_DIR/metrics.jsonl`` into aligned per-step arrays.

The file holds one flat JSON object per line (the trainer's key-name contract). Reading is
tolerant: blank lines and lines that are not JSON objects (e.g. a last line cut short by a kill)
are skipped and counted; missing keys become NaN; non-numeric and non-finite values become NaN; a step logged
twice (a resumed run re-logging steps) keeps its last record; records are sorted by ``step``
(a record without ``step`` gets the previous step + 1).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["History", "load_metrics", "metrics_path"]


@dataclasses.dataclass
class History:
    steps: np.ndarray  # float array of step numbers, increasing
    series: dict[str, np.ndarray]  # metric name -> float array aligned with steps (NaN = missing)
    source: str | None = None
    bad_lines: int = 0
    duplicate_steps: int = 0

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def has(self, key: str) -> bool:
        """True when ``key`` has at least one finite value."""
        v = self.series.get(key)
        return v is not None and bool(np.isfinite(v).any())

    def get(self, key: str) -> np.ndarray:
        """The series of ``key`` (all NaN when the key was never logged)."""
        v = self.series.get(key)
        if v is None:
            return np.full(len(self), np.nan)
        return v

    @classmethod
    def from_records(
        cls, records: Iterable[Mapping[str, Any]], source: str | None = None, bad_lines: int = 0
    ) -> "History":
        by_step: dict[float, Mapping[str, Any]] = {}
        duplicates = 0
        last_step = -1.0
        for rec in records:
            step = _num(rec.get("step"))
            if not math.isfinite(step):
                step = last_step + 1
            last_step = step
            if step in by_step:
                duplicates += 1
            by_step[step] = rec
        steps = sorted(by_step)
        keys: dict[str, None] = {}
        for s in steps:
            for k in by_step[s]:
                if k != "step":
                    keys.setdefault(k, None)
        series = {k: np.array([_num(by_step[s].get(k)) for s in steps], dtype=float) for k in keys}
        return cls(np.array(steps, dtype=float), series, source, bad_lines, duplicates)


def _num(v: Any) -> float:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        v = float(v)
        return v if math.isfinite(v) else math.nan
    return math.nan


def metrics_path(run_dir: str) -> str:
    """``RUN_DIR/metrics.jsonl``; a path to a ``.jsonl`` file is returned unchanged."""
    if os.path.isfile(run_dir):
        return run_dir
    return os.path.join(run_dir, "metrics.jsonl")


def load_metrics(path: str) -> History:
    """Load a run's metrics; ``path`` is a run directory or the ``metrics.jsonl`` file itself."""
    path = metrics_path(path)
    records = []
    bad = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if not isinstance(rec, dict):
                bad += 1
                continue
            records.append(rec)
    return History.from_records(records, source=path, bad_lines=bad)
