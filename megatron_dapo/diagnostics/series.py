"""Statistics of one metric's series for the diagnosis: finite values, windows, rolling means,
least-squares trends, the onset of a condition, the :class:`MetricSummary` of a metric, and the
number formatting the messages and the report share.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from megatron_dapo.diagnostics.history import History
from megatron_dapo.diagnostics.thresholds import Thresholds

__all__ = ["MetricSummary"]


@dataclasses.dataclass
class MetricSummary:
    name: str
    n: int  # finite values logged
    last: float | None
    last_step: float | None
    early: float | None  # median of the first early_window values
    recent: float | None  # mean of the last window values
    slope: float | None  # least-squares slope per step over the last trend_window values
    change: float | None  # slope x step span of the trend window (the change it explains)
    trend: str  # "rising", "falling", "flat" or "n/a"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------
# numeric helpers
# ----------------------------------------------------------------------------------------------


def _finite(h: History, key: str) -> tuple[np.ndarray, np.ndarray]:
    v = h.get(key)
    m = np.isfinite(v)
    return h.steps[m], v[m]


def _eff(window: int, n: int) -> int:
    """A window shrunk to a third of a short history (but not below 3 values, nor above n)."""
    w = min(int(window), max(n // 3, 3))
    return max(1, min(w, n))


def _early(x: np.ndarray, th: Thresholds) -> float:
    return float(np.median(x[: _eff(th.early_window, len(x))]))


def _rolling_mean(x: np.ndarray, w: int) -> np.ndarray:
    c = np.concatenate(([0.0], np.cumsum(x)))
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(0, idx - w)
    return (c[idx] - c[lo]) / (idx - lo)


def _slope(t: np.ndarray, y: np.ndarray) -> float:
    if len(t) < 2:
        return math.nan
    tc = t - t.mean()
    den = float(np.dot(tc, tc))
    if den == 0:
        return math.nan
    return float(np.dot(tc, y - y.mean()) / den)


def _slope_se(t: np.ndarray, y: np.ndarray, slope: float) -> float:
    """Standard error of a least-squares slope (0 for an exact fit or fewer than 3 points)."""
    if len(t) < 3 or not math.isfinite(slope):
        return 0.0
    tc = t - t.mean()
    den = float(np.dot(tc, tc))
    if den == 0:
        return 0.0
    resid = (y - y.mean()) - slope * tc
    return math.sqrt(float(np.dot(resid, resid)) / (len(t) - 2) / den)


def _trend_window(th: Thresholds, n: int) -> int:
    return max(2, min(int(th.trend_window), max(2, n // 2)))


def _summary(h: History, key: str, th: Thresholds) -> MetricSummary:
    t, x = _finite(h, key)
    n = len(x)
    if n == 0:
        return MetricSummary(key, 0, None, None, None, None, None, None, "n/a")
    w = _eff(th.window, n)
    recent = float(np.mean(x[-w:]))
    slope = change = None
    trend = "n/a"
    if n >= 3:
        tw = _trend_window(th, n)
        s = _slope(t[-tw:], x[-tw:])
        if math.isfinite(s):
            slope = s
            change = s * float(t[-1] - t[-tw])
            scale = max(abs(float(np.mean(x[-tw:]))), 1e-12)
            # "flat" unless the change is both material (5% of the level) and clear of the
            # noise (slope more than 3 standard errors from zero)
            clear = abs(s) > 3 * _slope_se(t[-tw:], x[-tw:], s)
            trend = "flat" if abs(change) < 0.05 * scale or not clear else ("rising" if change > 0 else "falling")
    return MetricSummary(key, n, float(x[-1]), float(t[-1]), _early(x, th), recent, slope, change, trend)


def _onset(t: np.ndarray, cond: np.ndarray) -> tuple[bool, float | None, float | None]:
    """(holds at the last step, onset step of the final run, first step it ever held)."""
    if not cond.any():
        return False, None, None
    first = float(t[int(np.argmax(cond))])
    if not cond[-1]:
        return False, None, first
    i = len(cond) - 1
    while i > 0 and cond[i - 1]:
        i -= 1
    return True, float(t[i]), first


def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "n/a"
    av = abs(v)
    if av != 0 and (av >= 1e4 or av < 1e-3):
        return f"{v:.2e}"
    if av >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def _step(s: float | None) -> str:
    return "n/a" if s is None else str(int(s)) if float(s).is_integer() else f"{s:g}"
