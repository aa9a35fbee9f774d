"""What a training step returns, and the one place its fields become logged metric names.

:class:`LossStats` is what the loss of one micro-batch reports and what a rank's micro-batches
add up to: a ``(sum, count)`` pair per loss metric (token-weighted means after the reduction)
and the largest importance ratio. :class:`StepStats` is one optimizer step's result on a rank.
:func:`reduce_step_stats` reduces the ranks' results of a rollout step over the DP reporters
and the optimizer steps into the metrics.jsonl keys (docs/metrics.md; the diagnosis tool reads
them): the field names of :class:`LossStats` are those keys. Pure: no process groups.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

from ..algo.routing_metrics import layer_metrics

Pair = tuple  # (sum, count): floats, or 0-d tensors inside the loss


@dataclasses.dataclass
class LossStats:
    """Per-token metric sums of the loss; each field but ``ratio_max`` is ``(sum, count)``."""

    pg_loss: Pair = (0.0, 0.0)
    entropy: Pair = (0.0, 0.0)
    clip_frac_low: Pair = (0.0, 0.0)
    clip_frac_high: Pair = (0.0, 0.0)
    dual_clip_frac: Pair = (0.0, 0.0)
    approx_kl: Pair = (0.0, 0.0)
    ratio_mean: Pair = (0.0, 0.0)
    kl: Pair = (0.0, 0.0)
    tis_weight_mean: Pair = (0.0, 0.0)
    tis_clip_frac: Pair = (0.0, 0.0)
    mismatch_kl: Pair = (0.0, 0.0)
    # stale tokens of trained samples, over those samples' tokens (masked ones included)
    offpolicy_token_frac: Pair = (0.0, 0.0)
    # every loss token's importance weight (TIS on fresh tokens, the off-policy correction on
    # stale ones) and its square: their means give the weights' ESS / N (``is_ess_frac``)
    is_weight_mean: Pair = (0.0, 0.0)
    is_weight_sq_mean: Pair = (0.0, 0.0)
    # the stale loss tokens (older weights than the step's): the share whose pi_old / pi_engine
    # exceeds algo.staleness.RATIO_TAIL (above 1%: the ratio's p99 is above it), and their mean
    # log(pi_old / pi_engine), the behaviour-vs-proximal log-ratio
    is_ratio_tail_frac: Pair = (0.0, 0.0)
    stale_log_ratio_mean: Pair = (0.0, 0.0)
    ratio_max: float = 0.0  # reduced by max, not summed

    @classmethod
    def pair_names(cls) -> tuple:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "ratio_max")

    def floats(self) -> "LossStats":
        """The same stats as host floats (the loss returns 0-d tensors)."""
        return LossStats(
            **{k: (float(s), float(c)) for k in self.pair_names() for s, c in [getattr(self, k)]},
            ratio_max=float(self.ratio_max),
        )

    def __add__(self, other: "LossStats") -> "LossStats":
        pairs = {}
        for k in self.pair_names():
            (a, b), (c, d) = getattr(self, k), getattr(other, k)
            pairs[k] = (a + c, b + d)
        return LossStats(**pairs, ratio_max=max(self.ratio_max, other.ratio_max))

    def to_list(self) -> list:
        """The pairs flattened (for one all-reduce): ``[sum, count, sum, count, ...]``."""
        return [float(v) for k in self.pair_names() for v in getattr(self, k)]

    @classmethod
    def from_list(cls, values: list, ratio_max: float) -> "LossStats":
        names = cls.pair_names()
        return cls(**{k: (values[2 * i], values[2 * i + 1]) for i, k in enumerate(names)}, ratio_max=ratio_max)


@dataclasses.dataclass
class StepStats:
    """One optimizer step on one rank (``dapo_step.train_on_minibatch``). ``loss``: the sums of
    this rank's micro-batches (last pipeline stage; summed over the CP group); ``global_tokens``:
    the step's loss tokens over all DP ranks; ``dp_token_imbalance``: max over mean of the DP
    ranks' tokens; ``routing``: --routing-replay's per-layer sums (``routing_replay.collect_stats``)."""

    loss: LossStats
    grad_norm: Optional[float]
    update_successful: bool
    lr: float
    global_tokens: float = 0.0
    num_microbatches: int = 0
    dp_token_imbalance: float = 1.0
    routing: Optional[dict] = None


def _mean(xs) -> float:
    xs = list(xs)
    return float(sum(xs) / len(xs)) if xs else 0.0


def reduce_step_stats(outs: list, reporters: dict) -> dict:
    """The metrics of a rollout step: ``outs[rank]`` is the list of :class:`StepStats` of rank
    ``rank`` (one per optimizer step), ``reporters`` maps each DP rank to the rank whose result
    stands for it (last PP stage, TP rank 0). Loss metrics are token-weighted means over the
    reporters and the optimizer steps; ``grad_norm`` the mean of the finite norms (NaN if none),
    ``skipped_optimizer_steps`` the non-finite ones, ``lr`` the last, ``dp_token_imbalance`` the
    worst step's; with --routing-replay the per-layer routing metrics."""
    loss = LossStats()
    for r in reporters.values():
        for st in outs[r]:
            loss = loss + st.loss
    m = {k: (s / c if c else 0.0) for k in LossStats.pair_names() for s, c in [getattr(loss, k)]}
    # ESS / N of the importance weights over the step's loss tokens: mean(w)^2 / mean(w^2)
    # (algo.staleness.ess_fraction; 1 when every weight is equal, e.g. on-policy without TIS)
    sq = m["is_weight_sq_mean"]
    m["is_ess_frac"] = (m["is_weight_mean"] ** 2 / sq) if sq > 0 else 1.0
    norms = [o.grad_norm for o in outs[0]]
    finite = [n for n in norms if n is not None and math.isfinite(n)]
    m.update(
        {
            "ratio_max": loss.ratio_max,
            "grad_norm": _mean(finite) if finite else float("nan"),
            "optimizer_steps": len(norms),
            "skipped_optimizer_steps": sum(0 if o.update_successful else 1 for o in outs[0]),
            "lr": outs[0][-1].lr if outs[0] else 0.0,
            # max over mean of the DP ranks' tokens, worst optimizer step (the same on every rank)
            "dp_token_imbalance": max((o.dp_token_imbalance for o in outs[0]), default=1.0),
        }
    )
    # --routing-replay: per-layer routing agreement / load imbalance / router entropy, summed over
    # the DP reporters and the step's optimizer steps (algo/routing_metrics.py)
    routing = [o.routing["stats"] for r in reporters.values() for o in outs[r] if o.routing]
    if routing:
        m.update(layer_metrics(sum(routing[1:], routing[0].clone())))
    return m
