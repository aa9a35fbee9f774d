"""Each response token's loss weight and loss mask, set per sample before collation.

The importance weight of a token (``--tis-mode`` on the tokens the current weights generated,
``--partial-rollout-offpolicy`` on those older weights generated) and whether it counts in
the step's token-mean denominator are computed on each sample's WHOLE response
(``algo.tis.loss_token_weights``), before the samples are cut into THD (CP-split)
micro-batches: the geometric mean of ``sequence-mask`` needs every fresh token of a
sequence, and the step's token count (taken before the first forward) must already leave out
the tokens that carry no gradient.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..algo.config import AlgorithmConfig
from ..algo.tis import loss_token_weights
from .item import TokenWeights, TrainItem


def engine_logprobs_of(x: TrainItem, old: torch.Tensor) -> torch.Tensor:
    """The engine's logprobs of an item's response tokens, or ``old`` (importance ratio 1)
    when the item carries none (``TrainItem`` keeps only those of the response's length)."""
    return old if x.engine_logprobs is None else x.engine_logprobs


def weigh_items(items: list, algo: AlgorithmConfig, offpolicy: Optional[str] = None) -> list:
    """Copies of ``items`` carrying each response token's loss weight and loss mask (``weights``).

    ``algo.loss_token_weights`` per item, on its whole response (the geometric mean of
    ``--tis-mode sequence-mask`` needs every fresh token of the sequence, which a packed CP
    micro-batch splits): ``weight`` (the TIS weight of a fresh token, the off-policy weight
    of a stale one, never both), ``keep`` (1 where the token is in the loss and in the
    step's token count: a stale token under ``--partial-rollout-offpolicy mask`` or a token
    rejected by a mask mode is not), ``trained``, ``fresh`` and ``clipped`` (for the
    metrics). Collation (``packing.pack_items``) reads them; an item without them trains every
    response token with weight 1 (``train`` False: none)."""
    out = []
    for x in items:
        n = x.response_len
        if n <= 0 or x.old_logprobs is None:
            out.append(x)
            continue
        old = x.old_logprobs.reshape(1, n)
        eng = engine_logprobs_of(x, old[0]).reshape(1, n)
        mask = torch.full((1, n), 1.0 if x.train else 0.0)
        stale = torch.zeros(1, n)
        stale[0, : min(x.stale_len, n)] = 1
        r = loss_token_weights(old, eng, mask, stale, algo.tis_mode, algo.tis_cap, algo.tis_seq_cap, offpolicy)
        w = TokenWeights(
            keep=r.keep[0].float(),
            weight=r.weight[0].float(),
            trained=mask[0],
            fresh=r.fresh[0].float(),
            clipped=r.clipped[0].float(),
        )
        out.append(dataclasses.replace(x, weights=w))
    return out


def token_weights_into(x: TrainItem, n: int, loss_mask, weight, trained, fresh, clipped) -> None:
    """Fill one item's response slices (length ``n``) from :func:`weigh_items`' fields,
    or, for an item that was not weighed, weight 1 on every trained token."""
    w = x.weights
    if w is not None:
        loss_mask.copy_(w.keep[:n])
        weight.copy_(w.weight[:n])
        trained.copy_(w.trained[:n])
        fresh.copy_(w.fresh[:n])
        clipped.copy_(w.clipped[:n])
    elif x.train:
        loss_mask.fill_(1.0)
        weight.fill_(1.0)
        trained.fill_(1.0)
        fresh.fill_(1.0)
        fresh[: min(x.stale_len, n)] = 0.0
