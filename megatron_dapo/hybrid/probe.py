"""Weight-sync probe and the train/inference logprob mismatch metric.

``check_weight_sync`` scores a fixed probe sequence with the engine (``engine.score``) and
with megatron (a forward over TP/PP, vocab-parallel ``token_logprobs``) right after a sync,
while the trainer's weights are still resident, and raises :class:`WeightSyncError` when
``max |logp_engine - logp_megatron|`` exceeds the threshold. A wrongly split or misplaced
bucket (a swapped q/k block, a TP shard in the wrong order) moves logprobs by O(0.1 .. 10);
numerics of the same weights in fp32 agree to ~1e-6, in bf16 with different kernels to
~1e-2 .. 1e-1 on single tokens, hence the dtype-dependent default threshold.

The trainer runs it every N-th sync (``--check-weight-sync-every N``, 0 = never; tests use
every sync): :func:`should_check` decides, :func:`add_weight_sync_args` registers the options.

``logprob_mismatch`` is the per-step metric ``train_infer_logprob_diff``: the trainer's
recomputed logprobs of real rollouts against the engine's sampling logprobs.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist

from .weight_sync import WeightSyncError

log = logging.getLogger(__name__)

DEFAULT_THRESHOLDS = {torch.float32: 1e-4, torch.bfloat16: 0.25, torch.float16: 0.1}


def default_threshold(dtype: torch.dtype) -> float:
    """A probe threshold for parameters of ``dtype`` (fp32 1e-4, bf16 0.25, fp16 0.1)."""
    return DEFAULT_THRESHOLDS.get(dtype, 0.25)


def model_threshold(model) -> float:
    """The default threshold of a model: that of its least precise parameter dtype."""
    return max(default_threshold(d) for d in {p.dtype for p in model.parameters()})


def default_probe_tokens(vocab_size: int, length: int = 32, batch: int = 2, seed: int = 1234) -> torch.Tensor:
    """A fixed pseudo-random probe [batch, length] of token ids (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g)


def should_check(sync_index: int, every: int) -> bool:
    """``--check-weight-sync-every N``: probe syncs 0, N, 2N, ... (N <= 0: never)."""
    return every > 0 and sync_index % every == 0


def add_weight_sync_args(parser) -> None:
    """Register the weight-sync options on an argparse parser (consumed by the trainer)."""
    g = parser.add_argument_group("weight sync")
    g.add_argument("--check-weight-sync-every", type=int, default=1,
                   help="probe the engine after every N-th weight sync (0: never)")
    g.add_argument("--weight-sync-probe-threshold", type=float, default=None,
                   help="max |logp_engine - logp_megatron| on the probe (default by dtype: fp32 1e-4, bf16 0.25)")
    g.add_argument("--weight-sync-bucket-mb", type=int, default=512, help="weight sync bucket size in MiB")


@torch.no_grad()
def megatron_probe_logprobs(model, arch, probe_tokens: torch.Tensor, pp_group=None) -> torch.Tensor:
    """logp(tokens[:, t+1] | prefix) [b, s-1] from megatron, fp32, on every rank (collective)."""
    from megatron.core import parallel_state as ps

    from ..training.forward import forward_backward, token_logprobs

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
    every rank of ``group``, default the world), raises ``WeightSyncError`` above ``threshold``.

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


def compare_with_engine(ref_logprobs: torch.Tensor, engine, probe_tokens: torch.Tensor, threshold: float, *, group=None) -> float:
    """Second half of the probe: score ``probe_tokens`` with the engine(s) on feeder ranks and
    compare with megatron's ``ref_logprobs`` [b, s-1]; collective over ``group`` (default world)."""
    if probe_tokens.dim() == 1:
        probe_tokens = probe_tokens.unsqueeze(0)
    engines = [] if engine is None else (list(engine) if isinstance(engine, (list, tuple)) else [engine])
    worst = 0.0
    seqs = probe_tokens.tolist()
    for e in engines:
        scored = e.score(seqs, [1] * len(seqs))
        got = torch.tensor(scored, dtype=torch.float32)
        diff = (got - ref_logprobs.detach().float().cpu()).abs()
        d = float(diff.max()) if diff.numel() else 0.0
        if d != d:  # NaN
            d = float("inf")
        worst = max(worst, d)
    # Every rank must decide alike (a rank raising alone would leave the others waiting in
    # the next collective): the worst difference and the threshold are both all-reduced.
    w = torch.tensor([worst, float(threshold)], dtype=torch.float64, device=ref_logprobs.device)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(w, op=dist.ReduceOp.MAX, group=group)
    worst, threshold = float(w[0].item()), float(w[1].item())
    log.info("weight sync probe: max |logp_engine - logp_megatron| = %.3g (threshold %.3g)", worst, threshold)
    if not worst <= threshold:
        raise WeightSyncError(
            f"weight sync probe failed: max |logp_engine - logp_megatron| = {worst:.4g} > threshold "
            f"{threshold:.4g} on a probe of {tuple(probe_tokens.shape)} tokens; the rollout engine's weights "
            "do not match the trainer's (wrong bucket/layout?)"
        )
    return worst


def logprob_mismatch(
    train_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> dict:
    """``{"mean_abs", "max_abs"}`` of |train - engine| over the tokens where ``mask`` is set.

    Pure (no communication); logged every step as ``train_infer_logprob_diff``. An empty
    mask gives zeros.
    """
    if train_logprobs.shape != engine_logprobs.shape:
        raise ValueError(f"shape mismatch: train {tuple(train_logprobs.shape)} vs engine {tuple(engine_logprobs.shape)}")
    diff = (train_logprobs.detach().double() - engine_logprobs.detach().to(train_logprobs.device).double()).abs()
    if mask is None:
        m = torch.ones_like(diff, dtype=torch.bool)
    else:
        if mask.shape != diff.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != logprobs shape {tuple(diff.shape)}")
        m = mask.to(diff.device).bool()
    n = int(m.sum())
    if n == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0}
    sel = diff[m]
    return {"mean_abs": float(sel.sum() / n), "max_abs": float(sel.max())}

