"""Synthetic metric histories: a healthy DAPO run and one history per failure mode.

Every history logs every key of the metrics contract. A failure mode changes only the metrics
of its own boundary, so the diagnosis must raise that boundary's alert and no other.
"""

import json

import numpy as np

STEPS = 80


def healthy(n=STEPS, seed=0):
    """A run that learns: accuracy rises, length grows slowly with it, entropy eases a little,
    a steady share of groups is kept, few truncations, answers found."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=float)
    f = t / max(n - 1, 1)

    def noisy(x, rel=0.03):
        return x * (1 + rel * rng.standard_normal(n))

    acc = 0.30 + 0.25 * f
    h = {
        "step": t,
        "acc_mean": noisy(acc, 0.02),
        "reward_mean": noisy(2 * acc - 1, 0.02),
        "entropy": noisy(0.60 - 0.12 * f),
        "clip_frac_low": noisy(np.full(n, 0.002)),
        "clip_frac_high": noisy(np.full(n, 0.004)),
        "approx_kl": noisy(np.full(n, 0.001)),
        "grad_norm": noisy(np.full(n, 0.3), 0.1),
        "kept_group_ratio": noisy(0.55 - 0.05 * f),
        "all_correct_ratio": noisy(0.15 + 0.05 * f),
        "all_wrong_ratio": noisy(0.30 - 0.00 * f),
        "num_gen_batches": np.where(rng.random(n) < 0.2, 2.0, 1.0),
        "response_length_mean": noisy(900 + 250 * f, 0.02),
        "response_length_max": noisy(np.full(n, 3800.0), 0.03),
        "repetition_rate": np.abs(noisy(np.full(n, 0.01), 0.3)),
        "truncation_ratio": np.abs(noisy(np.full(n, 0.02), 0.2)),
        "overlong_penalty_mean": -np.abs(noisy(np.full(n, 0.01), 0.2)),
        "no_answer_rate": np.abs(noisy(np.full(n, 0.03), 0.2)),
        "train_infer_logprob_diff": np.abs(noisy(np.full(n, 0.01), 0.2)),
        "time_generate": noisy(np.full(n, 100.0)),
        "time_train": noisy(np.full(n, 60.0)),
        "time_step": noisy(np.full(n, 180.0)),
        "tokens_per_second": noisy(np.full(n, 5000.0)),
    }
    return h


def noisy_healthy(n=20, seed=0, rel=0.10):
    """A short healthy run with the large per-step noise of a small CPU demo (small batches)."""
    h = healthy(n, seed)
    rng = np.random.default_rng(1000 + seed)
    for k in (
        "entropy",
        "kept_group_ratio",
        "response_length_mean",
        "acc_mean",
        "truncation_ratio",
        "no_answer_rate",
        "repetition_rate",
    ):
        h[k] = np.clip(h[k] * (1 + rel * rng.standard_normal(n)), 0, None)
    return h


def _ramp(n, start, end, begin=0.4):
    """Flat at ``start`` until ``begin`` of the run, then linear to ``end``."""
    f = np.clip((np.arange(n) / (n - 1) - begin) / (1 - begin), 0, 1)
    return start + (end - start) * f


def entropy_collapse(n=STEPS):
    h = healthy(n)
    h["entropy"] = 0.6 * np.exp(-np.arange(n) / 12.0) + 0.01
    h["clip_frac_high"] = np.full(n, 0.0005)
    return h


def entropy_runaway(n=STEPS):
    h = healthy(n)
    h["entropy"] = _ramp(n, 0.6, 3.0)
    return h


def group_contrast_too_easy(n=STEPS):
    h = healthy(n)
    h["all_correct_ratio"] = _ramp(n, 0.15, 0.93)
    h["all_wrong_ratio"] = _ramp(n, 0.30, 0.03)
    h["kept_group_ratio"] = 1 - h["all_correct_ratio"] - h["all_wrong_ratio"]
    h["num_gen_batches"] = np.round(_ramp(n, 1.0, 10.0))
    return h


def group_contrast_gen_rounds(n=STEPS):
    """Only the generation rounds rise (the kept ratio of the final batch stays fine)."""
    h = healthy(n)
    h["num_gen_batches"] = np.round(_ramp(n, 1.0, 6.0))
    return h


def token_credit_length(n=STEPS):
    h = healthy(n)
    h["acc_mean"] = np.full(n, 0.42) + 0.005 * np.sin(np.arange(n))
    h["reward_mean"] = 2 * h["acc_mean"] - 1
    h["response_length_mean"] = _ramp(n, 900.0, 2600.0)
    return h


def token_credit_repetition(n=STEPS):
    h = healthy(n)
    h["repetition_rate"] = _ramp(n, 0.01, 0.25)
    return h


def reward_truncation(n=STEPS):
    h = healthy(n)
    h["truncation_ratio"] = _ramp(n, 0.02, 0.35)
    h["overlong_penalty_mean"] = -_ramp(n, 0.01, 0.3)
    return h


def reward_no_answer(n=STEPS):
    h = healthy(n)
    h["no_answer_rate"] = _ramp(n, 0.03, 0.4)
    return h


FAILURE_MODES = {
    "entropy_collapse": ("exploration", entropy_collapse, "entropy_collapse"),
    "entropy_runaway": ("exploration", entropy_runaway, "entropy_runaway"),
    "too_easy": ("group_contrast", group_contrast_too_easy, "kept_groups_low"),
    "gen_rounds": ("group_contrast", group_contrast_gen_rounds, "gen_batches_rising"),
    "length_without_acc": ("token_credit", token_credit_length, "length_without_accuracy"),
    "repetition": ("token_credit", token_credit_repetition, "repetition_rising"),
    "truncation": ("reward_interpretation", reward_truncation, "truncation_high"),
    "no_answer": ("reward_interpretation", reward_no_answer, "no_answer_rising"),
}


def records(h):
    keys = list(h)
    n = len(h["step"])
    out = []
    for i in range(n):
        rec = {}
        for k in keys:
            v = float(h[k][i])
            rec[k] = int(v) if k == "step" else v
        out.append(rec)
    return out


def write_run(run_dir, h, drop=()):
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for rec in records(h):
            for k in drop:
                rec.pop(k, None)
            f.write(json.dumps(rec) + "\n")
    return run_dir
