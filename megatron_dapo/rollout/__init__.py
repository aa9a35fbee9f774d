"""Rollout engines: one interface (``RolloutEngine``), HFEngine (CPU) and SGLangEngine (GPU).

SGLangEngine is imported lazily (``from megatron_dapo.rollout.sglang_engine import
SGLangEngine``); importing this package never imports sglang.
"""

from megatron_dapo.rollout.base import (
    KV_CACHE,
    MEMORY_TAGS,
    WEIGHTS,
    EngineReleasedError,
    GenerationOutput,
    RolloutEngine,
    SamplingParams,
    WeightUpdateError,
    derive_seed,
)

__all__ = [
    "KV_CACHE",
    "MEMORY_TAGS",
    "WEIGHTS",
    "EngineReleasedError",
    "GenerationOutput",
    "RolloutEngine",
    "SamplingParams",
    "WeightUpdateError",
    "derive_seed",
    "HFEngine",
    "SGLangEngine",
]


def __getattr__(name):  # lazy on purpose: importing the package loads neither engine's module
    if name == "HFEngine":
        from megatron_dapo.rollout.hf_engine import HFEngine

        return HFEngine
    if name == "SGLangEngine":
        from megatron_dapo.rollout.sglang_engine import SGLangEngine

        return SGLangEngine
    raise AttributeError(name)
