"""The reward record every scorer returns, and the checks on its inputs.

`RewardResult` is what the trainer consumes: `score` feeds the advantage, `acc` feeds
dynamic sampling (DAPO filters groups on correctness, never on the length-shaped score),
`pred` is the extracted answer for logging, and `reason` says why an item scored as it did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

#: Allowed values of `RewardResult.reason`.
REASONS = ("ok", "wrong", "no_answer", "timeout", "error")


@dataclass
class RewardResult:
    """Outcome of scoring one response.

    Attributes:
        score: the reward (+1.0 / -1.0 for the built-in modes).
        acc: whether the answer was judged correct.
        pred: the extracted (for `dapo` mode: normalised) prediction, "" when none.
        reason: one of "ok" (correct), "wrong" (an answer was found and it is wrong),
            "no_answer" (no answer could be extracted), "timeout" (scoring overran and
            its worker was killed), "error" (scoring raised or its worker died).
        extra: free-form details (e.g. the error message); not used by the trainer.
    """

    score: float
    acc: bool
    pred: str = ""
    reason: str = "ok"
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.score, bool) or not isinstance(self.score, (int, float)) or not math.isfinite(self.score):
            raise ValueError(f"a reward score must be a finite number, got {self.score!r}")
        if self.reason not in REASONS:
            raise ValueError(f"RewardResult.reason must be one of {REASONS}, got {self.reason!r}")


def incorrect(reason: str, pred: str = "", **extra: Any) -> RewardResult:
    """An incorrect result (-1.0) with the given reason."""
    return RewardResult(score=-1.0, acc=False, pred=pred, reason=reason, extra=dict(extra))


def check_ground_truth(ground_truth: Any) -> str:
    """Return `ground_truth` if it is a non-empty string, else raise ValueError.

    A reward that silently scores -1 (or, worse, +1) when the gold answer is missing
    poisons a whole run, so a bad ground truth is a loud error.
    """
    if ground_truth is None:
        raise ValueError("ground_truth is None: every item needs a non-empty gold answer string")
    if not isinstance(ground_truth, str):
        raise ValueError(f"ground_truth must be a str, got {type(ground_truth).__name__}: {ground_truth!r:.80}")
    if not ground_truth.strip():
        raise ValueError("ground_truth is empty: every item needs a non-empty gold answer string")
    return ground_truth


def to_reward_result(value: Any) -> RewardResult:
    """Normalise what a pluggable reward function returned into a `RewardResult`.

    Accepted: a `RewardResult` (returned as is); a bool (True -> +1.0 "ok", False ->
    -1.0 "wrong"); an int/float score (acc = score > 0); a dict with at least `score`
    and optionally `acc`, `pred`, `reason` (other keys go to `extra`).
    """
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, bool):
        return RewardResult(1.0 if value else -1.0, value, "", "ok" if value else "wrong")
    if isinstance(value, (int, float)):
        score = float(value)
        if not math.isfinite(score):
            raise ValueError(f"the reward function returned {score}: a reward must be a finite number")
        return RewardResult(score, score > 0, "", "ok" if score > 0 else "wrong")
    if isinstance(value, dict):
        if "score" not in value:
            raise ValueError(f"reward dict needs a 'score' key, got keys {sorted(value)}")
        score = float(value["score"])
        acc = bool(value.get("acc", score > 0))
        reason = value.get("reason") or ("ok" if acc else "wrong")
        extra = {k: v for k, v in value.items() if k not in ("score", "acc", "pred", "reason")}
        return RewardResult(score, acc, str(value.get("pred", "")), reason, extra)
    raise TypeError(f"a reward function must return RewardResult, float, bool or dict, got {type(value).__name__}")
