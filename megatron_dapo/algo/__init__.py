"""DAPO / GRPO algorithm core: pure functions of tensors (no process groups, no engines).

Each function quotes its equation from the DAPO paper (arXiv 2503.14476) in its
docstring; docs/algorithm.md maps every control to its flag and logged metrics.
"""

from .advantages import compute_group_advantages
from .config import PRESETS, AlgorithmConfig, apply_preset
from .dynamic_sampling import DynamicSamplingResult, dynamic_sampling_mask
from .entropy import DEFAULT_ENTROPY_CHUNK_SIZE, entropy_from_logits
from .kl import KL_ESTIMATORS, kl_k1, kl_k2, kl_k3, kl_penalty
from .overlong import TRUNCATED_FINISH_REASONS, overlong_filter_mask, overlong_penalty
from .policy_loss import (
    LOG_RATIO_CLAMP,
    LOSS_AGG_MODES,
    aggregate_loss,
    count_valid_sequences,
    count_valid_tokens,
    policy_loss,
)

__all__ = [
    "AlgorithmConfig",
    "DEFAULT_ENTROPY_CHUNK_SIZE",
    "DynamicSamplingResult",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "PRESETS",
    "TRUNCATED_FINISH_REASONS",
    "aggregate_loss",
    "apply_preset",
    "compute_group_advantages",
    "count_valid_sequences",
    "count_valid_tokens",
    "dynamic_sampling_mask",
    "entropy_from_logits",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "overlong_filter_mask",
    "overlong_penalty",
    "policy_loss",
]
