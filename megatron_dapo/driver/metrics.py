"""One rollout step's metrics: the DP reduction of the trainer ranks' outputs and the
assembly of the metrics.jsonl row (the keys are the contract of docs/metrics.md)."""

from __future__ import annotations

import math

from ..algo.routing_metrics import layer_metrics


def mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def reduce_train_outputs(outs: list, reporters: dict) -> dict:
    """Reduce ``outs[rank] = [per optimizer step output]`` of the worker's ``train`` over the
    DP reporters (last PP stage, TP rank 0 of each DP rank) and the optimizer steps.

    ``sums`` are (sum, count) pairs, so the means are token-weighted over the whole step.
    Returns the metrics and the number of skipped (non-finite) optimizer steps.
    """
    sums, ratio_max = {}, 0.0
    for r in reporters.values():
        for step_out in outs[r]:
            for k, (s, c) in step_out["sums"].items():
                acc = sums.setdefault(k, [0.0, 0.0])
                acc[0] += s
                acc[1] += c
            ratio_max = max(ratio_max, step_out["ratio_max"])
    norms = [o["grad_norm"] for o in outs[0]]
    skipped = sum(0 if o["update_successful"] else 1 for o in outs[0])
    m = {k: (v[0] / v[1] if v[1] else 0.0) for k, v in sums.items()}
    finite = [n for n in norms if n is not None and math.isfinite(n)]
    m.update({
        "ratio_max": ratio_max,
        "grad_norm": mean(finite) if finite else float("nan"),
        "optimizer_steps": len(norms),
        "skipped_optimizer_steps": skipped,
        "lr": outs[0][-1]["lr"] if outs[0] else 0.0,
        # max over mean of the DP ranks' tokens, worst optimizer step (the same on every rank)
        "dp_token_imbalance": max((o.get("dp_token_imbalance", 1.0) for o in outs[0]), default=1.0),
    })
    # --routing-replay: per-layer routing agreement / load imbalance / router entropy, summed over
    # the DP reporters and the step's optimizer steps (algo/routing_metrics.py)
    routing = [o["routing"]["stats"] for r in reporters.values() for o in outs[r] if o.get("routing")]
    if routing:
        m.update(layer_metrics(sum(routing[1:], routing[0].clone())))
    return m


def step_metrics(step: int, roll, samples: list, train_metrics: dict, hybrid_info: dict, *, repetition_rate,
                 engine_restarts: int, timings: dict, untrainable: int = 0) -> dict:
    """The metrics.jsonl row of one rollout step (before eval and time_step). ``samples``: the
    trainer's list; ``untrainable``: the kept groups' samples left out of it (no trainable token),
    to which ``untrainable_samples`` adds the samples of the mixed groups the rollout manager did
    not keep for having none."""
    gen = [s for g in roll.generated for s in g.samples]
    n_groups = max(len(roll.generated), 1)
    # tokens generated under this step's weights only (not a --partial-rollout prefix's older ones)
    diffs = [abs(o - e) for s in samples if s.old_logprobs
             for o, e in zip(s.old_logprobs[s.stale_len:], s.engine_logprobs[s.stale_len:])
             if s.step_generated == step]
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
        "engine_restarts": engine_restarts,
        "sync_bytes": hybrid_info.get("sync", {}).get("bytes", 0),
        "time_generate": roll.time_generate,
        "time_verify": roll.time_verify,
        **timings,
        "time_save": 0.0,
    }


def summary_line(m: dict) -> str:
    probe = m["weight_sync_probe_diff"]
    return (
        f"[step {m['step']}] acc {m['acc_mean']:.3f} reward {m['reward_mean']:+.3f} kept {m['kept_group_ratio']:.2f} "
        f"rounds {m['num_gen_batches']} len {m['response_length_mean']:.1f} ent {m.get('entropy', 0):.3f} "
        f"clip {m.get('clip_frac_low', 0):.3f}/{m.get('clip_frac_high', 0):.3f} gnorm {m.get('grad_norm', 0):.3f} "
        f"probe {probe if probe is not None else '-'} "
        f"time {m['time_step']:.1f}s (gen {m['time_generate']:.1f} train {m['time_train']:.1f} sync {m['time_sync']:.2f})"
    )
