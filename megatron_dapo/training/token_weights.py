"""Each response token's loss weight and loss mask, set per sample before collation.

The importance weight of a token (``--tis-mode`` on the tokens the current weights generated,
``--partial-rollout-offpolicy`` on those older weights generated) and whether it counts in
the step's token-mean denominator are computed on each sample's WHOLE response
(``algo.tis.loss_token_weights``), before the samples are cut into padded or packed (THD,
CP-split) micro-batches: the geometric mean of ``sequence-mask`` needs every fresh token of a
sequence, and the step's token count (taken before the first forward) must already leave out
the tokens that carry no gradient.
"""

from __future__ import annotations

from typing import Optional

import torch

from ..algo.config import AlgorithmConfig
from ..algo.tis import loss_token_weights


def engine_logprobs_of(x: dict, old: torch.Tensor) -> torch.Tensor:
    """The engine's logprobs of a sample's response tokens (``x["engine_logprobs"]``), or
    ``old`` (importance ratio 1) when the sample carries none of the right length."""
    e = x.get("engine_logprobs")
    if e is None or len(e) != old.shape[0]:
        return old
    return torch.as_tensor(e, dtype=torch.float32)


def weigh_samples(samples: list, algo: AlgorithmConfig, offpolicy: Optional[str] = None) -> list:
    """Copies of ``samples`` carrying each response token's loss weight and loss mask.

    ``algo.loss_token_weights`` per sample, on its whole response (the geometric mean of
    ``--tis-mode sequence-mask`` needs every fresh token of the sequence, which a packed CP
    micro-batch splits): ``is_weight`` (the TIS weight of a fresh token, the off-policy weight
    of a stale one, never both), ``loss_keep`` (1 where the token is in the loss and in the
    step's token count: a stale token under ``--partial-rollout-offpolicy mask`` or a token
    rejected by a mask mode is not), ``trained``, ``tis_fresh`` and ``tis_clipped`` (for the
    metrics). Collation (``collate``, ``packing.pack_samples``) reads these fields; a sample without
    them trains every response token with weight 1 (``train`` False: none)."""
    out = []
    for x in samples:
        n = len(x["tokens"]) - int(x["prompt_len"])
        if n <= 0 or x.get("old_logprobs") is None:
            out.append(x)
            continue
        old = torch.as_tensor(x["old_logprobs"], dtype=torch.float32).reshape(1, n)
        eng = engine_logprobs_of(x, old[0]).reshape(1, n)
        mask = torch.full((1, n), 1.0 if x.get("train", True) else 0.0)
        stale = torch.zeros(1, n)
        stale[0, : min(int(x.get("stale_len", 0)), n)] = 1
        r = loss_token_weights(old, eng, mask, stale, algo.tis_mode, algo.tis_cap, algo.tis_seq_cap, offpolicy)
        y = dict(x)
        y.update(is_weight=r.weight[0].float(), loss_keep=r.keep[0].float(), trained=mask[0],
                 tis_fresh=r.fresh[0].float(), tis_clipped=r.clipped[0].float())
        out.append(y)
    return out


def token_weights_into(x: dict, n: int, loss_mask, weight, trained, fresh, clipped) -> None:
    """Fill one sample's response slices (length ``n``) from :func:`weigh_samples`' fields,
    or, for a sample that was not weighed, weight 1 on every trained token."""
    if x.get("loss_keep") is not None:
        loss_mask.copy_(torch.as_tensor(x["loss_keep"], dtype=torch.float32)[:n])
        weight.copy_(torch.as_tensor(x["is_weight"], dtype=torch.float32)[:n])
        trained.copy_(torch.as_tensor(x["trained"], dtype=torch.float32)[:n])
        fresh.copy_(torch.as_tensor(x["tis_fresh"], dtype=torch.float32)[:n])
        clipped.copy_(torch.as_tensor(x["tis_clipped"], dtype=torch.float32)[:n])
    elif x.get("train", True):
        loss_mask.fill_(1.0)
        weight.fill_(1.0)
        trained.fill_(1.0)
        fresh.fill_(1.0)
        fresh[: min(int(x.get("stale_len", 0)), n)] = 0.0
