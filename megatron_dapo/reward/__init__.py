"""Math rewards for DAPO: the official `Answer:` checker, a sympy equivalence mode, a batch pool.

Public API (other packages import exactly these names):

- `is_equivalent(gold, pred, mode="math") -> bool`
- `compute_score(response, ground_truth, mode="dapo", eos_text=None) -> RewardResult`
- `RewardResult` (score, acc, pred, reason)
- `BatchScorer(num_workers=..., timeout_s=..., memory_limit_mb=..., mode=..., reward_fn=None)`
- `load_reward_fn("package.module:function")`

See docs/reward.md.
"""

from .api import compute_score, is_equivalent
from .plugins import load_reward_fn
from .pool import BatchScorer
from .result import REASONS, RewardResult

__all__ = ["BatchScorer", "REASONS", "RewardResult", "compute_score", "is_equivalent", "load_reward_fn"]
