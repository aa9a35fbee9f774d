"""Evaluation: pure metrics over sampled responses (avg@k, unbiased pass@k, maj@k, summary).

The names below are ``megatron_dapo.eval.metrics``'s (standard library only, so importing
this package is cheap). The evaluation driver that samples with a rollout engine and scores
with the reward is ``megatron_dapo.eval.runner`` (used by tools/eval.py, the trainer's
``--eval-interval`` and the demo's held-out evaluation).
"""

from megatron_dapo.eval import metrics
from megatron_dapo.eval.metrics import *  # noqa: F403 - re-exported: the public names are metrics.__all__

__all__ = list(metrics.__all__)
