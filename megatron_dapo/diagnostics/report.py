"""Text rendering of a :class:`~megatron_dapo.diagnostics.analysis.Diagnosis` (plain or rich)."""

from __future__ import annotations

import sys
from typing import TextIO

from megatron_dapo.diagnostics.analysis import Diagnosis
from megatron_dapo.diagnostics.series import _fmt, _step

__all__ = ["format_report", "print_report"]

_MARK = {"ok": "OK", "alert": "ALERT", "no_data": "NO DATA"}


def format_report(diag: Diagnosis, verbose: bool = False) -> str:
    """A short plain-text report: a header, one verdict line per boundary, then the alerts."""
    lines = []
    src = f" ({diag.source})" if diag.source else ""
    if diag.num_steps:
        lines.append(
            f"DAPO run diagnosis{src}: {diag.num_steps} steps, {_step(diag.first_step)}..{_step(diag.last_step)}"
        )
    else:
        lines.append(f"DAPO run diagnosis{src}: no steps logged")
    ov = [f"{k} {_fmt(s.last)} ({s.trend})" for k, s in diag.overview.items() if k in ("acc_mean", "reward_mean")]
    if ov:
        lines.append("  run: " + "; ".join(ov))
    for note in diag.notes:
        lines.append(f"  note: {note}")
    for b in diag.boundaries:
        lines.append(f"[{_MARK[b.status]:>7}] {b.title:<22} {b.verdict}")
        for a in b.alerts:
            lines.append(f"          ! {a.message}")
        for w in b.warnings:
            lines.append(f"          ~ warning: {w.message}")
        if verbose:
            for note in b.notes:
                lines.append(f"          . {note}")
            for s in b.metrics.values():
                if s.n:
                    lines.append(
                        f"          . {s.name}: last {_fmt(s.last)} @ {_step(s.last_step)}, "
                        f"early {_fmt(s.early)}, recent {_fmt(s.recent)}, "
                        f"slope/step {_fmt(s.slope)} ({s.trend})"
                    )
    n_alerts = len(diag.alerts)
    if n_alerts:
        which = ", ".join(sorted({a.boundary for a in diag.alerts}))
        lines.append(f"verdict: {n_alerts} alert(s) on {which}")
    else:
        lines.append("verdict: no alerts")
    return "\n".join(lines)


def print_report(
    diag: Diagnosis, verbose: bool = False, stream: TextIO | None = None, use_rich: bool | None = None
) -> None:
    """Print the report; with ``use_rich=None`` rich colours are used only on a terminal."""
    stream = stream or sys.stdout
    text = format_report(diag, verbose)
    if use_rich is None:
        use_rich = hasattr(stream, "isatty") and stream.isatty()
    if use_rich:
        try:
            from rich.console import Console
            from rich.markup import escape
        except ImportError:
            use_rich = False
    if not use_rich:
        print(text, file=stream)
        return
    console = Console(file=stream, highlight=False)
    style = {"[     OK]": "green", "[  ALERT]": "bold red", "[NO DATA]": "yellow"}
    for line in text.splitlines():
        st = next((v for k, v in style.items() if line.startswith(k)), None)
        if line.lstrip().startswith("!"):
            st = "red"
        elif line.lstrip().startswith("~"):
            st = "yellow"
        elif line.startswith("verdict:"):
            st = "bold red" if diag.alerts else "bold green"
        console.print(f"[{st}]{escape(line)}[/]" if st else escape(line))
