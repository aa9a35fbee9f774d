"""Training curves of a run (RUN_DIR/training_curves.png) from metrics.jsonl."""

from __future__ import annotations

import json

PANELS = [
    ("accuracy / reward", ["acc_mean", "reward_mean"]),
    ("group contrast", ["kept_group_ratio", "all_correct_ratio", "all_wrong_ratio"]),
    ("exploration", ["entropy", "clip_frac_low", "clip_frac_high"]),
    ("length", ["response_length_mean", "truncation_ratio"]),
    ("optimizer", ["grad_norm", "approx_kl"]),
    ("time per step (s)", ["time_step", "time_generate", "time_train", "time_sync"]),
]


def plot_training_curves(metrics_path: str, out_png: str) -> str:
    import matplotlib  # heavy (~0.5 s) and only for the plots: not at import time

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    rows = []
    with open(metrics_path) as f:
        for line in f:
            line = line.strip()
            if line:
                rows.append(json.loads(line))
    if not rows:
        raise ValueError(f"{metrics_path}: no metrics")
    steps = [r["step"] for r in rows]
    fig = Figure(figsize=(14, 7.5))
    for i, (title, keys) in enumerate(PANELS):
        ax = fig.add_subplot(2, 3, i + 1)
        for k in keys:
            ys = [r.get(k) for r in rows]
            if any(y is not None for y in ys):
                ax.plot(steps, [float("nan") if y is None else y for y in ys], marker=".", label=k)
        ax.set_title(title)
        ax.set_xlabel("rollout step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    return out_png
