"""The four-boundary diagnosis of a DAPO run from its per-step metrics.

Boundaries (docs/diagnosis.md gives the reasoning from the DAPO paper):

* ``exploration`` -- does the policy still explore? ``entropy``, ``clip_frac_low``,
  ``clip_frac_high``. Alerts: entropy collapse (vs its early value), entropy runaway, clip
  fraction too high, sudden entropy drop.
* ``group_contrast`` -- do the sampled groups still carry a direction? ``kept_group_ratio``,
  ``all_correct_ratio``, ``all_wrong_ratio``, ``num_gen_batches``. Alerts: kept-group ratio low
  or falling toward 0, groups mostly all-correct / all-wrong, generation rounds at the cap or
  rising, sudden drop of the kept ratio.
* ``token_credit`` -- do the tokens earn their credit? ``response_length_mean``,
  ``response_length_max``, ``repetition_rate`` against ``acc_mean``. Alerts: length growing
  while accuracy stalls, repetition high or rising, sudden length jump.
* ``reward_interpretation`` -- is the reward measuring answers? ``truncation_ratio``,
  ``overlong_penalty_mean``, ``no_answer_rate``. Alerts: truncation above threshold, overlong
  penalty dominating, no-answer rate high or rising, sudden rises.

An *alert* describes the current state of the run: its condition holds on the smoothed value at
the last logged step (its ``step`` is the onset: where the final stretch of the condition began),
or a sudden change happened inside the recent window. A condition that held earlier and
recovered, or a sudden change before the recent window, is kept as a *warning* (printed and
plotted, but it does not fail ``--fail-on-alert``).

The detectors of each failure mode live in detectors.py (their :class:`Alert`), the statistics
of a metric's series in series.py (its :class:`MetricSummary`); this module defines the
boundaries and the result types and assembles the verdicts (:func:`diagnose`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from megatron_dapo.diagnostics.detectors import _CHECKS, Alert, _Collector
from megatron_dapo.diagnostics.history import History
from megatron_dapo.diagnostics.series import MetricSummary, _fmt, _summary
from megatron_dapo.diagnostics.thresholds import Thresholds

__all__ = ["BOUNDARIES", "Boundary", "BoundaryReport", "Diagnosis", "diagnose"]


@dataclasses.dataclass(frozen=True)
class Boundary:
    key: str
    title: str
    question: str
    metrics: tuple[str, ...]  # the boundary's own metrics (any of them present -> "has data")
    context: tuple[str, ...] = ()  # metrics it is read against (summarised, never "data" alone)


BOUNDARIES: tuple[Boundary, ...] = (
    Boundary(
        "exploration",
        "Exploration",
        "Does the policy still explore?",
        ("entropy", "clip_frac_low", "clip_frac_high"),
        (
            "mismatch_kl",
            "tis_clip_frac",
            "is_ess_frac",
            "moe/routing_agreement_min",
            "moe/load_imbalance_max",
            "moe/router_entropy",
        ),
    ),
    Boundary(
        "group_contrast",
        "Group contrast",
        "Do the sampled groups still carry a direction?",
        ("kept_group_ratio", "all_correct_ratio", "all_wrong_ratio", "num_gen_batches"),
    ),
    Boundary(
        "token_credit",
        "Token credit",
        "Do the generated tokens earn their credit?",
        ("response_length_mean", "response_length_max", "repetition_rate"),
        ("acc_mean",),
    ),
    Boundary(
        "reward_interpretation",
        "Reward interpretation",
        "Does the reward measure answers?",
        ("truncation_ratio", "overlong_penalty_mean", "no_answer_rate"),
        ("offpolicy_token_frac",),
    ),
)

#: Metrics summarised in the run overview (not part of any boundary's verdict).
OVERVIEW_METRICS = (
    "acc_mean",
    "reward_mean",
    "approx_kl",
    "grad_norm",
    "train_infer_logprob_diff",
    "tokens_per_second",
    "time_step",
)


@dataclasses.dataclass
class BoundaryReport:
    key: str
    title: str
    question: str
    status: str  # "ok", "alert" or "no_data"
    verdict: str
    metrics: dict[str, MetricSummary]
    alerts: list[Alert]
    warnings: list[Alert]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return d


@dataclasses.dataclass
class Diagnosis:
    boundaries: list[BoundaryReport]
    overview: dict[str, MetricSummary]
    num_steps: int
    first_step: float | None
    last_step: float | None
    thresholds: Thresholds
    source: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def alerts(self) -> list[Alert]:
        return [a for b in self.boundaries for a in b.alerts]

    @property
    def warnings(self) -> list[Alert]:
        return [a for b in self.boundaries for a in b.warnings]

    @property
    def any_alert(self) -> bool:
        return bool(self.alerts)

    def boundary(self, key: str) -> BoundaryReport:
        for b in self.boundaries:
            if b.key == key:
                return b
        raise KeyError(key)

    def alerting_boundaries(self) -> set[str]:
        return {b.key for b in self.boundaries if b.alerts}

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "num_steps": self.num_steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "any_alert": self.any_alert,
            "boundaries": [b.to_dict() for b in self.boundaries],
            "overview": {k: v.to_dict() for k, v in self.overview.items()},
            "thresholds": self.thresholds.to_dict(),
            "notes": list(self.notes),
        }


_HEADLINE = {
    "exploration": ("entropy", "clip_frac_high"),
    "group_contrast": ("kept_group_ratio", "num_gen_batches"),
    "token_credit": ("response_length_mean", "repetition_rate", "acc_mean"),
    "reward_interpretation": ("truncation_ratio", "no_answer_rate"),
}


def _verdict(
    b: Boundary, status: str, metrics: dict[str, MetricSummary], alerts: list[Alert], warnings: list[Alert]
) -> str:
    if status == "no_data":
        return f"no data: none of {', '.join(b.metrics)} was logged"
    parts = []
    for k in _HEADLINE[b.key]:
        s = metrics.get(k)
        if s is not None and s.n:
            parts.append(f"{k} {_fmt(s.last)} ({s.trend})")
    state = ("ALERT: " + ", ".join(dict.fromkeys(a.kind for a in alerts))) if alerts else "healthy"
    if not alerts and warnings:
        state += f" ({len(warnings)} past warning{'s' if len(warnings) > 1 else ''})"
    return f"{state}; " + "; ".join(parts) if parts else state


def diagnose(history: History, thresholds: Thresholds | None = None) -> Diagnosis:
    """Diagnose a run's metric history against ``thresholds`` (defaults: :class:`Thresholds`)."""
    th = thresholds or Thresholds()
    reports = []
    for b in BOUNDARIES:
        metrics = {k: _summary(history, k, th) for k in b.metrics + b.context}
        col = _Collector(b.key, th)
        if any(history.has(k) for k in b.metrics):
            _CHECKS[b.key](history, th, col)
            status = "alert" if col.alerts else "ok"
        else:
            status = "no_data"
        missing = [k for k in b.metrics + b.context if not history.has(k)]
        if missing and status != "no_data":
            col.notes.append("not logged: " + ", ".join(missing))
        reports.append(
            BoundaryReport(
                b.key,
                b.title,
                b.question,
                status,
                _verdict(b, status, metrics, col.alerts, col.warnings),
                metrics,
                col.alerts,
                col.warnings,
                col.notes,
            )
        )
    notes = []
    if history.bad_lines:
        notes.append(f"{history.bad_lines} unreadable line(s) skipped")
    if history.duplicate_steps:
        notes.append(f"{history.duplicate_steps} re-logged step(s): the last record of each kept")
    n = len(history)
    if n == 0:
        notes.append("no metrics logged")
    return Diagnosis(
        reports,
        {k: _summary(history, k, th) for k in OVERVIEW_METRICS if history.has(k)},
        n,
        float(history.steps[0]) if n else None,
        float(history.steps[-1]) if n else None,
        th,
        history.source,
        notes,
    )
