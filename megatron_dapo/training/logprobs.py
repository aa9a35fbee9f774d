"""Token logprobs and entropy over vocab-parallel logits, in chunks of tokens.

For a row of logits ``x`` (this TP rank holds the vocabulary slice ``[v0, v1)``) at sampling
temperature ``T``, with ``z = x / T``:

    log p(y)  = z_y - logsumexp(z)                      (the token's logprob)
    H         = logsumexp(z) - sum_v p_v z_v             (the entropy, p = softmax(z))

The max, the partition function, the target logit and ``sum_v e^{z_v} z_v`` are all-reduced
over the TP group, so no rank gathers the vocabulary. Tokens are processed ``chunk_size`` at
a time in the forward AND the backward (which recomputes ``softmax`` per chunk from the
saved logits and per-token ``logsumexp``), so no float32 ``[tokens x vocab]`` tensor exists at
any time: the largest temporaries are ``[chunk_size x vocab/TP]``. Gradients, with
``g`` and ``h`` the incoming gradients of ``log p(y)`` and ``H``:

    dL/dz_v = g (1[v = y] - p_v) - h p_v (z_v - E_p[z]),     dL/dx = dL/dz / T
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

DEFAULT_CHUNK = 2048


def _tp_size(group) -> int:
    return dist.get_world_size(group) if group is not None and dist.is_initialized() else 1


def _all_reduce(t: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    if _tp_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def _chunk_z(x: torch.Tensor, temperature: float, n_valid: int) -> torch.Tensor:
    z = x.float()
    if temperature != 1.0:
        z = z / temperature
    if n_valid < z.shape[-1]:  # megatron's vocabulary padding on this shard: never sampled
        z[:, n_valid:] = float("-inf")
    return z


class _ChunkedLogprobEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, temperature, v0, n_valid, chunk, group):
        n, vloc = logits.shape
        lp = torch.empty(n, dtype=torch.float32, device=logits.device)
        ent = torch.empty_like(lp)
        lse_all = torch.empty_like(lp)
        ez_all = torch.empty_like(lp)
        for a in range(0, n, chunk):
            z = _chunk_z(logits[a : a + chunk], temperature, n_valid)
            zmax = z.max(dim=-1).values
            _all_reduce(zmax, group, dist.ReduceOp.MAX)
            ez = torch.exp(z - zmax[:, None])
            zfin = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
            t = target[a : a + chunk] - v0
            local = (t >= 0) & (t < vloc)
            zt = torch.gather(zfin, 1, t.clamp(0, vloc - 1)[:, None]).squeeze(1) * local
            red = torch.stack([ez.sum(-1), (ez * zfin).sum(-1), zt], dim=1)
            _all_reduce(red, group)
            del z, ez, zfin
            lse = torch.log(red[:, 0]) + zmax
            ez_mean = red[:, 1] / red[:, 0]  # E_p[z]
            lp[a : a + chunk] = red[:, 2] - lse
            ent[a : a + chunk] = lse - ez_mean
            lse_all[a : a + chunk] = lse
            ez_all[a : a + chunk] = ez_mean
        ctx.save_for_backward(logits, target, lse_all, ez_all)
        ctx.cfg = (temperature, v0, n_valid, chunk)
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, target, lse_all, ez_all = ctx.saved_tensors
        temperature, v0, n_valid, chunk = ctx.cfg
        if g_lp is None and g_ent is None:
            return (None,) * 7
        n, vloc = logits.shape
        grad = torch.empty_like(logits)
        for a in range(0, n, chunk):
            z = _chunk_z(logits[a : a + chunk], temperature, n_valid)
            p = torch.exp(z - lse_all[a : a + chunk, None])  # 0 on padded vocabulary
            gz = torch.zeros_like(p)
            if g_lp is not None:
                gl = g_lp[a : a + chunk].float()
                gz -= gl[:, None] * p
                t = target[a : a + chunk] - v0
                local = (t >= 0) & (t < vloc)
                rows = torch.nonzero(local).squeeze(1)
                gz[rows, t[rows]] += gl[rows]
            if g_ent is not None:
                zfin = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
                gz -= g_ent[a : a + chunk].float()[:, None] * p * (zfin - ez_all[a : a + chunk, None])
            if temperature != 1.0:
                gz /= temperature
            grad[a : a + chunk] = gz.to(grad.dtype)
            del z, p, gz
        return grad, None, None, None, None, None, None


def chunked_logprobs_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    true_vocab: Optional[int] = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    tp_group=None,
    tp_rank: Optional[int] = None,
):
    """``(logprob of target, entropy)`` per token from this rank's vocab shard of the logits.

    ``logits`` [..., V/tp] (any dtype; math in float32), ``target`` [...] token ids of the
    full vocabulary. ``true_vocab``: columns at or beyond it (megatron's padding) get zero
    probability. ``tp_rank`` None: megatron's tensor-parallel group and rank; a ``tp_rank``
    with ``tp_group`` None means no TP (single shard).
    Returns two float32 tensors of shape ``target.shape``; differentiable in ``logits``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if logits.shape[:-1] != target.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and target {tuple(target.shape)} disagree")
    if tp_rank is None:  # megatron's TP group (tp_rank given without a group: no TP)
        from megatron.core import parallel_state as ps

        tp_group = ps.get_tensor_model_parallel_group() if tp_group is None else tp_group
        tp_rank = ps.get_tensor_model_parallel_rank()
    vloc = logits.shape[-1]
    v0 = tp_rank * vloc
    n_valid = vloc if true_vocab is None else max(0, min(vloc, true_vocab - v0))
    lead = target.shape
    flat = logits.reshape(-1, vloc)
    lp, ent = _ChunkedLogprobEntropy.apply(flat, target.reshape(-1), float(temperature), v0, n_valid,
                                           int(chunk_size), tp_group)
    return lp.reshape(lead), ent.reshape(lead)
