"""Dynamic sampling: drop groups whose responses are all correct or all wrong."""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from ._checks import as_tensor, check_1d_nonempty, check_group_size
from .registry import Registry

#: ``--dynamic-sampling-metric``: name -> ``fn(samples) -> [G] float64 tensor or None``, the
#: per-sample values of one group whose within-group std must be > 0 for the group to be kept
#: (the ``metric`` of :func:`dynamic_sampling_mask`); None keeps the DAPO rule on raw
#: correctness. ``samples`` are the group's responses after verification (``acc``, ``score``,
#: ``reward`` attributes: ``driver/batch.Sample``); the rollout manager calls the entry.
DYNAMIC_SAMPLING_METRICS: Registry = Registry("dynamic sampling metric", flag="--dynamic-sampling-metric")


def _values(samples: Sequence, name: str) -> torch.Tensor:
    return torch.tensor([float(getattr(s, name)) for s in samples], dtype=torch.float64)


@DYNAMIC_SAMPLING_METRICS.register("acc")
def acc_metric(samples: Sequence) -> Optional[torch.Tensor]:
    """Raw correctness, the DAPO rule (paper Eq. 11), the default: a group is kept iff its responses are neither all correct nor all wrong."""
    return None


@DYNAMIC_SAMPLING_METRICS.register("score")
def score_metric(samples: Sequence) -> Optional[torch.Tensor]:
    """The verifier's score: a group is kept iff its scores are not all equal."""
    return _values(samples, "score")


@DYNAMIC_SAMPLING_METRICS.register("reward")
def reward_metric(samples: Sequence) -> Optional[torch.Tensor]:
    """Score + soft overlong penalty (Eq. 13): a group is kept iff its rewards are not all equal (filtering on the length-shaped reward is known to collapse the policy)."""
    return _values(samples, "reward")


class DynamicSamplingResult(NamedTuple):
    """Result of :func:`dynamic_sampling_mask` (a tuple: ``keep, kept, all_correct, all_wrong``)."""

    #: ``[batch]`` bool, True for every sample of a kept group.
    keep_mask: torch.Tensor
    #: number of kept groups (prompts).
    num_kept: int
    #: number of groups whose responses are all correct.
    num_all_correct: int
    #: number of groups whose responses are all wrong.
    num_all_wrong: int


def dynamic_sampling_mask(
    acc: torch.Tensor, group_size: int, metric: Optional[torch.Tensor] = None
) -> DynamicSamplingResult:
    r"""Dynamic sampling filter, the constraint of the DAPO objective (paper section 3.2).

    Keep a group (the ``G`` responses to one prompt, contiguous in the batch) iff

    .. math:: 0 < \left|\{o_i \mid \text{is\_equivalent}(a, o_i)\}\right| < G,

    i.e. its responses are neither all correct nor all wrong: such groups have all-zero
    advantages and contribute no gradient. The test is on the **raw correctness**
    ``acc`` only, never on the length-shaped score (filtering on the shaped score keeps
    groups whose only signal is the length penalty; peers saw that destroy the policy).
    A sample counts as correct iff ``acc > 0`` (so ``{0, 1}``, ``{-1, +1}`` and bools
    all work).

    Optional mode: with ``metric`` (``[batch]`` values of another per-sample metric,
    named by ``--dynamic-sampling-metric``), a group is kept iff the std of ``metric``
    within the group is > 0 (its values are not all equal). The all-correct / all-wrong
    counts are still computed from ``acc`` for logging.

    The caller (rollout manager) keeps sampling until enough groups pass (paper
    Algorithm 1) and logs the counts, e.g. ``kept_group_ratio = num_kept / num_groups``.

    Args:
        acc: ``[batch]`` correctness per response.
        group_size: ``G``, must divide the batch; ``G = 1`` keeps nothing.
        metric: optional ``[batch]`` metric for the std > 0 mode.

    Returns:
        :class:`DynamicSamplingResult` ``(keep_mask, num_kept, num_all_correct,
        num_all_wrong)``.

    Raises:
        ValueError: naming ``acc`` (empty, not 1-D), ``group_size`` (not dividing the
            batch) or ``metric`` (shape differs from ``acc``).
    """
    acc = as_tensor(acc, "acc")
    check_1d_nonempty(acc, "acc")
    g = check_group_size(group_size, acc.shape[0], batch_name="acc batch")
    correct = (acc.detach() > 0).view(-1, g)
    n_correct = correct.sum(dim=1)
    all_correct = n_correct == g
    all_wrong = n_correct == 0
    if metric is None:
        keep_group = ~(all_correct | all_wrong)
    else:
        metric = as_tensor(metric, "metric")
        if metric.shape != acc.shape:
            raise ValueError(f"metric has shape {tuple(metric.shape)} but acc has shape {tuple(acc.shape)}")
        mv = metric.detach().view(-1, g)
        keep_group = ~(mv == mv[:, :1]).all(dim=1)  # std > 0 <=> not all equal
    keep = keep_group.unsqueeze(1).expand(-1, g).reshape(-1)
    return DynamicSamplingResult(
        keep_mask=keep,
        num_kept=int(keep_group.sum()),
        num_all_correct=int(all_correct.sum()),
        num_all_wrong=int(all_wrong.sum()),
    )
