"""One rollout step's metrics: the assembly of the metrics.jsonl row (the keys are the contract
of docs/metrics.md); the trainer ranks' ``StepStats`` are reduced by ``training/stats.reduce_step_stats``."""

from __future__ import annotations

from ..algo.staleness import staleness_histogram

# the staleness histogram's keys (docs/metrics.md): lags 0..7, and 8 or more in one bin
STALENESS_HIST_KEYS = {
    "0": "staleness_lag0_samples",
    "1": "staleness_lag1_samples",
    "2": "staleness_lag2_samples",
    "3": "staleness_lag3_samples",
    "4": "staleness_lag4_samples",
    "5": "staleness_lag5_samples",
    "6": "staleness_lag6_samples",
    "7": "staleness_lag7_samples",
    "8+": "staleness_lag8_or_more_samples",
}


def mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def step_metrics(
    step: int,
    roll,
    samples: list,
    train_metrics: dict,
    hybrid_info: dict,
    *,
    repetition_rate,
    engine_restarts: int,
    timings: dict,
    untrainable: int = 0,
) -> dict:
    """The metrics.jsonl row of one rollout step (before eval and time_step). ``samples``: the
    trainer's list; ``untrainable``: the kept groups' samples left out of it (no trainable token),
    to which ``untrainable_samples`` adds the samples of the mixed groups the rollout manager did
    not keep for having none."""
    gen = [s for g in roll.generated for s in g.samples]
    n_groups = max(len(roll.generated), 1)
    # tokens generated under this step's weights only (not a --partial-rollout prefix's older ones)
    diffs = [
        abs(o - e)
        for s in samples
        if s.old_logprobs
        for o, e in zip(s.old_logprobs[s.stale_len :], s.engine_logprobs[s.stale_len :])
        if s.step_generated == step
    ]
    return {
        "step": step,
        "reward_mean": mean(s.reward for s in gen),
        "acc_mean": mean(float(s.acc) for s in gen),
        "score_mean": mean(s.score for s in gen),
        **train_metrics,
        "kept_group_ratio": roll.num_kept / n_groups,
        "all_correct_ratio": roll.num_all_correct / n_groups,
        "all_wrong_ratio": roll.num_all_wrong / n_groups,
        "num_gen_batches": roll.num_gen_batches,
        "num_groups_generated": len(roll.generated),
        "surplus_reused_ratio": roll.reused / max(len(roll.groups), 1),
        "partial_resumed_samples": roll.partial_resumed,
        "partial_dropped_prefixes": roll.partial_dropped,
        "partial_pending_groups": roll.partial_pending,
        "rollout_aborted_samples": roll.aborted_samples,
        "untrainable_samples": int(untrainable) + int(getattr(roll, "untrainable_samples", 0)),
        "response_length_mean": mean(len(s.response_ids) for s in gen),
        "response_length_max": max((len(s.response_ids) for s in gen), default=0),
        "repetition_rate": float(repetition_rate([s.response_ids for s in gen])) if gen else 0.0,
        "truncation_ratio": mean(float(s.finish_reason == "length") for s in gen),
        "overlong_penalty_mean": mean(s.overlong_penalty for s in gen),
        "no_answer_rate": mean(float(s.reason == "no_answer") for s in gen),
        "timeout_rate": mean(float(s.reason == "timeout") for s in gen),
        "train_infer_logprob_diff": mean(diffs),
        "train_infer_logprob_diff_max": max(diffs, default=0.0),
        "weight_sync_probe_diff": hybrid_info.get("probe_max_abs"),
        "weight_sync_checksums_compared": hybrid_info.get("checksums_compared"),
        "engine_restarts": engine_restarts,
        "sync_bytes": hybrid_info.get("sync", {}).get("bytes", 0),
        "time_generate": roll.time_generate,
        "time_verify": roll.time_verify,
        **timings,
        "time_save": 0.0,
    }


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}h{rest // 60:02d}m" if h else f"{rest // 60}m{rest % 60:02d}s"


def summary_line(m: dict, total: int | None = None, eta_s: float | None = None) -> str:
    """The step's one line: ``[step k/N]`` and, when ``eta_s`` is known, the time the remaining
    steps take at this run's mean step time so far."""
    probe = m["weight_sync_probe_diff"]
    where = f"{m['step']}/{total}" if total else f"{m['step']}"
    eta = f" eta {_clock(eta_s)}" if eta_s is not None else ""
    return (
        f"[step {where}] acc {m['acc_mean']:.3f} reward {m['reward_mean']:+.3f} kept {m['kept_group_ratio']:.2f} "
        f"rounds {m['num_gen_batches']} len {m['response_length_mean']:.1f} ent {m.get('entropy', 0):.3f} "
        f"clip {m.get('clip_frac_low', 0):.3f}/{m.get('clip_frac_high', 0):.3f} gnorm {m.get('grad_norm', 0):.3f} "
        f"probe {probe if probe is not None else '-'} "
        f"time {m['time_step']:.1f}s (gen {m['time_generate']:.1f} train {m['time_train']:.1f} sync {m['time_sync']:.2f})"
        f"{eta}"
    )


def sample_staleness(step: int, samples: list) -> dict:
    """``sample_staleness_mean`` / ``_max``: versions between step ``step``'s weights and the
    oldest token of each trained sample (``Sample.token_versions``: stamped with
    ``--partial-rollout`` or ``--async-mode``; 0 everywhere in synchronous training). Empty when
    no sample carries versions; with ``staleness_lag<k>_samples``, the counts per lag."""
    lags = [step - min(s.token_versions) for s in samples if getattr(s, "token_versions", None)]
    if not lags:
        return {}
    # the histogram: staleness_lag<k>_samples, the samples whose oldest token is k versions old
    hist = {STALENESS_HIST_KEYS[k]: n for k, n in staleness_histogram(lags, top=8).items()}
    return {"sample_staleness_mean": sum(lags) / len(lags), "sample_staleness_max": max(lags), **hist}
