"""The per-boundary failure-mode detectors of the diagnosis (analysis.py assembles the verdicts).

One function per boundary reads the :class:`History` against the :class:`Thresholds` and
records an :class:`Alert` for a condition that holds at the last step or a sudden change in the
recent window, a warning (an :class:`Alert` of severity ``"warning"``) for one that held earlier
and recovered, and notes; ``_CHECKS`` maps each boundary key to its detector.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from megatron_dapo.diagnostics.history import History
from megatron_dapo.diagnostics.series import (
    _early,
    _eff,
    _finite,
    _fmt,
    _onset,
    _rolling_mean,
    _slope,
    _slope_se,
    _step,
    _summary,
    _trend_window,
)
from megatron_dapo.diagnostics.thresholds import Thresholds

__all__ = ["Alert"]


@dataclasses.dataclass
class Alert:
    boundary: str
    kind: str  # e.g. "entropy_collapse"
    metric: str
    step: float  # onset step (the step of the jump for sudden changes)
    value: float  # the value that crossed (smoothed recent value, or the jumped-to value)
    threshold: float
    message: str
    severity: str = "alert"  # "alert" (current) or "warning" (in the past / recovered)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _Collector:
    def __init__(self, boundary: str, th: Thresholds):
        self.boundary = boundary
        self.th = th
        self.alerts: list[Alert] = []
        self.warnings: list[Alert] = []
        self.notes: list[str] = []

    def condition(
        self,
        kind: str,
        metric: str,
        t: np.ndarray,
        smoothed: np.ndarray,
        cond: np.ndarray,
        threshold: float,
        describe: Callable[[float, str, int], str],
    ) -> None:
        # the smoothed value is judged only once its window is full (no verdicts on one step)
        cond = np.asarray(cond, dtype=bool).copy()
        cond[: _eff(self.th.window, len(t)) - 1] = False
        holds, onset, first = _onset(t, cond)
        if holds:
            v = float(smoothed[-1])
            self.alerts.append(
                Alert(
                    self.boundary,
                    kind,
                    metric,
                    onset,
                    v,
                    threshold,
                    describe(v, f"since step {_step(onset)}", len(cond) - 1),
                )
            )
        elif first is not None:
            i = int(np.argmax(cond))
            v = float(smoothed[i])
            self.warnings.append(
                Alert(
                    self.boundary,
                    kind,
                    metric,
                    first,
                    v,
                    threshold,
                    describe(v, f"at step {_step(first)}, recovered since", i),
                    "warning",
                )
            )


def _sudden(col: _Collector, h: History, metric: str, direction: str, th: Thresholds, rate: bool, hint: str) -> None:
    """Sudden one-step changes of ``metric`` against the median of the preceding window."""
    t, x = _finite(h, metric)
    n = len(x)
    w = max(3, int(th.window))  # a full baseline window: no sudden-change verdicts before it
    if n < max(th.min_steps, w + 1):
        return
    recent_from = n - _eff(th.window, n)
    found_alert = found_warning = False
    for i in range(w, n):
        prev = x[i - w : i]
        base = float(np.median(prev))
        sigma = 1.4826 * float(np.median(np.abs(prev - base)))
        delta = (base - x[i]) if direction == "drop" else (x[i] - base)
        if delta <= 0:
            continue
        if delta <= th.sudden_z * sigma or delta <= th.sudden_rel * abs(base):
            continue
        if rate and delta <= th.sudden_abs_rate:
            continue
        word = "dropped" if direction == "drop" else "jumped"
        msg = (
            f"{metric} {word} from ~{_fmt(base)} to {_fmt(float(x[i]))} at step "
            f"{_step(float(t[i]))} (sudden change){hint}"
        )
        if i >= recent_from:
            if not found_alert:
                col.alerts.append(
                    Alert(col.boundary, f"sudden_{direction}", metric, float(t[i]), float(x[i]), base, msg)
                )
                found_alert = True
        elif not found_warning:
            col.warnings.append(
                Alert(col.boundary, f"sudden_{direction}", metric, float(t[i]), float(x[i]), base, msg, "warning")
            )
            found_warning = True


# ----------------------------------------------------------------------------------------------
# the four boundaries
# ----------------------------------------------------------------------------------------------


def _exploration(h: History, th: Thresholds, col: _Collector) -> None:
    t, x = _finite(h, "entropy")
    n = len(x)
    if n:
        if n >= th.min_steps:
            early = _early(x, th)
            sm = _rolling_mean(x, _eff(th.window, n))
            if early > 0:
                col.condition(
                    "entropy_collapse",
                    "entropy",
                    t,
                    sm,
                    sm < th.entropy_collapse_ratio * early,
                    th.entropy_collapse_ratio,
                    lambda v, when, _i: (
                        f"entropy collapsed to {_fmt(v)} = {v / early:.0%} of its early "
                        f"{_fmt(early)} (< {th.entropy_collapse_ratio:.0%}) {when}: the "
                        "policy stopped exploring; raise eps_high (clip-higher)"
                    ),
                )
                col.condition(
                    "entropy_runaway",
                    "entropy",
                    t,
                    sm,
                    sm > th.entropy_explode_ratio * early,
                    th.entropy_explode_ratio,
                    lambda v, when, _i: (
                        f"entropy ran away to {_fmt(v)} = {v / early:.1f}x its early "
                        f"{_fmt(early)} (> {th.entropy_explode_ratio:g}x) {when}: "
                        "sampling turns to noise; lower eps_high or the learning rate"
                    ),
                )
        else:
            col.notes.append(f"only {n} entropy values: no comparison with the early value yet")
        _sudden(col, h, "entropy", "drop", th, rate=False, hint=": exploration lost in one update")
    lo, hi = h.get("clip_frac_low"), h.get("clip_frac_high")
    if h.has("clip_frac_low") or h.has("clip_frac_high"):
        both = np.where(np.isfinite(lo), lo, 0.0) + np.where(np.isfinite(hi), hi, 0.0)
        m = np.isfinite(lo) | np.isfinite(hi)
        tc, xc = h.steps[m], both[m]
        sm = _rolling_mean(xc, _eff(th.window, len(xc)))
        col.condition(
            "clip_frac_high",
            "clip_frac",
            tc,
            sm,
            sm > th.clip_frac_max,
            th.clip_frac_max,
            lambda v, when, _i: (
                f"{v:.1%} of tokens clipped (low + high > {th.clip_frac_max:.0%}) "
                f"{when}: each rollout moves the policy too far; lower the learning "
                "rate or the number of mini-batches per rollout"
            ),
        )
    tk, xk = _finite(h, "mismatch_kl")
    if len(xk):
        sm = _rolling_mean(xk, _eff(th.window, len(xk)))
        col.condition(
            "engine_mismatch_high",
            "mismatch_kl",
            tk,
            sm,
            sm > th.mismatch_kl_max,
            th.mismatch_kl_max,
            lambda v, when, _i: (
                f"the engine samples from a different policy than the trainer computes: "
                f"KL(pi_engine || pi_old) {_fmt(v, 4)} (> {th.mismatch_kl_max:g}) {when}; "
                "the sampled tokens are off-policy: use --tis-mode token-truncate, check "
                "the engine's precision and logprob mode against the trainer's"
            ),
        )
    _routing(h, th, col)
    _off_policy(h, th, col)


def _off_policy(h: History, th: Thresholds, col: _Collector) -> None:
    """The off-policy section (issue 40): the importance weights' effective sample size
    (``is_ess_frac``) collapses. With trained tokens from older weights (``offpolicy_token_frac``:
    partial rollout, asynchronous training) the collapse is staleness-driven; without them it is
    the engine/trainer mismatch."""
    te, xe = _finite(h, "is_ess_frac")
    if not len(xe):
        return
    sm = _rolling_mean(xe, _eff(th.window, len(xe)))
    _, xp = _finite(h, "offpolicy_token_frac")
    stale = float(np.mean(xp[-_eff(th.window, len(xp)) :])) if len(xp) else 0.0

    def describe(v: float, when: str, _i: int) -> str:
        if stale > 0:
            return (
                f"off-policy collapse, staleness-driven: the importance weights' ESS / N fell to {_fmt(v)} "
                f"(< {th.ess_frac_min:g}) {when} while {stale:.0%} of the trained tokens came from older "
                "weights: a few stale tokens carry the update; lower --max-staleness (or "
                "--partial-rollout-max-staleness), or let --staleness-control ess steer it"
            )
        return (
            f"off-policy collapse: the importance weights' ESS / N fell to {_fmt(v)} (< {th.ess_frac_min:g}) "
            f"{when} with every token of the current weights: the engine and the trainer disagree; check "
            "mismatch_kl and the engine's precision, lower --tis-cap"
        )

    col.condition("offpolicy_collapse", "is_ess_frac", te, sm, sm < th.ess_frac_min, th.ess_frac_min, describe)
    _sudden(col, h, "is_ess_frac", "drop", th, rate=True, hint=": the importance weights degenerated in one update")


def _routing(h: History, th: Thresholds, col: _Collector) -> None:
    """MoE (docs/moe.md, "Routing replay"): the engine and the trainer route tokens to other
    experts (the importance ratio drifts: the mismatch that collapses MoE RL runs), or the
    router collapses onto few experts."""
    ta, xa = _finite(h, "moe/routing_agreement_min")
    if len(xa):
        sm = _rolling_mean(xa, _eff(th.window, len(xa)))
        early = _early(xa, th) if len(xa) >= th.min_steps else float("nan")
        low = sm < th.routing_agreement_min
        if math.isfinite(early):
            low = low | (sm < early - th.routing_agreement_drop)
        col.condition(
            "routing_drift",
            "moe/routing_agreement_min",
            ta,
            sm,
            low,
            th.routing_agreement_min,
            lambda v, when, _i: (
                f"engine and trainer route differently: worst-layer top-k agreement {_fmt(v)} "
                f"(< {th.routing_agreement_min:g}, or {th.routing_agreement_drop:g} below its "
                f"early {_fmt(early)}) {when}; the importance ratio drifts: train with "
                "--routing-replay, check the engine's precision"
            ),
        )
    tl, xl = _finite(h, "moe/load_imbalance_max")
    if len(xl):
        sm = _rolling_mean(xl, _eff(th.window, len(xl)))
        col.condition(
            "router_collapse",
            "moe/load_imbalance_max",
            tl,
            sm,
            sm > th.load_imbalance_max,
            th.load_imbalance_max,
            lambda v, when, _i: (
                f"the busiest expert takes {_fmt(v)}x the mean load (> {th.load_imbalance_max:g}) "
                f"{when}: the router collapses onto few experts; raise --moe-aux-loss-coeff"
            ),
        )


def _group_contrast(h: History, th: Thresholds, col: _Collector) -> None:
    t, x = _finite(h, "kept_group_ratio")
    n = len(x)
    ac = _summary(h, "all_correct_ratio", th).recent
    aw = _summary(h, "all_wrong_ratio", th).recent
    if ac is not None and aw is not None:
        why = (
            "mostly all-correct groups: the data became too easy"
            if ac >= aw
            else "mostly all-wrong groups: the data is too hard for the model"
        )
    else:
        why = "groups became uniform (zero advantage)"
    if n:
        sm = _rolling_mean(x, _eff(th.window, n))
        cond = sm < th.kept_group_ratio_min
        early = _early(x, th)
        if n >= th.min_steps and early > th.kept_group_ratio_min:
            cond = cond | (sm < th.kept_group_ratio_drop * early)
        col.condition(
            "kept_groups_low",
            "kept_group_ratio",
            t,
            sm,
            cond,
            th.kept_group_ratio_min,
            lambda v, when, _i: (
                f"kept-group ratio fell to {_fmt(v)} (early {_fmt(early)}; alert below "
                f"{th.kept_group_ratio_min:g} or {th.kept_group_ratio_drop:.0%} of early) "
                f"{when}: {why}; dynamic sampling needs ever more generation"
            ),
        )
        _sudden(col, h, "kept_group_ratio", "drop", th, rate=True, hint=": the groups lost their contrast at once")
    for key, limit, text in (
        ("all_correct_ratio", th.all_correct_ratio_max, "the data became too easy: refresh it with harder problems"),
        (
            "all_wrong_ratio",
            th.all_wrong_ratio_max,
            "the data is too hard for the model: easier problems or a stronger start",
        ),
    ):
        tk, xk = _finite(h, key)
        if len(xk):
            sm = _rolling_mean(xk, _eff(th.window, len(xk)))
            col.condition(
                f"{key}_high",
                key,
                tk,
                sm,
                sm > limit,
                limit,
                lambda v, when, _i, key=key, limit=limit, text=text: (
                    f"{key} at {_fmt(v)} (> {limit:g}) {when}: these groups have zero advantage; {text}"
                ),
            )
    tg, xg = _finite(h, "num_gen_batches")
    if len(xg):
        sm = _rolling_mean(xg, _eff(th.window, len(xg)))
        cond = sm >= th.num_gen_batches_max
        g_early = _early(xg, th)
        if len(xg) >= th.min_steps:
            cond = cond | ((sm >= th.num_gen_batches_rise * g_early) & (sm - g_early >= 1.0))
        col.condition(
            "gen_batches_rising",
            "num_gen_batches",
            tg,
            sm,
            cond,
            th.num_gen_batches_rise,
            lambda v, when, _i: (
                f"{_fmt(v)} generation rounds per step (early {_fmt(g_early)}; alert at "
                f"{th.num_gen_batches_max:g} or {th.num_gen_batches_rise:g}x early) {when}: "
                "dynamic sampling struggles to fill the batch with mixed groups"
            ),
        )


def _token_credit(h: History, th: Thresholds, col: _Collector) -> None:
    tl, xl = _finite(h, "response_length_mean")
    acc = h.get("acc_mean")
    if len(xl):
        if not h.has("acc_mean"):
            col.notes.append("acc_mean not logged: length growth cannot be read against accuracy")
        else:
            m = np.isfinite(h.get("response_length_mean")) & np.isfinite(acc)
            t, ln, ac = h.steps[m], h.get("response_length_mean")[m], acc[m]
            n = len(t)
            if n >= th.min_steps:
                tw = min(n, max(_trend_window(th, n), int(th.min_steps)))
                growth = np.full(n, np.nan)
                gain = np.full(n, np.nan)
                cond = np.zeros(n, dtype=bool)
                for i in range(tw - 1, n):
                    sl = slice(i - tw + 1, i + 1)
                    span = float(t[i] - t[i - tw + 1])
                    mean_len = float(np.mean(ln[sl]))
                    s_len = _slope(t[sl], ln[sl])
                    if mean_len <= 0 or not math.isfinite(s_len):
                        continue
                    growth[i] = s_len * span / mean_len
                    gain[i] = _slope(t[sl], ac[sl]) * span
                    # the growth must be material and clear of the noise (> 3 standard errors)
                    cond[i] = (
                        growth[i] > th.length_growth_min
                        and s_len > 3 * _slope_se(t[sl], ln[sl], s_len)
                        and not gain[i] >= th.acc_stall_delta
                    )
                # the slow version: over the whole run the (smoothed) length has grown by
                # length_growth_run of its early value while accuracy gained < acc_stall_delta
                w = _eff(th.window, n)
                len_sm, acc_sm = _rolling_mean(ln, w), _rolling_mean(ac, w)
                len0, acc0 = _early(ln, th), _early(ac, th)
                run_growth = len_sm / len0 - 1 if len0 > 0 else np.zeros(n)
                slow = (run_growth > th.length_growth_run) & (acc_sm - acc0 < th.acc_stall_delta)

                def describe(v: float, when: str, i: int) -> str:
                    if cond[i]:
                        what = (
                            f"response length grew {growth[i]:+.0%} over the last {tw} steps "
                            f"while acc_mean changed {_fmt(float(gain[i]), 2)}"
                        )
                    else:
                        what = (
                            f"response length grew {run_growth[i]:+.0%} since the start "
                            f"({_fmt(len0)} -> {_fmt(float(len_sm[i]))} tokens) while acc_mean "
                            f"changed {_fmt(float(acc_sm[i] - acc0), 2)}"
                        )
                    return (
                        f"{what} (< {th.acc_stall_delta:g}) {when}: long samples earn credit "
                        "without answers; check the token-level loss and overlong shaping"
                    )

                col.condition(
                    "length_without_accuracy",
                    "response_length_mean",
                    t,
                    growth,
                    cond | slow,
                    th.length_growth_min,
                    describe,
                )
            else:
                col.notes.append(f"only {n} steps: no length-vs-accuracy trend yet")
        _sudden(
            col, h, "response_length_mean", "rise", th, rate=False, hint=": responses became much longer in one update"
        )
    tr, xr = _finite(h, "repetition_rate")
    if len(xr):
        sm = _rolling_mean(xr, _eff(th.window, len(xr)))
        cond = sm > th.repetition_rate_max
        r_early = _early(xr, th)
        if len(xr) >= th.min_steps:
            cond = cond | (sm - r_early > th.repetition_rise)
        col.condition(
            "repetition_rising",
            "repetition_rate",
            tr,
            sm,
            cond,
            th.repetition_rate_max,
            lambda v, when, _i: (
                f"{v:.1%} of responses end in a repetition loop (early {r_early:.1%}; "
                f"alert above {th.repetition_rate_max:.0%} or +{th.repetition_rise:.0%}) "
                f"{when}: tokens of degenerate loops share the sample's reward"
            ),
        )
        _sudden(col, h, "repetition_rate", "rise", th, rate=True, hint=": the policy fell into loops at once")


def _reward_interpretation(h: History, th: Thresholds, col: _Collector) -> None:
    tt, xt = _finite(h, "truncation_ratio")
    if len(xt):
        sm = _rolling_mean(xt, _eff(th.window, len(xt)))
        col.condition(
            "truncation_high",
            "truncation_ratio",
            tt,
            sm,
            sm > th.truncation_ratio_max,
            th.truncation_ratio_max,
            lambda v, when, _i: (
                f"{v:.1%} of responses truncated at the length cap (> "
                f"{th.truncation_ratio_max:.0%}) {when}: truncated reasoning is scored "
                "as wrong, reward noise; use overlong filtering / soft punishment or a "
                "larger cap"
            ),
        )
        _sudden(col, h, "truncation_ratio", "rise", th, rate=True, hint=": many responses hit the cap at once")
    to, xo = _finite(h, "overlong_penalty_mean")
    if len(xo):
        sm = np.abs(_rolling_mean(xo, _eff(th.window, len(xo))))
        col.condition(
            "overlong_penalty_high",
            "overlong_penalty_mean",
            to,
            sm,
            sm > th.overlong_penalty_max,
            th.overlong_penalty_max,
            lambda v, when, _i: (
                f"overlong penalty averages {_fmt(v)} per sample (|mean| > "
                f"{th.overlong_penalty_max:g}) {when}: length shaping outweighs the "
                "correctness signal"
            ),
        )
    tn, xn = _finite(h, "no_answer_rate")
    if len(xn):
        sm = _rolling_mean(xn, _eff(th.window, len(xn)))
        cond = sm > th.no_answer_rate_max
        n_early = _early(xn, th)
        if len(xn) >= th.min_steps:
            cond = cond | (sm - n_early > th.no_answer_rise)
        col.condition(
            "no_answer_rising",
            "no_answer_rate",
            tn,
            sm,
            cond,
            th.no_answer_rate_max,
            lambda v, when, _i: (
                f"{v:.1%} of responses give no parsable answer (early {n_early:.1%}; "
                f"alert above {th.no_answer_rate_max:.0%} or +{th.no_answer_rise:.0%}) "
                f"{when}: format failures are scored as wrong answers"
            ),
        )
        _sudden(col, h, "no_answer_rate", "rise", th, rate=True, hint=": answers went missing at once")
    tp, xp = _finite(h, "offpolicy_token_frac")
    if len(xp):
        sm = _rolling_mean(xp, _eff(th.window, len(xp)))
        col.condition(
            "offpolicy_tokens_high",
            "offpolicy_token_frac",
            tp,
            sm,
            sm > th.offpolicy_token_frac_max,
            th.offpolicy_token_frac_max,
            lambda v, when, _i: (
                f"{v:.1%} of the trained tokens were generated under older weights "
                f"(> {th.offpolicy_token_frac_max:.0%}, --partial-rollout) {when}: the rewards "
                "credit a policy that no longer exists; lower --partial-rollout-max-staleness "
                "or raise --over-sampling-batch-size"
            ),
        )


_CHECKS = {
    "exploration": _exploration,
    "group_contrast": _group_contrast,
    "token_credit": _token_credit,
    "reward_interpretation": _reward_interpretation,
}
