"""Test-side probe helpers: megatron's logprobs of a probe through the forward schedule, and a
whole weight-sync check against an engine object in one process (the trainer runs the two
halves in ``hybrid.phases`` through ``PolicyWorker.probe_logprobs`` instead)."""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist

from megatron_dapo.distributed import collective_device
from megatron_dapo.hybrid.probe import check_probe_stats, model_threshold, probe_stats
from megatron_dapo.training.forward import forward_backward, token_logprobs

log = logging.getLogger(__name__)


def default_probe_tokens(vocab_size: int, length: int = 32, batch: int = 2, seed: int = 1234) -> torch.Tensor:
    """A fixed pseudo-random probe [batch, length] of token ids (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g)


@torch.no_grad()
def megatron_probe_logprobs(model, arch, probe_tokens: torch.Tensor, pp_group=None) -> torch.Tensor:
    """logp(tokens[:, t+1] | prefix) [b, s-1] from megatron, fp32, on every rank (collective)."""
    from megatron.core import parallel_state as ps

    pp_group = pp_group if pp_group is not None else ps.get_pipeline_model_parallel_group()
    device = next(model.parameters()).device
    tokens = (probe_tokens.unsqueeze(0) if probe_tokens.dim() == 1 else probe_tokens).to(device)
    got = []

    def loss_fn(batch, logits):
        got.append(token_logprobs(logits, batch["tokens"], arch.vocab_size).float().contiguous())
        return logits.sum() * 0, {}

    was_training = model.training
    model.eval()
    try:
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
    finally:
        model.train(was_training)
    lp = got[0] if got else torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=device)
    if dist.get_world_size(pp_group) > 1:  # only the last stage has them: share over PP
        dist.all_reduce(lp, group=pp_group)
    return lp


def check_weight_sync(
    policy_model,
    arch,
    engine,
    probe_tokens: Optional[torch.Tensor] = None,
    threshold: Optional[float] = None,
    *,
    pp_group=None,
    group=None,
) -> float:
    """Probe the engine after a sync: returns max |logp_engine - logp_megatron| (same on
    every rank of ``group``, default the world), raises ``WeightSyncError`` when the mean
    |diff| exceeds ``threshold`` or its p90 ``P90_FACTOR * threshold`` (:func:`check_probe_stats`).

    Collective over all ranks. Needs the trainer's weights resident *and* the engine awake
    (weights and KV cache); the hybrid step, which offloads the trainer before resuming the
    KV cache, uses the two halves :func:`megatron_probe_logprobs` (before the offload) and
    :func:`compare_with_engine` (after the KV cache is back) instead. ``engine``: the engine
    on feeder ranks (or a list), None elsewhere; the worst difference over all feeders is
    reported. ``probe_tokens``: [b, s] (default :func:`default_probe_tokens`).
    ``threshold`` default: :func:`model_threshold`.
    """
    if probe_tokens is None:
        probe_tokens = default_probe_tokens(arch.vocab_size)
    if threshold is None:
        threshold = model_threshold(policy_model)
    ref = megatron_probe_logprobs(policy_model, arch, probe_tokens, pp_group=pp_group)
    return compare_with_engine(ref, engine, probe_tokens, threshold, group=group)


def compare_with_engine(
    ref_logprobs: torch.Tensor, engine, probe_tokens: torch.Tensor, threshold: float, *, group=None
) -> float:
    """Second half of the probe: score ``probe_tokens`` with the engine(s) on feeder ranks and
    compare with megatron's ``ref_logprobs`` [b, s-1] (:func:`probe_stats`,
    :func:`check_probe_stats`: mean and p90 against ``threshold``); collective over ``group``
    (default world). Returns the max |diff| (reported, not a criterion)."""
    if probe_tokens.dim() == 1:
        probe_tokens = probe_tokens.unsqueeze(0)
    engines = [] if engine is None else (list(engine) if isinstance(engine, (list, tuple)) else [engine])
    seqs = probe_tokens.tolist()
    ref = ref_logprobs.detach().float().cpu().tolist()
    stats = probe_stats(ref, [e.score(seqs, [1] * len(seqs)) for e in engines])
    # Every rank must decide alike (a rank raising alone would leave the others waiting in
    # the next collective): the statistics and the threshold are all-reduced (max).
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        w = torch.tensor(
            [stats["max_abs"], stats["mean_abs"], stats["p90_abs"], float(threshold)],
            dtype=torch.float64,
            device=collective_device(group),
        )  # not ref's: a caller's may be host
        dist.all_reduce(w, op=dist.ReduceOp.MAX, group=group)
        stats = {"max_abs": float(w[0]), "mean_abs": float(w[1]), "p90_abs": float(w[2])}
        threshold = float(w[3])
    log.info(
        "weight sync probe: |logp_engine - logp_megatron| mean %.3g p90 %.3g max %.3g (tolerance %.3g)",
        stats["mean_abs"],
        stats["p90_abs"],
        stats["max_abs"],
        threshold,
    )
    check_probe_stats(stats, threshold, where=f" on a probe of {tuple(probe_tokens.shape)} tokens")
    return stats["max_abs"]
