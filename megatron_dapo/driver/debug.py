"""What a run writes for inspection (rollout dumps, the hybrid phase order) and the testing
hooks that inject faults (--debug-* flags). Nothing here changes what a run computes."""

from __future__ import annotations

import json
import os
import signal

import torch


def dump_rollouts(run_dir: str, dataset, step: int, roll) -> str:
    """Every verified sample of the step (kept or not) as RUN_DIR/rollouts/step_XXXXXX.jsonl, with
    the wall-clock times (``time.time()``) its latest request was submitted and ended and its
    group was verified (``group_scored_at``), and ``stale_len`` (tokens of a --partial-rollout
    prefix generated before this step)."""
    d = os.path.join(run_dir, "rollouts")
    os.makedirs(d, exist_ok=True)
    kept = {id(g) for g in roll.groups}
    path = os.path.join(d, f"step_{step:06d}.jsonl")
    with open(path, "w") as f:
        for g in roll.generated:
            for s in g.samples:
                f.write(
                    json.dumps(
                        {
                            "step": step,
                            "prompt_index": s.prompt_index,
                            "prompt": dataset[s.prompt_index].prompt_text,
                            "response": s.response_text,
                            "ground_truth": s.ground_truth,
                            "pred": s.pred,
                            "score": s.score,
                            "reward": s.reward,
                            "acc": s.acc,
                            "reason": s.reason,
                            "response_length": len(s.response_ids),
                            "finish_reason": s.finish_reason,
                            "advantage": s.advantage,
                            "kept": id(g) in kept,
                            "stale_len": s.stale_len,
                            "submitted_at": s.submitted_at,
                            "finished_at": s.finished_at,
                            "group_scored_at": g.scored_at,
                        }
                    )
                    + "\n"
                )
    return path


def log_hybrid_events(run_dir: str, step: int, events: list) -> None:
    """The hybrid step's phase order of one step, one JSON line (RUN_DIR/hybrid_events.jsonl)."""
    with open(os.path.join(run_dir, "hybrid_events.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "events": list(events)}) + "\n")


def dump_train_batch(trainers, out_dir: str, step: int, minibatches: list, when: str) -> None:
    """--debug-dump-train-batch: the exact worker inputs of this step (``samples``, in order, and
    ``minibatch_sizes``: how many of them each optimizer step took, as the trainer split them)
    and the full weights around it."""
    out = {"weights": trainers.full_weights()}
    if when == "before":
        out["samples"] = [s.to_item() for mb in minibatches for s in mb]
        out["minibatch_sizes"] = [len(mb) for mb in minibatches]
    os.makedirs(out_dir, exist_ok=True)
    torch.save(out, os.path.join(out_dir, f"step_{step:06d}_{when}.pt"))


def crash_now() -> None:
    """--debug-crash-during-save-step: die like a killed job (no cleanup, no finally)."""
    os.kill(os.getpid(), signal.SIGKILL)
