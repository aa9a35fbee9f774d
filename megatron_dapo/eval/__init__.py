"""Evaluation: pure metrics over sampled responses (avg@k, unbiased pass@k, maj@k, summary).

The evaluation driver (``tools/eval.py``, rollout engines) builds on these; importing this
package is cheap (standard library only).
"""

from megatron_dapo.eval.metrics import (
    INVALID_ANSWERS,
    avg_at_k,
    group_samples,
    maj_at_k,
    majority_answer,
    normalize_answer,
    pass_at_k,
    summarize,
)

__all__ = [
    "INVALID_ANSWERS",
    "avg_at_k",
    "group_samples",
    "maj_at_k",
    "majority_answer",
    "normalize_answer",
    "pass_at_k",
    "summarize",
]
