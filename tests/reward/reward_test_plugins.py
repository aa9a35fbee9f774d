"""Reward functions used by the pool tests through "reward_test_plugins:<name>" specs.

They follow the documented plug-in signature ``fn(response, ground_truth, **extra)``.
"""

from __future__ import annotations

import os
import time

from megatron_dapo.reward import RewardResult


def exact(response: str, ground_truth: str, **extra) -> float:
    """+1.0 when the stripped response equals the ground truth, else -1.0 (returns a float)."""
    return 1.0 if response.strip() == ground_truth.strip() else -1.0


def as_dict(response: str, ground_truth: str, **extra) -> dict:
    """Returns a dict, as verl-style reward functions do."""
    ok = response.strip() == ground_truth.strip()
    return {"score": 1.0 if ok else -1.0, "acc": ok, "pred": response.strip()}


def as_result(response: str, ground_truth: str, **extra) -> RewardResult:
    return RewardResult(0.5, True, response, "ok")


def misbehave(response: str, ground_truth: str, **extra) -> float:
    """Behaves according to the response text: "sleep", "spin", "oom", "raise", "die", or exact match."""
    if response == "sleep":
        time.sleep(3600)
    if response == "spin":
        while True:
            pass
    if response == "oom":
        # One 8 GiB block: far above the pool's RLIMIT_AS cap, refused at once.
        return float(len(bytearray(8 * 1024**3)))
    if response == "raise":
        raise RuntimeError("plug-in failure")
    if response == "die":
        os._exit(3)
    if response == "pid":
        return float(os.getpid())
    return exact(response, ground_truth)


def echo_record(
    response: str,
    ground_truth: str,
    *,
    prompt: str = "",
    data_source: str = "",
    extra_info: dict | None = None,
    **extra,
) -> dict:
    """Needs no label; its pred shows every field of the record it was given."""
    return {"score": 1.0, "pred": f"{response}|{ground_truth}|{prompt}|{data_source}|{extra_info}"}


not_callable = 42
