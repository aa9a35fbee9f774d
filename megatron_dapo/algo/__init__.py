"""DAPO / GRPO algorithm core: pure functions of tensors (no process groups, no engines).

Each function quotes its equation from the DAPO paper (arXiv 2503.14476) in its
docstring; docs/algorithm.md maps every control to its flag and logged metrics.
"""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    compute_group_advantages,
    group_mean_advantages,
    group_norm_advantages,
    reinforce_pp_baseline_advantages,
)
from .config import PRESETS, AlgorithmConfig, apply_preset
from .dynamic_sampling import DYNAMIC_SAMPLING_METRICS, DynamicSamplingResult, dynamic_sampling_mask
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
from .tis import TIS_MODES, TIS_SEQ_CAP_DEFAULT, LossTokenWeights, loss_token_weights, mismatch_kl, tis_weights

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AlgorithmConfig",
    "DEFAULT_ENTROPY_CHUNK_SIZE",
    "DYNAMIC_SAMPLING_METRICS",
    "DynamicSamplingResult",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "PRESETS",
    "TRUNCATED_FINISH_REASONS",
    "aggregate_loss",
    "apply_preset",
    "compute_advantages",
    "compute_group_advantages",
    "count_valid_sequences",
    "count_valid_tokens",
    "dynamic_sampling_mask",
    "entropy_from_logits",
    "group_mean_advantages",
    "group_norm_advantages",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalty",
    "overlong_filter_mask",
    "overlong_penalty",
    "policy_loss",
    "reinforce_pp_baseline_advantages",
    "TIS_MODES",
    "mismatch_kl",
    "LossTokenWeights",
    "TIS_SEQ_CAP_DEFAULT",
    "loss_token_weights",
    "tis_weights",
]
