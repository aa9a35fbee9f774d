"""One training item: what the driver sends a trainer rank per response, and what the loss reads.

The driver builds it from a rollout sample (``driver.batch.Sample.to_item``); the ranks read
it by attribute (no dict lookups with defaults). Sequences are 1-D tensors, so an item
pickles into a Ray call as tensors. No process groups, no engine state.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch


def _seq(x, dtype) -> Optional[torch.Tensor]:
    if x is None:
        return None
    return torch.as_tensor(x, dtype=dtype).reshape(-1)


@dataclasses.dataclass
class TokenWeights:
    """Each response token's loss weight and loss mask (``token_weights.weigh_items``), 1-D
    float32 tensors of the response length: ``keep`` (in the loss and the step's token count),
    ``weight`` (importance weight), ``trained`` (the sample trains), ``fresh`` (generated under
    the weights of the old logprobs), ``clipped`` (TIS clipped or rejected)."""

    keep: torch.Tensor
    weight: torch.Tensor
    trained: torch.Tensor
    fresh: torch.Tensor
    clipped: torch.Tensor


@dataclasses.dataclass
class TrainItem:
    """One response to train on (or to score): ``tokens`` = prompt + response ids (int64 [n]).

    ``old_logprobs``, ``ref_logprobs``, ``engine_logprobs``: float32 [n - prompt_len], the
    response tokens' logprobs under the old policy (the trainer's forward), the KL reference and
    the rollout engine; ``engine_logprobs`` is None when the engine gave none of that length
    (the importance ratio is then 1: the old logprobs stand in). ``train`` False: no token is
    in the loss (overlong filtering). ``stale_len``: the leading response tokens generated
    under older weights (--partial-rollout). ``routed_experts``: the engine's expert ids
    ``[positions, layers, top_k]`` (--routing-replay), as the rollout gave them.
    ``weights``: set on the rank before collation (``token_weights.weigh_items``).
    ``prox_alpha``: float32 [n - prompt_len] (``--proximal-logprobs interpolate``): each
    response token's A-3PO weight, 0 where ``old_logprobs`` are the proximal policy's own; where
    it is above 0 ``old_logprobs`` hold the behaviour policy's (the engine's) and the loss
    interpolates the proximal policy from them (``dapo_step.interpolate_proximal``)."""

    tokens: torch.Tensor
    prompt_len: int
    advantage: float = 0.0
    train: bool = True
    old_logprobs: Optional[torch.Tensor] = None
    ref_logprobs: Optional[torch.Tensor] = None
    engine_logprobs: Optional[torch.Tensor] = None
    stale_len: int = 0
    routed_experts: Optional[torch.Tensor] = None
    weights: Optional[TokenWeights] = None
    prox_alpha: Optional[torch.Tensor] = None

    def __post_init__(self):
        self.tokens = _seq(self.tokens, torch.long)
        self.prompt_len = int(self.prompt_len)
        self.advantage = float(self.advantage)
        self.train = bool(self.train)
        self.stale_len = int(self.stale_len)
        self.old_logprobs = _seq(self.old_logprobs, torch.float32)
        self.ref_logprobs = _seq(self.ref_logprobs, torch.float32)
        self.prox_alpha = _seq(self.prox_alpha, torch.float32)
        if self.prox_alpha is not None and self.prox_alpha.numel() != self.response_len:
            raise ValueError(
                f"TrainItem: prox_alpha has {self.prox_alpha.numel()} values for {self.response_len} tokens"
            )
        e = _seq(self.engine_logprobs, torch.float32)
        self.engine_logprobs = e if e is not None and e.numel() == self.response_len else None
        if not 1 <= self.prompt_len <= self.n_tokens:
            raise ValueError(f"TrainItem: prompt_len {self.prompt_len} outside 1..{self.n_tokens} (len(tokens))")

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def response_len(self) -> int:
        return self.n_tokens - self.prompt_len
