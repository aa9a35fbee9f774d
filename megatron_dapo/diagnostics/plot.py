"""The diagnosis dashboard: one matplotlib panel per boundary, its curves and alert markers."""

from __future__ import annotations

import math
import os

import numpy as np

from megatron_dapo.diagnostics.analysis import Diagnosis
from megatron_dapo.diagnostics.history import History

__all__ = ["PANELS", "plot_diagnosis"]

# boundary -> (left-axis curves, right-axis curves, left label, right label)
PANELS = {
    "exploration": (
        ("entropy",),
        ("clip_frac_low", "clip_frac_high", "tis_clip_frac", "mismatch_kl", "is_ess_frac"),
        "entropy",
        "clip fraction / mismatch KL / ESS/N",
    ),
    "group_contrast": (
        ("kept_group_ratio", "all_correct_ratio", "all_wrong_ratio"),
        ("num_gen_batches",),
        "share of groups",
        "generation rounds",
    ),
    "token_credit": (
        ("response_length_mean", "response_length_max"),
        ("acc_mean", "repetition_rate"),
        "tokens",
        "acc / repetition",
    ),
    "reward_interpretation": (
        ("truncation_ratio", "no_answer_rate", "overlong_penalty_mean"),
        ("offpolicy_token_frac",),
        "share of responses / |penalty|",
        "share of trained tokens",
    ),
}

_COLOURS = {
    "entropy": "tab:blue",
    "clip_frac_low": "tab:purple",
    "clip_frac_high": "tab:orange",
    "kept_group_ratio": "tab:green",
    "all_correct_ratio": "tab:blue",
    "all_wrong_ratio": "tab:red",
    "num_gen_batches": "tab:gray",
    "response_length_mean": "tab:blue",
    "response_length_max": "lightsteelblue",
    "acc_mean": "tab:green",
    "repetition_rate": "tab:red",
    "truncation_ratio": "tab:orange",
    "no_answer_rate": "tab:purple",
    "overlong_penalty_mean": "tab:brown",
    "tis_clip_frac": "tab:pink",
    "mismatch_kl": "tab:olive",
    "offpolicy_token_frac": "tab:cyan",
}


def _series(h: History, key: str) -> tuple[np.ndarray, np.ndarray]:
    v = h.get(key)
    if key == "overlong_penalty_mean":
        v = np.abs(v)
    m = np.isfinite(v)
    return h.steps[m], v[m]


def _value_at(h: History, key: str, step: float) -> float | None:
    if key == "clip_frac":
        vals = [_value_at(h, k, step) for k in ("clip_frac_low", "clip_frac_high")]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None
    t, v = _series(h, key)
    if not len(t):
        return None
    i = int(np.argmin(np.abs(t - step)))
    return float(v[i])


def _threshold_lines(rep, diag: Diagnosis) -> list[tuple[float, str]]:
    """Horizontal reference lines (left axis) for the absolute thresholds of a panel."""
    th = diag.thresholds
    lines = []
    if rep.key == "exploration":
        s = rep.metrics.get("entropy")
        if s is not None and s.early is not None and s.n >= th.min_steps:
            lines.append(
                (th.entropy_collapse_ratio * s.early, f"collapse: {th.entropy_collapse_ratio:g} x early entropy")
            )
    elif rep.key == "group_contrast":
        lines.append((th.kept_group_ratio_min, f"kept_group_ratio_min {th.kept_group_ratio_min:g}"))
    elif rep.key == "reward_interpretation":
        lines.append((th.truncation_ratio_max, f"truncation_ratio_max {th.truncation_ratio_max:g}"))
        if th.no_answer_rate_max != th.truncation_ratio_max:
            lines.append((th.no_answer_rate_max, f"no_answer_rate_max {th.no_answer_rate_max:g}"))
    return lines


def plot_diagnosis(diag: Diagnosis, history: History, path: str, dpi: int = 110) -> str:
    """Draw the 2 x 2 dashboard to ``path`` (PNG) and return the path."""
    # A bare Figure renders through the Agg canvas without pyplot: no global backend switch,
    # no GUI, safe inside the trainer.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(14, 9))
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 2, squeeze=False)
    for ax, rep in zip(axes.ravel(), diag.boundaries):
        left, right, llabel, rlabel = PANELS[rep.key]
        colour = {"ok": "tab:green", "alert": "tab:red", "no_data": "tab:gray"}[rep.status]
        status = {"ok": "healthy", "alert": "ALERT", "no_data": "no data"}[rep.status]
        ax.set_title(f"{rep.title}: {status}", color=colour, fontweight="bold")
        ax.set_xlabel("step")
        if rep.status == "no_data":
            ax.text(
                0.5,
                0.5,
                "no data logged\n(" + ", ".join(left + right) + ")",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="tab:gray",
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        handles = []
        for key in left:
            t, v = _series(history, key)
            if len(t):
                style = "--" if key == "response_length_max" else "-"
                label = "|overlong_penalty_mean|" if key == "overlong_penalty_mean" else key
                handles += ax.plot(t, v, style, color=_COLOURS.get(key), label=label, lw=1.5)
        ax.set_ylabel(llabel)
        ax.grid(alpha=0.3)
        ax2 = None
        if any(history.has(k) for k in right):
            ax2 = ax.twinx()
            for key in right:
                t, v = _series(history, key)
                if len(t):
                    handles += ax2.plot(t, v, ":", color=_COLOURS.get(key), label=key, lw=1.5)
            ax2.set_ylabel(rlabel)
        for y, label in _threshold_lines(rep, diag):
            ax.axhline(y, color="gray", ls="-.", lw=0.8, alpha=0.6)
            ax.annotate(
                label,
                xy=(0.0, y),
                xycoords=("axes fraction", "data"),
                xytext=(3, 2),
                textcoords="offset points",
                color="gray",
                fontsize=7,
            )
        for j, a in enumerate(rep.alerts + rep.warnings):
            alert = a.severity == "alert"
            c = "red" if alert else "darkorange"
            ax.axvline(a.step, color=c, ls="--" if alert else ":", lw=1.2, alpha=0.8)
            y = _value_at(history, a.metric, a.step)
            on_right = a.metric in right or (a.metric == "clip_frac" and ax2 is not None)
            target = ax2 if (on_right and ax2 is not None) else ax
            if y is not None and math.isfinite(y):
                target.plot([a.step], [y], marker="X" if alert else "o", ms=10, color=c, mec="black", zorder=5)
            late = len(history) and a.step > 0.6 * float(history.steps[-1] + history.steps[0])
            target.annotate(
                a.kind,
                xy=(a.step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-3 if late else 3, -12 - 10 * j),
                textcoords="offset points",
                ha="right" if late else "left",
                color=c,
                fontsize=8,
            )
        if handles:
            ax.legend(handles=handles, loc="best", fontsize=8, framealpha=0.7)
    verdict = (
        f"{len(diag.alerts)} alert(s): " + ", ".join(sorted(diag.alerting_boundaries())) if diag.alerts else "no alerts"
    )
    src = os.path.dirname(diag.source) if diag.source else ""
    fig.suptitle(f"DAPO four-boundary diagnosis {src}\n{diag.num_steps} steps; {verdict}", fontsize=12)
    fig.tight_layout()
    out_dir = os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path
