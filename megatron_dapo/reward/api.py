"""Public scoring entry points: `compute_score` (a response), `is_equivalent` (two answers),
and `RewardInput`, the one record a reward function sees (prompt, response, label, data
source, metadata)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Callable, Optional

from ..errors import RewardConfigError
from ..registry import Registry
from .dapo import dapo_equivalent, dapo_score, strip_eos
from .result import RewardResult, check_ground_truth

#: The built-in checkers (``--reward-mode``; also a spec of ``--reward-source``): name ->
#: :class:`RewardMode`. The config schema takes the flag's choices from here.
REWARD_MODES: Registry = Registry("reward mode", flag="--reward-mode")


@dataclasses.dataclass(frozen=True)
class RewardMode:
    """One built-in checker.

    ``score(response, ground_truth, eos_text=None) -> RewardResult`` scores a whole decoded
    response (+1 / -1; end-of-sequence text is the mode's to strip); ``equivalent(gold, pred)
    -> bool`` compares two bare answers; ``warmup()``, when given, runs once in each scorer
    worker before its first timed item (imports, caches). A mode takes no config: what it
    needs arrives with the sample. Register a mode in this module: the scorer's workers are
    spawned processes and know the modes that importing it registers.
    """

    score: Callable[..., RewardResult]
    equivalent: Callable[[str, str], bool]
    warmup: Optional[Callable[[], Any]] = None

    @property
    def doc(self) -> str:
        return self.score.__doc__ or ""


def register_reward_mode(
    name: str, *, equivalent: Callable[[str, str], bool], warmup: Optional[Callable[[], Any]] = None
):
    """Decorator: register ``score`` as the reward mode ``name`` (see :class:`RewardMode`)."""

    def add(score):
        REWARD_MODES.register(name, RewardMode(score, equivalent, warmup))
        return score

    return add


@register_reward_mode("dapo", equivalent=dapo_equivalent)
def dapo_mode_score(response: str, ground_truth: str, eos_text: Optional[str] = None) -> RewardResult:
    """DAPO-Math's official rule: the last "Answer:" line of the last 300 characters, Minerva-normalised, exact match."""
    return dapo_score(response, ground_truth, eos_text=eos_text)


def _math_equivalent(gold: str, pred: str) -> bool:
    from .math_mode import math_equivalent  # sympy: imported only where the math mode runs

    return math_equivalent(gold, pred)


def _math_warmup() -> None:
    compute_score("Answer: \\frac{1}{2}", "0.5", mode="math")  # imports sympy, warms its caches


@register_reward_mode("math", equivalent=_math_equivalent, warmup=_math_warmup)
def math_mode_score(response: str, ground_truth: str, eos_text: Optional[str] = None) -> RewardResult:
    """The final answer (last box, "Answer:" line or answer sentence) checked by sympy equivalence; a hedge is wrong."""
    from .math_mode import math_score  # sympy: imported only where the math mode runs

    return math_score(strip_eos(response, eos_text), ground_truth)


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


def reward_mode(mode: str) -> RewardMode:
    """The registered :class:`RewardMode` ``mode``; RewardConfigError naming the flag otherwise."""
    if mode not in REWARD_MODES:
        raise RewardConfigError(f"--reward-mode: unknown reward mode {mode!r}; one of {', '.join(REWARD_MODES)}")
    return REWARD_MODES.get(mode)


def is_equivalent(gold: str, pred: str, mode: str = "math") -> bool:
    """Whether the bare answer `pred` matches the gold answer `gold`.

    Both are answers (optionally in ``$...$``), not whole responses, although `math` mode
    also extracts a ``\\boxed{}`` / "Answer:" / last math span from longer text.
    `dapo` mode is Minerva-normalised exact string equality; `math` mode is the
    sympy-based equivalence of `megatron_dapo.reward.math_mode`.
    Raises ValueError when `gold` is empty, None or not a string.
    """
    checker = reward_mode(mode)
    check_ground_truth(gold)
    if not isinstance(pred, str):
        return False
    return checker.equivalent(gold, pred)


def compute_score(response: str, ground_truth: str, mode: str = "dapo", eos_text: str | None = None) -> RewardResult:
    """Score one decoded response against its ground truth.

    `dapo` mode is the official DAPO-Math rule (last 300 characters, last "Answer:" line,
    Minerva normalisation, exact match). `math` mode reads the final answer (the last box,
    "Answer:" line or answer sentence, see `answer_reading.read_answer` and docs/verifier.md) and
    checks it with sympy-based equivalence; a response that commits to several different
    answers (a hedge) is wrong. Both give +1.0 / -1.0. End-of-sequence text
    (`<|im_end|>`, `<|endoftext|>`, `eos_text`) is removed first. Raises ValueError when
    `ground_truth` is empty, None or not a string.

    This runs in the calling process with no timeout: use `BatchScorer` in training.
    """
    checker = reward_mode(mode)
    check_ground_truth(ground_truth)
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    return checker.score(response, ground_truth, eos_text=eos_text)
