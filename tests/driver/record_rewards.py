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
