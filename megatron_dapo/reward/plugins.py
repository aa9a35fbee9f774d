"""Pluggable rewards: ``--reward-fn package.module:function``.

A reward function has the signature::

    def my_reward(response: str, ground_truth: str, **extra) -> RewardResult | float | bool | dict

`response` is the decoded completion (end-of-sequence text already removed by the caller
when it knows it), `ground_truth` the dataset's gold answer (a non-empty string), and
`extra` holds optional keyword arguments (e.g. `data_source`, `extra_info`); a function
should accept and ignore keys it does not know. Whatever it returns is normalised by
`to_reward_result`: a float is the score (acc = score > 0), a bool means +1/-1, a dict
needs "score" and may carry "acc", "pred" and "reason".
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from .result import RewardResult, to_reward_result

RewardFn = Callable[..., Any]


def load_reward_fn(spec: str) -> Callable[..., RewardResult]:
    """Import ``"package.module:function"`` and return it wrapped to always give a RewardResult.

    Raises ValueError for a malformed spec, ImportError / AttributeError (with the spec in
    the message) when the module or function cannot be found, TypeError when the target is
    not callable.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"reward-fn spec must look like 'package.module:function', got {spec!r}")
    module_name, func_name = (part.strip() for part in spec.split(":"))
    if not module_name or not func_name:
        raise ValueError(f"reward-fn spec must look like 'package.module:function', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot import module {module_name!r} of reward-fn {spec!r}: {exc}") from exc
    target: Any = module
    for attr in func_name.split("."):
        if not hasattr(target, attr):
            raise AttributeError(f"reward-fn {spec!r}: {module_name!r} has no attribute {func_name!r}")
        target = getattr(target, attr)
    if not callable(target):
        raise TypeError(f"reward-fn {spec!r} is not callable ({type(target).__name__})")
    return wrap_reward_fn(target)


def wrap_reward_fn(fn: RewardFn) -> Callable[..., RewardResult]:
    """Wrap a reward function so that its return value is normalised into a RewardResult."""

    def reward(response: str, ground_truth: str, **extra: Any) -> RewardResult:
        return to_reward_result(fn(response, ground_truth, **extra))

    reward.__name__ = getattr(fn, "__name__", "reward")
    reward.__doc__ = getattr(fn, "__doc__", None)
    reward.__wrapped__ = fn  # type: ignore[attr-defined]
    return reward
