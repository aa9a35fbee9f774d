"""Synthetic grids for the ablation tests: a shape-only model directory, a plan written with the
real planner, and run directories holding the config.json the trainer would write for each
run and a metrics.jsonl with known outcomes."""

from __future__ import annotations

import json
import os

from megatron_dapo.ablation.plan import build_plan, check_and_cost, expected_config, resolve_factors
from tests.tiny import tiny_qwen2_config


def shape_only_model(root) -> str:
    d = os.path.join(str(root), "hf")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(tiny_qwen2_config(max_position_embeddings=512), f)
    return d


def base_args(root, steps: int = 4, **over) -> list:
    os.makedirs(str(root), exist_ok=True)
    prompts = os.path.join(str(root), "prompts.jsonl")
    if not os.path.exists(prompts):
        with open(prompts, "w") as f:
            f.write(json.dumps({"prompt": "1+1", "reward_model": {"ground_truth": "2"}}) + "\n")
    args = {
        "--hf-checkpoint": shape_only_model(root),
        "--prompt-data": prompts,
        "--algorithm": "grpo",
        "--num-rollout": str(steps),
        "--rollout-batch-size": "2",
        "--n-samples-per-prompt": "4",
        "--global-batch-size": "8",
        "--max-prompt-length": "64",
        "--max-response-length": "16",
        "--overlong-buffer-length": "4",
        "--eval-data": prompts.replace("prompts", "heldout"),
        "--eval-interval": "2",
        "--wandb-mode": "disabled",
    }
    args.update(over)
    out = []
    for k, v in args.items():
        out += [k, v]
    return out


def make_plan(
    root,
    factors="clip-higher,dynamic-sampling,token-level-loss",
    seeds=(1, 2),
    fraction=0,
    steps=4,
    threshold=0.45,
    specs=(),
):
    plan = build_plan(
        os.path.join(str(root), "grid"),
        base_args(root, steps),
        resolve_factors(factors, list(specs)),
        list(seeds),
        fraction=fraction,
        threshold=threshold,
        cwd=str(root),
    )
    plan.cost = check_and_cost(plan, step_seconds=10.0)
    plan.save()
    return plan


def unflatten(flat: dict) -> dict:
    out: dict = {}
    for k, v in flat.items():
        sec, name = k.split(".", 1)
        out.setdefault(sec, {})[name] = v
    return out


def write_config(run, **changes) -> None:
    cfg = expected_config(run.argv)
    cfg.update(changes)
    os.makedirs(run.run_dir, exist_ok=True)
    with open(os.path.join(run.run_dir, "config.json"), "w") as f:
        json.dump(unflatten(cfg), f, indent=1)


def write_metrics(run, records) -> None:
    os.makedirs(run.run_dir, exist_ok=True)
    with open(os.path.join(run.run_dir, "metrics.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
