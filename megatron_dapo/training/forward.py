"""Forward (and backward) passes of a megatron-core GPTModel over micro-batches, any TP/PP.

A micro-batch is a dict of tensors with at least ``tokens`` and optionally ``position_ids``;
everything else (loss masks, old logprobs, advantages ...) is passed through to the loss
function on the last pipeline stage. The trainer's micro-batches are THD
(``training.packing.packed_microbatch``): one row ``[1, T]`` with ``cu_seqlens``, which
reaches the model with ``PackedSeqParams`` instead of an attention mask. A right-padded
``[b, s]`` batch without ``cu_seqlens`` gets a causal mask (tests and probes build those).

The loss function contract (see :func:`forward_backward`): ``loss_fn(batch, logits)`` gets
the vocab-parallel logits [b, s, V/tp] of the last stage and returns ``(loss, metrics)``,
where ``loss`` is this micro-batch's *already normalised* contribution to the step loss
(e.g. sum of its token losses divided by the token count of the whole optimizer step). No
rescaling happens afterwards: megatron is run with ``calculate_per_token_loss=True`` (no
division by the number of micro-batches, DP gradients summed) and gradients are not scaled
by token counts in ``finalize_model_grads``.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ..models.provider import causal_mask
from .routing_replay import clear_targets, set_targets


def finalize_grads_no_token_scaling(model, num_tokens=None, **kwargs):
    """megatron's ``finalize_model_grads`` with the token-count scaling turned off.

    Our losses are normalised by the caller over the whole optimizer step.
    """
    from megatron.core.distributed import finalize_model_grads

    return finalize_model_grads(model, None, **kwargs)


def configure_for_step_normalised_loss(config) -> None:
    """Set a TransformerConfig so that micro-batch losses are summed as given (see module doc)."""
    config.calculate_per_token_loss = True
    config.finalize_model_grads_func = finalize_grads_no_token_scaling


def param_device(model) -> torch.device:
    """The device of the model chunk's parameters (where its inputs must live)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def to_device(batch: dict, device: torch.device) -> dict:
    """A copy of ``batch`` with every tensor on ``device`` (ints, lists and the like unchanged)."""
    return {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def packed_seq_params(batch: dict):
    """megatron's ``PackedSeqParams`` (THD) of a packed micro-batch (``training.packing``).

    Each sequence is padded to the multiple TP/CP need and its padding is part of its own
    causal segment, so the padded boundaries serve as both the true and the padded
    ``cu_seqlens`` (real tokens never attend to padding, which comes after them). The CP group
    is left to the attention modules (TE is configured with it; the CPU core attention takes
    the model's)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu = batch["cu_seqlens"]
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu,
        cu_seqlens_kv=cu,
        cu_seqlens_q_padded=cu,
        cu_seqlens_kv_padded=cu,
        max_seqlen_q=int(batch["max_seqlen"]),
        max_seqlen_kv=int(batch["max_seqlen"]),
    )


def _model_inputs(batch: dict):
    tokens = batch["tokens"]
    b, s = tokens.shape
    pos = batch.get("position_ids")
    if pos is None:
        pos = torch.arange(s, device=tokens.device).unsqueeze(0).expand(b, s)
    if "cu_seqlens" in batch:  # packed (THD): segments and causality come from cu_seqlens
        return tokens, pos, None, {"packed_seq_params": packed_seq_params(batch)}
    return tokens, pos, causal_mask(s, device=tokens.device), {}


def forward_step(data_iterator, model_chunk, loss_fn: Callable):
    """megatron's forward step: the next micro-batch, moved to the parameters' device, through
    the model chunk; the loss function sees the same moved batch. The ONE forward step of the
    trainer, CPU and GPU alike (batches are collated on the host)."""
    batch = to_device(next(data_iterator), param_device(model_chunk))
    tokens, pos, mask, extra = _model_inputs(batch)
    if "routed_experts" in batch:  # routing replay (training/routing_replay.py)
        set_targets(model_chunk, batch["routed_experts"])
    output = model_chunk(tokens, pos, mask, **extra)
    return output, functools.partial(_loss_wrapper, loss_fn, batch)


def forward_backward(model, microbatches: list[dict], loss_fn: Callable, forward_only: bool = False) -> list[dict]:
    """Run megatron's pipeline schedule over ``microbatches``; returns the last stage's metrics.

    ``model`` is the local model chunk (possibly DDP-wrapped). On stages other than the last
    the returned list is empty.
    """
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not microbatches:
        raise ValueError("forward_backward: microbatches is empty")

    # packed micro-batches: the schedule wants the whole packed length (it divides by CP itself)
    seq_len = max(sum(mb["seqlens_padded"]) if "cu_seqlens" in mb else mb["tokens"].shape[1] for mb in microbatches)
    mbs = microbatches[0]["tokens"].shape[0]
    fb = get_forward_backward_func()
    out = fb(
        forward_step_func=functools.partial(_forward_step_of, loss_fn),
        data_iterator=iter(microbatches),
        model=[model],
        num_microbatches=len(microbatches),
        seq_length=seq_len,
        micro_batch_size=mbs,
        forward_only=forward_only,
    )
    if any("routed_experts" in mb for mb in microbatches):
        clear_targets(model)
    return list(out)


def _forward_step_of(loss_fn, data_iterator, model_chunk):
    return forward_step(data_iterator, model_chunk, loss_fn)


def _loss_wrapper(loss_fn, batch, logits):
    loss, metrics = loss_fn(batch, logits)
    # 3-tuple: (loss, num_tokens, reported). With calculate_per_token_loss the schedule does
    # not rescale; num_tokens is ignored by finalize_grads_no_token_scaling.
    return loss, torch.tensor(1, dtype=torch.int, device=loss.device), metrics


def mask_vocab_padding(logits: torch.Tensor, true_vocab: int) -> torch.Tensor:
    """Set the logits of megatron's padded vocabulary rows to -inf on this TP rank's shard."""
    from megatron.core import parallel_state as ps

    shard = logits.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * shard
    n_valid = max(0, min(shard, true_vocab - start))
    if n_valid == shard:
        return logits
    return torch.cat([logits[..., :n_valid], torch.full_like(logits[..., n_valid:], float("-inf"))], dim=-1)


def tempered(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``logits / T``: the distribution the engine sampled from at rollout temperature ``T``.

    The importance ratio pi_theta / pi_old is a ratio of the *sampling* distribution, so old
    and new logprobs (and the entropy) are computed from the tempered logits.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return logits if temperature == 1.0 else logits / temperature


def token_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, true_vocab: Optional[int] = None, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each next token, vocab-parallel: logprobs[:, t] = log p(tokens[:, t+1]).

    ``logits`` [b, s, V/tp] (this rank's vocab shard), ``tokens`` [b, s]. Returns [b, s-1],
    from ``softmax(logits / temperature)``. The full vocabulary is never gathered (megatron's
    vocab-parallel cross entropy).
    """
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if true_vocab is not None:
        logits = mask_vocab_padding(logits, true_vocab)
    lg = tempered(logits[:, :-1].transpose(0, 1).contiguous().float(), temperature)  # [s-1, b, v/tp]
    target = tokens[:, 1:].transpose(0, 1).contiguous()
    return -vocab_parallel_cross_entropy(lg, target).transpose(0, 1)


def gather_vocab(logits: torch.Tensor) -> torch.Tensor:
    """All-gather vocab-parallel logits over TP (tests and probes only; never in training)."""
    from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

    return gather_from_tensor_model_parallel_region(logits)
