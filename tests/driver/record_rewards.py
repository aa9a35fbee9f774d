"""Reward functions for the rollout-manager tests (imported by spec in the scorer's workers)."""

from __future__ import annotations


def judge_by_metadata(
    response: str,
    ground_truth: str,
    *,
    prompt: str = "",
    data_source: str = "",
    extra_info: dict | None = None,
    **extra,
) -> dict:
    """Needs no label: correct when the response starts with the row's ``extra_info["want"]``;
    ``pred`` echoes what the function was given."""
    want = (extra_info or {})["want"]
    ok = response.startswith(want)
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": f"{data_source}|{prompt}|{ground_truth}|{want}"}


def wrong_signature(response: str) -> float:
    """A reward written for one argument: every call raises TypeError."""
    return 1.0


def infinite(response: str, ground_truth: str, **extra) -> float:
    """A reward that returns inf: refused (a non-finite reward would score as correct)."""
    return float("inf")


def broken_on_prompt_zero(response: str, ground_truth: str, *, prompt: str = "", **extra) -> float:
    """Fails (KeyError) on prompt zero's samples only."""
    if prompt == "prompt zero":
        raise KeyError("no such field in this row")
    return 1.0 if response.startswith("Answer: 1") else -1.0
