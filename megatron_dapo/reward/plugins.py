"""Pluggable rewards: ``--reward-fn package.module:function`` and ``--reward-source SOURCE=SPEC``.

A reward function has the signature::

    def my_reward(response: str, ground_truth: str, **extra) -> RewardResult | float | bool | dict

`response` is the decoded completion (end-of-sequence text already removed by the caller
when it knows it), `ground_truth` the dataset's label (an empty string when the row has none: a
function that needs no label accepts that), and `extra` the rest of the sample's record:
``prompt`` (the prompt text), ``data_source`` and ``extra_info`` (the row's metadata dict);
a function should accept and ignore keys it does not know. Whatever it returns is
normalised by `to_reward_result`: a float is the score (acc = score > 0), a bool means
+1/-1, a dict needs "score" and may carry "acc", "pred" and "reason".

`RewardRouter` picks the reward of each sample by its data source: a reward spec is a
built-in checker (``dapo``, ``math``), a ``package.module:function`` or the URL of a remote
reward model (``http://...``, scored in batches by `megatron_dapo.reward.remote`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Optional

from .api import REWARD_MODES
from .remote import check_url
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


def spec_kind(spec: Any) -> str:
    """``"builtin"`` (a reward mode of ``REWARD_MODES``), ``"remote"`` (an http(s) URL) or ``"function"``."""
    if isinstance(spec, str):
        if spec in REWARD_MODES:
            return "builtin"
        if spec.startswith(("http://", "https://")):
            return "remote"
    return "function"


def parse_reward_sources(entries: Optional[Iterable[str] | Mapping[str, Any]]) -> dict:
    """``["SOURCE=SPEC", ...]`` (the ``--reward-source`` flag) or a mapping -> ``{source: spec}``.

    A spec is ``dapo``, ``math``, ``package.module:function`` or ``http(s)://host[:port]/path``.
    Raises ValueError naming ``--reward-source`` and the entry for a malformed one or a
    source given twice.
    """
    if not entries:
        return {}
    if isinstance(entries, Mapping):
        pairs = list(entries.items())
    else:
        pairs = []
        for entry in entries:
            if not isinstance(entry, str) or "=" not in entry:
                raise ValueError(f"--reward-source must look like DATA_SOURCE=SPEC, got {entry!r}")
            source, spec = (part.strip() for part in entry.split("=", 1))
            pairs.append((source, spec))
    out: dict = {}
    for source, spec in pairs:
        if not source or not spec:
            raise ValueError(f"--reward-source must look like DATA_SOURCE=SPEC, got {source!r}={spec!r}")
        if source in out:
            raise ValueError(f"--reward-source: data source {source!r} is given twice")
        if spec_kind(spec) == "remote":
            check_url(spec)
        elif spec_kind(spec) == "function" and isinstance(spec, str):
            load_reward_fn(spec)  # fail at start-up, naming the spec, not in every worker
        out[source] = spec
    return out


class RewardRouter:
    """Which reward scores a sample: ``sources[data_source]``, else the default.

    The default is `reward_fn` when given, else the built-in checker `mode` (the math
    checkers stay the default). Specs are kept as given (strings, or a picklable callable
    for `reward_fn`); `key(data_source)` names the spec in the scorer's tables.
    """

    def __init__(self, mode: str = "dapo", reward_fn: Any = None, sources: Any = None) -> None:
        if mode not in REWARD_MODES:
            raise ValueError(f"mode must be one of {REWARD_MODES.names()}, got {mode!r}")
        if isinstance(reward_fn, str):
            if spec_kind(reward_fn) == "remote":
                check_url(reward_fn)
            elif spec_kind(reward_fn) == "function":
                load_reward_fn(reward_fn)
        self.default = reward_fn if reward_fn is not None else mode
        self.sources = parse_reward_sources(sources)
        self.specs: dict = {}  # key -> spec
        for spec in [self.default, *self.sources.values()]:
            self.specs.setdefault(self._key(spec), spec)

    @staticmethod
    def _key(spec: Any) -> str:
        if isinstance(spec, str):
            return spec
        return f"callable:{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}"

    def key(self, data_source: str) -> str:
        return self._key(self.sources.get(data_source, self.default))

    def kind(self, data_source: str) -> str:
        return spec_kind(self.sources.get(data_source, self.default))

    def needs_label(self, data_source: str) -> bool:
        """Whether samples of `data_source` need a non-empty label (the built-in checkers do)."""
        return self.kind(data_source) == "builtin"

    def local_specs(self) -> dict:
        """``{key: spec}`` of the rewards that run in the scorer's worker processes."""
        return {k: s for k, s in self.specs.items() if spec_kind(s) != "remote"}

    def remote_specs(self) -> dict:
        """``{key: url}`` of the remote reward models."""
        return {k: s for k, s in self.specs.items() if spec_kind(s) == "remote"}


def reward_needs_label(reward_cfg: Any) -> Callable[[str], bool]:
    """``needs_label(data_source)`` for a run's reward config (``--reward-mode``, ``--reward-fn``,
    ``--reward-source``): what the data loader asks before refusing a row without a label."""
    return RewardRouter(reward_cfg.mode, reward_cfg.reward_fn, reward_cfg.reward_source).needs_label
