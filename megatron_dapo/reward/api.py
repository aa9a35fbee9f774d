"""Public scoring entry points: `compute_score` (a response), `is_equivalent` (two answers),
and `RewardInput`, the one record a reward function sees (prompt, response, label, data
source, metadata)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .dapo import dapo_equivalent, dapo_score, strip_eos
from .result import RewardResult, check_ground_truth

MODES = ("dapo", "math")


class RewardConfigError(ValueError):
    """A reward setting that cannot work (an unknown mode, a ``--reward-fn`` / ``--reward-source``
    spec that does not import or is malformed, a bad remote URL); the message names the flag."""


@dataclasses.dataclass(frozen=True)
class RewardInput:
    """Everything known about one sample when it is scored.

    Attributes:
        response: the decoded completion.
        label: the dataset's gold answer (``reward_model.ground_truth``); ``""`` when the
            row has none, which only a reward that does not need one accepts.
        prompt: the prompt text the policy saw (chat template applied).
        data_source: the row's ``data_source``; selects the reward (``--reward-source``).
        metadata: the row's ``extra_info`` (a dict; empty when absent).
    """

    response: str
    label: str = ""
    prompt: str = ""
    data_source: str = ""
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready form (what a remote reward model receives)."""
        return {
            "prompt": self.prompt,
            "response": self.response,
            "label": self.label,
            "data_source": self.data_source,
            "metadata": dict(self.metadata),
        }


def as_reward_input(item: Any, index: int = 0) -> RewardInput:
    """A `RewardInput` from a `RewardInput` or a ``(response, label)`` pair.

    Raises ValueError naming the item for anything else, and for a label or data source
    that is not a string or metadata that is not a mapping.
    """
    if isinstance(item, RewardInput):
        inp = item
    elif isinstance(item, (tuple, list)) and len(item) == 2:
        label = item[1]
        if not isinstance(label, str):
            raise ValueError(f"item {index}: ground_truth must be a str, got {type(label).__name__}: {label!r:.80}")
        inp = RewardInput(item[0], label)
    else:
        raise ValueError(f"item {index} must be a RewardInput or a (response, ground_truth) pair, got {item!r:.80}")
    if not isinstance(inp.label, str):
        raise ValueError(f"item {index}: label must be a str, got {type(inp.label).__name__}: {inp.label!r:.80}")
    if not isinstance(inp.data_source, str):
        raise ValueError(f"item {index}: data_source must be a str, got {type(inp.data_source).__name__}")
    if not isinstance(inp.metadata, Mapping):
        raise ValueError(f"item {index}: metadata must be a mapping, got {type(inp.metadata).__name__}")
    return inp


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise RewardConfigError(f"reward mode must be one of {MODES}, got {mode!r}")


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
    Minerva normalisation, exact match). `math` mode reads the final answer (the last box,
    "Answer:" line or answer sentence, see `extract.read_answer` and docs/verifier.md) and
    checks it with sympy-based equivalence; a response that commits to several different
    answers (a hedge) is wrong. Both give +1.0 / -1.0. End-of-sequence text
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
