"""Math rewards for DAPO: the official `Answer:` checker, a sympy equivalence mode, a batch pool.

Public API (other packages import exactly these names):

- `is_equivalent(gold, pred, mode="math") -> bool`
- `compute_score(response, ground_truth, mode="dapo", eos_text=None) -> RewardResult`
- `RewardResult` (score, acc, pred, reason)
- `RewardInput` (response, label, prompt, data_source, metadata): what a reward sees
- `BatchScorer(num_workers=..., timeout_s=..., memory_limit_mb=..., mode=..., reward_fn=None, sources=None)`
- `load_reward_fn("package.module:function")`, `RewardRouter` (reward per data source)
- `RemoteRewardModel(url, ...)`, `RemoteRewardError`: a reward model over HTTP

See docs/reward.md.
"""

from .api import RewardInput, compute_score, is_equivalent
from .plugins import RewardRouter, load_reward_fn, reward_needs_label
from .pool import BatchScorer
from .remote import RemoteRewardError, RemoteRewardModel
from .result import REASONS, RewardResult

__all__ = [
    "BatchScorer",
    "REASONS",
    "RemoteRewardError",
    "RemoteRewardModel",
    "RewardInput",
    "RewardResult",
    "RewardRouter",
    "compute_score",
    "is_equivalent",
    "load_reward_fn",
    "reward_needs_label",
]
