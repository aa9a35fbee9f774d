"""The report of a grid: outcomes per run, main effects and two-factor interactions with
confidence intervals, the diagnosis of every run, and plots.

Outcomes, from the outcome metric ``M`` of each finished run (``metrics.jsonl``; by default the
held-out accuracy ``eval/<set>/pass@1`` that ``--eval-data``/``--eval-interval`` log, else the
training accuracy ``acc_mean``):

* ``final``: ``M`` at the last step it was logged;
* ``auc``: the area under the ``M``-versus-step curve (trapezoids between the logged steps)
  divided by the step span: the curve's mean level, in ``M``'s units (one logged value: that value);
* ``steps_to_threshold``: the first step with ``M >= threshold``; a run that never reaches it is
  counted as its last step + 1 (censored; the table marks it with ``>``).

Effects: every complete replicate (a seed whose cells all finished) gives one estimate per
effect column, the contrast ``mean(y | +) - mean(y | -)`` (design.contrast); the reported effect
is the mean over replicates with a 95% Student t interval on ``r - 1`` degrees of freedom (none
with one replicate). A replicate with a missing or unfinished cell is left out and named, never
filled in. The same main effects are computed on the metrics of each diagnosis boundary
(entropy, kept-group ratio, response length, truncation ratio, upper clip fraction), so an effect
on accuracy can be read with the mechanism it went through, and each run's diagnosis verdict
(megatron_dapo.diagnostics: which boundary alerted) is tabulated per factor level.

Before anything is computed, the runs' ``config.json`` files are compared: runs that differ in
anything but the factors (and the per-run fields: run directory, seed, checkpoint paths) are
refused, naming the fields; so is a run whose configuration is not its cell's.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..diagnostics import diagnose, load_metrics
from .design import LETTERS, EffectColumn, contrast, t_interval
from .launch import RunState, config_differences, grid_states, read_config
from .plan import PER_RUN_FIELDS, AblationError, Plan, expected_config

OUTCOMES = ("final", "auc", "steps_to_threshold")
#: (metric, how) of each diagnosis boundary whose main effects the report shows.
MECHANISMS: Tuple[Tuple[str, str, str], ...] = (
    ("entropy", "last", "exploration"),
    ("clip_frac_high", "mean", "exploration"),
    ("kept_group_ratio", "mean", "group_contrast"),
    ("response_length_mean", "last", "token_credit"),
    ("truncation_ratio", "mean", "reward_interpretation"),
)
CI_LEVEL = 0.95


@dataclass
class RunResult:
    state: RunState
    outcomes: Dict[str, float] = field(default_factory=dict)
    censored: bool = False
    mechanisms: Dict[str, float] = field(default_factory=dict)
    alerts: List[Tuple[str, str, float]] = field(default_factory=list)  # (boundary, kind, onset step)
    no_data: List[str] = field(default_factory=list)
    note: str = ""

    @property
    def diagnosis(self) -> str:
        if not self.alerts:
            return "no alerts" + (f" (no data: {', '.join(self.no_data)})" if self.no_data else "")
        by: Dict[str, List[str]] = {}
        for b, kind, step in self.alerts:
            by.setdefault(b, []).append(f"{kind}@{step:g}" if math.isfinite(step) else kind)
        return "; ".join(f"{b}: {', '.join(v)}" for b, v in by.items())


@dataclass
class Effect:
    column: EffectColumn
    label: str
    per_seed: Dict[int, float]
    estimate: float
    low: Optional[float]
    high: Optional[float]
    separable: bool


# ------------------------------------------------------------------------------ checks


def check_configs(plan: Plan, states: Sequence[RunState]) -> None:
    """Refuse runs that differ in anything but the factors, or whose config is not their cell's."""
    allowed = set(PER_RUN_FIELDS) | {f for fs in plan.factor_fields.values() for f in fs}
    configs = {}
    for s in states:
        cfg = read_config(s.run.run_dir)
        if cfg is not None:
            configs[s.key] = cfg
    if not configs:
        return
    keys = sorted({k for c in configs.values() for k in c} - allowed)
    differing = []
    for k in keys:
        values: Dict[str, List[str]] = {}
        for run, c in configs.items():
            values.setdefault(json.dumps(c.get(k, "<absent>"), sort_keys=True), []).append(run)
        if len(values) > 1:
            shown = "; ".join(
                f"{v} in {', '.join(runs[:3])}{' ...' if len(runs) > 3 else ''}" for v, runs in list(values.items())[:3]
            )
            differing.append(f"{k} ({shown})")
    if differing:
        raise AblationError(
            f"grid {plan.grid}: the runs' config.json files differ in more than the factors: {' | '.join(differing)}; "
            f"a factorial comparison needs every run alike apart from the factors "
            f"({', '.join(sorted(allowed - set(PER_RUN_FIELDS)))}); rerun the odd runs (move their run directories "
            "away, then tools/ablate.py run --grid ...) or start a new grid"
        )
    for s in states:
        got = configs.get(s.key)
        if got is None:
            continue
        want = expected_config(s.run.argv, f"run {s.key}")
        diff = config_differences(got, want)
        if diff:
            shown = ", ".join(
                f"{k} ({got.get(k, '<absent>')!r}, the plan: {want.get(k, '<absent>')!r})" for k in diff[:5]
            )
            raise AblationError(
                f"{s.run.run_dir}/config.json is not the configuration of cell {s.run.cell} "
                f"({plan.cell_label(s.run.cell)}): {shown}; move that run directory away and rerun"
            )


# ------------------------------------------------------------------------------ outcomes


def choose_metric(requested: str, histories: Sequence) -> Tuple[str, str]:
    """(metric, why): ``requested``, or for ``auto`` the first ``eval/<set>/pass@1`` logged, else ``acc_mean``."""
    keys = sorted({k for h in histories for k in h.series if h.has(k)})
    if requested and requested != "auto":
        if histories and requested not in keys:
            evals = [k for k in keys if k.startswith("eval/")]
            raise AblationError(
                f"--metric {requested}: no finished run logged it (held-out metrics logged: "
                f"{', '.join(evals) or 'none'}; training: acc_mean, reward_mean, ...)"
            )
        return requested, "given with --metric"
    evals = [k for k in keys if re.fullmatch(r"eval/.+/pass@1", k)]
    if evals:
        return evals[0], "held-out accuracy (--eval-data, logged every --eval-interval steps)"
    return "acc_mean", (
        "training accuracy of the sampled responses: no held-out evaluation was logged "
        "(give the runs --eval-data and --eval-interval for held-out accuracy)"
    )


def curve_outcomes(steps: np.ndarray, values: np.ndarray, threshold: float) -> Tuple[Dict[str, float], bool]:
    """final, auc (area / step span), steps_to_threshold (censored at last step + 1) of one curve."""
    m = np.isfinite(values) & np.isfinite(steps)
    s, v = steps[m], values[m]
    if s.size == 0:
        return {o: math.nan for o in OUTCOMES}, False
    final = float(v[-1])
    if s.size == 1:
        auc = float(v[0])
    else:
        area = float(np.sum((v[1:] + v[:-1]) * np.diff(s)) / 2.0)
        auc = area / float(s[-1] - s[0])
    hit = np.nonzero(v >= threshold)[0]
    censored = hit.size == 0
    first = float(s[hit[0]]) if not censored else float(s[-1] + 1)
    return {"final": final, "auc": auc, "steps_to_threshold": first}, censored


def _mechanism(h, metric: str, how: str) -> float:
    v = h.get(metric)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan
    return float(v[-1]) if how == "last" else float(v.mean())


def collect(plan: Plan, metric: str = "auto", threshold: Optional[float] = None):
    """(states, results by run key, metric, why): the runs' states (configs checked), and for every
    finished run its outcomes, boundary metrics and diagnosis."""
    states = grid_states(plan)
    check_configs(plan, states)
    thr = plan.threshold if threshold is None else float(threshold)
    hist = {}
    for s in states:
        if s.status == "done":
            hist[s.key] = load_metrics(s.run.run_dir)
    metric, why = choose_metric(metric or plan.metric, list(hist.values()))
    results: Dict[str, RunResult] = {}
    for s in states:
        r = RunResult(s)
        h = hist.get(s.key)
        if h is not None:
            r.outcomes, r.censored = curve_outcomes(h.steps, h.get(metric), thr)
            logged = h.steps[np.isfinite(h.get(metric))]
            if logged.size == 0:
                r.note = f"{metric} never logged"
            elif logged[-1] < s.steps:
                r.note = f"{metric} last logged at step {logged[-1]:g} of {s.steps}"
            r.mechanisms = {f"{m} ({how})": _mechanism(h, m, how) for m, how, _ in MECHANISMS}
            d = diagnose(h)
            r.alerts = [(a.boundary, a.kind, float(a.step) if a.step is not None else math.nan) for a in d.alerts]
            r.no_data = [b.key for b in d.boundaries if b.status == "no_data"]
        results[s.key] = r
    return states, results, metric, why, thr


def replicate_vectors(plan: Plan, results: Dict[str, RunResult], get) -> Tuple[Dict[int, np.ndarray], Dict[int, str]]:
    """Per seed, the outcome vector in design order; seeds with a missing/unfinished cell (or no
    value) are left out, with the reason."""
    vectors, left_out = {}, {}
    for seed in plan.seeds:
        ys, why = [], []
        for cell in plan.cells:
            r = results[f"{cell}:{seed}"]
            y = get(r) if r.state.status == "done" else math.nan
            if r.state.status != "done":
                why.append(f"{cell} {r.state.status}")
            elif y is None or not math.isfinite(y):
                why.append(f"{cell} has no value")
            ys.append(y if y is not None else math.nan)
        if why:
            left_out[seed] = ", ".join(why)
        else:
            vectors[seed] = np.asarray(ys, dtype=float)
    return vectors, left_out


def estimate_effects(plan: Plan, vectors: Dict[int, np.ndarray], max_order: int = 2) -> List[Effect]:
    out = []
    d = plan.design
    for col in d.effects(max_order):
        per_seed = {s: contrast(d, col.word, y) for s, y in vectors.items()}
        iv = t_interval(list(per_seed.values()), CI_LEVEL)
        names = " x ".join(plan.factors[i].name for i in sorted(col.word))
        label = f"{col.label}: {names}"
        out.append(Effect(col, label, per_seed, iv.mean, iv.low, iv.high, not col.aliases))
    return out


# ------------------------------------------------------------------------------ the report


def _f(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float) and abs(x) < 1e-12:  # floating-point noise of a zero contrast
        x = 0.0
    return f"{x:+.{digits}g}" if isinstance(x, float) else str(x)


def _v(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}g}"


def build_report(plan: Plan, metric: str = "auto", threshold: Optional[float] = None) -> dict:
    """Everything the report shows, as a JSON-able dict (``format_markdown`` renders it)."""
    states, results, metric, why, thr = collect(plan, metric, threshold)
    outcome_names = {
        "final": f"{metric} at the end",
        "auc": f"area under the {metric} curve / steps",
        "steps_to_threshold": f"steps to {metric} >= {thr:g}",
    }
    effects, left_out_all = {}, {}
    for o in OUTCOMES:
        vectors, left_out = replicate_vectors(plan, results, lambda r, o=o: r.outcomes.get(o))
        effects[o] = estimate_effects(plan, vectors)
        left_out_all[o] = left_out
    mech = {}
    for m, how, boundary in MECHANISMS:
        key = f"{m} ({how})"
        vectors, left_out = replicate_vectors(plan, results, lambda r, key=key: r.mechanisms.get(key))
        mech[key] = {
            "boundary": boundary,
            "effects": [e for e in estimate_effects(plan, vectors, 1)],
            "left_out": left_out,
        }
    # level means (every finished run at that level) for the plots
    done = [r for r in results.values() if r.state.status == "done"]
    level_means = {}
    for o in OUTCOMES:
        level_means[o] = {}
        for _i, f in enumerate(plan.factors):
            level_means[o][f.name] = {
                lv: _mean([r.outcomes.get(o) for r in done if plan.levels(r.state.run.cell)[f.name] == lv])
                for lv in (-1, 1)
            }
    # alerts per factor level and boundary
    boundaries = ("exploration", "group_contrast", "token_credit", "reward_interpretation")
    alert_table = []
    for f in plan.factors:
        for lv in (-1, 1):
            rs = [r for r in done if plan.levels(r.state.run.cell)[f.name] == lv]
            row = {"factor": f.name, "level": "+" if lv > 0 else "-", "runs": len(rs)}
            for b in boundaries:
                row[b] = sum(1 for r in rs if any(a[0] == b for a in r.alerts))
            alert_table.append(row)
    counts: Dict[str, int] = {}
    for s in states:
        counts[s.status] = counts.get(s.status, 0) + 1
    return {
        "plan": plan,
        "states": states,
        "results": results,
        "metric": metric,
        "metric_why": why,
        "threshold": thr,
        "outcome_names": outcome_names,
        "effects": effects,
        "left_out": left_out_all,
        "mechanisms": mech,
        "level_means": level_means,
        "alert_table": alert_table,
        "boundaries": boundaries,
        "counts": counts,
    }


def _mean(xs):
    v = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(v)) if v else math.nan


def format_markdown(rep: dict) -> str:
    plan: Plan = rep["plan"]
    d = plan.design
    n = len(plan.runs)
    c = rep["counts"]
    L: List[str] = []
    add = L.append
    add(f"# Ablation report: {plan.grid}")
    add("")
    add(
        f"Design: {d.name} {'full' if d.is_full else 'fractional'} factorial, {d.resolution_name}"
        + ("" if d.is_full else f" (generators {', '.join(plan.generators)})")
        + f"; {d.runs} cells x {len(plan.seeds)} seed(s) = {n} runs."
    )
    add("")
    add("| letter | factor | low (-) | high (+) | config fields |")
    add("|---|---|---|---|---|")
    for i, f in enumerate(plan.factors):
        add(
            f"| {LETTERS[i]} | {f.name} | `{' '.join(f.low)}` | `{' '.join(f.high)}` | "
            f"{', '.join(plan.factor_fields.get(f.name, []))} |"
        )
    add("")
    add(
        f"Outcome metric: `{rep['metric']}`, {rep['metric_why']}. Outcomes: **final** = its value at the last logged "
        f"step; **auc** = area under its curve over the logged steps divided by their span (the mean level during "
        f"training); **steps_to_threshold** = first step with `{rep['metric']}` >= {rep['threshold']:g} (a run that "
        "never reaches it counts as its last step + 1, shown as `> last step`)."
    )
    add("")
    add(
        f"Effects: the contrast mean(+) - mean(-) within each complete replicate (one seed, every cell finished); "
        f"estimate = mean over replicates; {CI_LEVEL:.0%} CI = Student t over the replicates' estimates (r - 1 degrees "
        "of freedom; none with a single replicate). Interactions of three or more factors are assumed negligible"
        + ("." if d.is_full else "; aliased effects share one contrast and are listed together (`AB = CD`).")
    )
    add("")
    status = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
    add(f"## Runs: {c.get('done', 0)} of {n} done ({status})")
    add("")
    not_done = [s for s in rep["states"] if s.status != "done"]
    if not_done:
        add("Not finished (reported, never dropped silently; `tools/ablate.py run --grid GRID` fills only these):")
        add("")
        for s in not_done:
            add(f"- `{s.key}` ({plan.cell_label(s.run.cell)}): **{s.status}**, {s.detail}")
        add("")
    add(
        f"| run | levels | final | auc | steps to {rep['threshold']:g} | diagnosis (alerting boundary: alert@onset step) |"
    )
    add("|---|---|---|---|---|---|")
    for s in rep["states"]:
        r = rep["results"][s.key]
        if s.status != "done":
            add(f"| {s.key} | {plan.cell_label(s.run.cell)} | {s.status} | | | |")
            continue
        o = r.outcomes
        st = o.get("steps_to_threshold")
        steps = f"> {st - 1:g}" if r.censored else _v(st)
        note = f" ({r.note})" if r.note else ""
        add(
            f"| {s.key} | {plan.cell_label(s.run.cell)} | {_v(o.get('final'))}{note} | {_v(o.get('auc'))} | {steps} | "
            f"{r.diagnosis} |"
        )
    add("")
    for o in OUTCOMES:
        add(f"## Effects on {o}: {rep['outcome_names'][o]}")
        add("")
        lo = rep["left_out"][o]
        used = [s for s in plan.seeds if s not in lo]
        add(
            f"Replicates used: {', '.join(f'seed {s}' for s in used) or 'none'}"
            + "".join(f"; seed {s} left out ({why})" for s, why in lo.items())
            + "."
        )
        add("")
        if not used:
            add("No complete replicate: no effect can be estimated yet.")
            add("")
            continue
        add(f"| effect | estimate | {CI_LEVEL:.0%} CI | per seed | separable |")
        add("|---|---|---|---|---|")
        for e in rep["effects"][o]:
            ci = "-" if e.low is None else f"[{_f(e.low)}, {_f(e.high)}]"
            seeds = ", ".join(f"{s}: {_f(v)}" for s, v in e.per_seed.items())
            add(f"| {e.label} | {_f(e.estimate)} | {ci} | {seeds} | {'yes' if e.separable else 'no (aliased)'} |")
        add("")
    add("## Mechanism: main effects on each boundary's metrics")
    add("")
    add(
        "Read an effect on the outcome together with what it did to the boundary its control guards "
        "(docs/diagnosis.md): e.g. clip-higher should keep entropy up, dynamic sampling the kept-group ratio."
    )
    add("")
    keys = list(rep["mechanisms"])
    add("| factor | " + " | ".join(f"{k} [{rep['mechanisms'][k]['boundary']}]" for k in keys) + " |")
    add("|---|" + "---|" * len(keys))
    for i, f in enumerate(plan.factors):
        cells = []
        for k in keys:
            e = rep["mechanisms"][k]["effects"][i]
            ci = "" if e.low is None else f" [{_f(e.low)}, {_f(e.high)}]"
            cells.append(f"{_f(e.estimate)}{ci}" if e.per_seed else "-")
        add(f"| {LETTERS[i]} {f.name} | " + " | ".join(cells) + " |")
    add("")
    add("## Diagnosis verdicts by factor level (finished runs alerting on each boundary)")
    add("")
    bs = rep["boundaries"]
    add("| factor | level | runs | " + " | ".join(bs) + " |")
    add("|---|---|---|" + "---|" * len(bs))
    for row in rep["alert_table"]:
        add(f"| {row['factor']} | {row['level']} | {row['runs']} | " + " | ".join(str(row[b]) for b in bs) + " |")
    add("")
    return "\n".join(L)


def to_json(rep: dict) -> dict:
    plan: Plan = rep["plan"]

    def eff(e: Effect) -> dict:
        return {
            "effect": e.column.name,
            "aliases": list(e.column.aliases),
            "label": e.label,
            "estimate": e.estimate,
            "ci": [e.low, e.high] if e.low is not None else None,
            "per_seed": e.per_seed,
            "separable": e.separable,
        }

    return {
        "grid": plan.grid,
        "design": plan.design.name,
        "resolution": plan.design.resolution,
        "factors": [f.to_dict() for f in plan.factors],
        "seeds": plan.seeds,
        "metric": rep["metric"],
        "metric_why": rep["metric_why"],
        "threshold": rep["threshold"],
        "ci": f"{CI_LEVEL:.0%} Student t over seeds",
        "counts": rep["counts"],
        "runs": [
            {
                "key": s.key,
                "cell": s.run.cell,
                "seed": s.run.seed,
                "levels": plan.levels(s.run.cell),
                "status": s.status,
                "detail": s.detail,
                "run_dir": s.run.run_dir,
                "outcomes": rep["results"][s.key].outcomes,
                "censored": rep["results"][s.key].censored,
                "mechanisms": rep["results"][s.key].mechanisms,
                "alerts": [list(a) for a in rep["results"][s.key].alerts],
                "diagnosis": rep["results"][s.key].diagnosis if s.status == "done" else None,
            }
            for s in rep["states"]
        ],
        "effects": {o: [eff(e) for e in es] for o, es in rep["effects"].items()},
        "left_out": {o: {str(k): v for k, v in lo.items()} for o, lo in rep["left_out"].items()},
        "mechanisms": {
            k: {"boundary": v["boundary"], "effects": [eff(e) for e in v["effects"]]}
            for k, v in rep["mechanisms"].items()
        },
        "alerts_by_level": rep["alert_table"],
    }


def plot_report(rep: dict, out_dir: str) -> List[str]:
    """effects.png (every effect with its CI, per outcome), main_effects.png (level means per
    factor), interactions.png (two-factor interaction plots, per outcome)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan: Plan = rep["plan"]
    paths = []
    done = [r for r in rep["results"].values() if r.state.status == "done"]
    # effects (forest plot)
    fig, axes = plt.subplots(
        1, len(OUTCOMES), figsize=(5.5 * len(OUTCOMES), 0.45 * len(rep["effects"]["final"]) + 1.8), squeeze=False
    )
    for ax, o in zip(axes[0], OUTCOMES):
        es = rep["effects"][o]
        ys = np.arange(len(es))[::-1]
        for y, e in zip(ys, es):
            if not e.per_seed:
                continue
            color = "tab:blue" if e.separable else "tab:orange"
            if e.low is not None:
                ax.plot([e.low, e.high], [y, y], color=color, lw=2)
            ax.plot([e.estimate], [y], "o", color=color)
            ax.plot(list(e.per_seed.values()), [y] * len(e.per_seed), "|", color="grey", ms=8)
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks(ys)
        ax.set_yticklabels([e.column.label for e in es], fontsize=8)
        ax.set_title(rep["outcome_names"][o], fontsize=9)
        ax.set_xlabel(f"effect (+ minus -), {CI_LEVEL:.0%} t interval over seeds", fontsize=8)
    fig.suptitle(
        f"{plan.design.name}, {plan.design.resolution_name}; letters: "
        + ", ".join(f"{LETTERS[i]} {f.name}" for i, f in enumerate(plan.factors)),
        fontsize=9,
    )
    fig.tight_layout()
    p = os.path.join(out_dir, "effects.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)
    # main effects: level means, each finished run a dot
    k = len(plan.factors)
    fig, axes = plt.subplots(len(OUTCOMES), k, figsize=(2.6 * k + 1, 2.4 * len(OUTCOMES)), squeeze=False)
    for row, o in enumerate(OUTCOMES):
        for j, f in enumerate(plan.factors):
            ax = axes[row][j]
            for lv, x in ((-1, 0), (1, 1)):
                vals = [r.outcomes.get(o) for r in done if plan.levels(r.state.run.cell)[f.name] == lv]
                ax.plot([x] * len(vals), vals, ".", color="grey", alpha=0.6)
            means = rep["level_means"][o][f.name]
            ax.plot([0, 1], [means[-1], means[1]], "o-", color="tab:blue")
            ax.set_xticks([0, 1])
            ax.set_xticklabels(["-", "+"])
            ax.set_xlim(-0.4, 1.4)
            if row == 0:
                ax.set_title(f"{LETTERS[j]} {f.name}", fontsize=9)
            if j == 0:
                ax.set_ylabel(o, fontsize=9)
    fig.tight_layout()
    p = os.path.join(out_dir, "main_effects.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)
    # interactions
    pairs = [(a, b) for a in range(k) for b in range(a + 1, k)]
    if pairs:
        fig, axes = plt.subplots(
            len(OUTCOMES), len(pairs), figsize=(2.8 * len(pairs) + 1, 2.5 * len(OUTCOMES)), squeeze=False
        )
        for row, o in enumerate(OUTCOMES):
            for j, (a, b) in enumerate(pairs):
                ax = axes[row][j]
                fa, fb = plan.factors[a], plan.factors[b]
                for lb, color in ((-1, "tab:red"), (1, "tab:green")):
                    ys = [
                        _mean(
                            [
                                r.outcomes.get(o)
                                for r in done
                                if plan.levels(r.state.run.cell)[fa.name] == la
                                and plan.levels(r.state.run.cell)[fb.name] == lb
                            ]
                        )
                        for la in (-1, 1)
                    ]
                    ax.plot([0, 1], ys, "o-", color=color, label=f"{LETTERS[b]}{'+' if lb > 0 else '-'}")
                ax.set_xticks([0, 1])
                ax.set_xticklabels([f"{LETTERS[a]}-", f"{LETTERS[a]}+"])
                if row == 0:
                    ax.set_title(f"{LETTERS[a]}{LETTERS[b]}: {fa.name} x {fb.name}", fontsize=7)
                    ax.legend(fontsize=7)
                if j == 0:
                    ax.set_ylabel(o, fontsize=9)
        fig.tight_layout()
        p = os.path.join(out_dir, "interactions.png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def write_report(
    plan: Plan,
    out_dir: Optional[str] = None,
    metric: str = "auto",
    threshold: Optional[float] = None,
    plots: bool = True,
) -> Tuple[str, dict]:
    """Build the report and write ``report.md``, ``report.json`` and the plots to ``out_dir``
    (default ``GRID/report``); returns (markdown, report)."""
    rep = build_report(plan, metric, threshold)
    out_dir = out_dir or os.path.join(plan.grid, "report")
    os.makedirs(out_dir, exist_ok=True)
    md = format_markdown(rep)
    files = []
    if plots and any(s.status == "done" for s in rep["states"]):
        files = plot_report(rep, out_dir)
        md += "\n## Plots\n\n" + "\n".join(f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in files) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(md)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(to_json(rep), f, indent=1, default=float)
    rep["files"] = [os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.json"), *files]
    return md, rep
