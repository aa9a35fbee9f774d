"""Four-boundary stability diagnosis of DAPO runs, and the repetition-loop metric.

* :func:`diagnose` reads a :class:`History` (``load_metrics(RUN_DIR)``) against
  :class:`Thresholds` and reports, per boundary (exploration, group contrast, token credit,
  reward interpretation), trends, last values, alerts and a verdict.
* :func:`plot_diagnosis` draws the dashboard (matplotlib, imported only when called).
* :func:`has_repetition_loop` / :func:`repetition_rate` define the trainer's
  ``repetition_rate`` metric (numpy only; cheap to import).

Command line: ``python tools/diagnose.py RUN_DIR``; docs/diagnosis.md explains everything.
"""

from megatron_dapo.diagnostics.analysis import BOUNDARIES, Boundary, BoundaryReport, Diagnosis, diagnose
from megatron_dapo.diagnostics.detectors import Alert
from megatron_dapo.diagnostics.history import History, load_metrics
from megatron_dapo.diagnostics.plot import plot_diagnosis  # matplotlib is imported only when it draws
from megatron_dapo.diagnostics.repetition import find_repetition_loop, has_repetition_loop, repetition_rate
from megatron_dapo.diagnostics.report import format_report, print_report
from megatron_dapo.diagnostics.series import MetricSummary
from megatron_dapo.diagnostics.thresholds import Thresholds, load_thresholds


def diagnose_run(run_dir, thresholds=None):
    """``diagnose(load_metrics(run_dir), thresholds)``: the diagnosis of a run directory."""
    return diagnose(load_metrics(run_dir), thresholds)


__all__ = [
    "BOUNDARIES",
    "Alert",
    "Boundary",
    "BoundaryReport",
    "Diagnosis",
    "History",
    "MetricSummary",
    "Thresholds",
    "diagnose",
    "diagnose_run",
    "find_repetition_loop",
    "format_report",
    "has_repetition_loop",
    "load_metrics",
    "load_thresholds",
    "plot_diagnosis",
    "print_report",
    "repetition_rate",
]
