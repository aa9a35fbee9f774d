"""Public scoring entry points: `compute_score` (a response) and `is_equivalent` (two answers)."""

from __future__ import annotations

from .dapo import dapo_equivalent, dapo_score, strip_eos
from .result import RewardResult, check_ground_truth

MODES = ("dapo", "math")


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def is_equivalent(gold: str, pred: str, mode: str = "math") -> bool:
    """Whether the bare answer `pred` matches the gold answer `gold`.

    Both are answers (optionally in ``$...$``), not whole responses, although `math` mode
    also extracts a ``\\boxed{}`` / "Answer:" / last math span from longer text.
    `dapo` mode is Minerva-normalised exact string equality; `math` mode is the
    sympy-based equivalence of `megatron_dapo.reward.math_mode`.
    Raises ValueError when `gold` is empty, None or not a string.
    """
    _check_mode(mode)
    check_ground_truth(gold)
    if not isinstance(pred, str):
        return False
    if mode == "dapo":
        return dapo_equivalent(gold, pred)
    from .math_mode import math_equivalent

    return math_equivalent(gold, pred)


def compute_score(
    response: str, ground_truth: str, mode: str = "dapo", eos_text: str | None = None
) -> RewardResult:
    """Score one decoded response against its ground truth.

    `dapo` mode is the official DAPO-Math rule (last 300 characters, last "Answer:" line,
    Minerva normalisation, exact match). `math` mode extracts the final answer
    ("Answer:" line or ``\\boxed{}``, see `math_mode.extract_final_answer`) and checks it
    with sympy-based equivalence. Both give +1.0 / -1.0. End-of-sequence text
    (`<|im_end|>`, `<|endoftext|>`, `eos_text`) is removed first. Raises ValueError when
    `ground_truth` is empty, None or not a string.

    This runs in the calling process with no timeout: use `BatchScorer` in training.
    """
    _check_mode(mode)
    check_ground_truth(ground_truth)
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    if mode == "dapo":
        return dapo_score(response, ground_truth, eos_text=eos_text)
    from .math_mode import math_score

    return math_score(strip_eos(response, eos_text), ground_truth)
