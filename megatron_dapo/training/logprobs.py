"""Token logprobs and entropy over vocab-parallel logits, in chunks of tokens.

For a row of logits ``x`` (this TP rank holds the vocabulary slice ``[v0, v1)``) at sampling
temperature ``T``, with ``z = x / T``:

    log p(y)  = z_y - logsumexp(z)                      (the token's logprob)
    H         = logsumexp(z) - sum_v p_v z_v             (the entropy, p = softmax(z))

Each rank reduces its shard to a logsumexp, a target logit and (for the entropy) its own
``E[z]``; two small all-reduces over the TP group combine them (see the class below), so no
rank gathers the vocabulary. Tokens are processed ``chunk_size`` at
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


def _chunk_z(x: torch.Tensor, temperature: float, n_valid: int, buf: torch.Tensor) -> torch.Tensor:
    """The tempered float32 logits of the first ``n_valid`` columns of ``x`` (megatron's
    vocabulary padding beyond them is never sampled: probability 0, gradient 0): a view of
    ``x`` when nothing changes, else written into ``buf`` (never into ``x``)."""
    z = x[:, :n_valid]
    if z.dtype == torch.float32 and temperature == 1.0:
        return z
    out = buf[: z.shape[0]]
    out.copy_(z)
    return out.div_(temperature) if temperature != 1.0 else out


def _scratch(n: int, logits: torch.Tensor, chunk: int, n_valid: int) -> torch.Tensor:
    return torch.empty(min(chunk, n), max(n_valid, 1), dtype=torch.float32, device=logits.device)


def _z_scratch(n: int, logits: torch.Tensor, chunk: int, n_valid: int, temperature: float):
    """The buffer :func:`_chunk_z` writes into; None when it returns views of the logits."""
    if logits.dtype == torch.float32 and temperature == 1.0:
        return None
    return _scratch(n, logits, chunk, n_valid)


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """Per chunk, on this rank's shard: ``l_r = logsumexp(z)`` and (for the entropy)
    ``E_r = E_{p_r}[z]`` under the shard's own softmax. Over the TP group, with ``M = max_r l_r``
    and ``w_r = e^{l_r - M}``: ``logsumexp(z) = M + log sum_r w_r`` and
    ``E_p[z] = sum_r w_r E_r / sum_r w_r`` (two all-reduces: the max, then one sum).

    The ``[chunk x vocab]`` temporaries live in scratch buffers allocated once per call and
    written with ``out=`` / in-place ops: on the CPU a fresh large tensor per op costs more in
    page faults than the arithmetic (3-10x per op, measured)."""

    @staticmethod
    def forward(ctx, logits, target, temperature, v0, n_valid, chunk, group, with_entropy):
        n, vloc = logits.shape
        dev = logits.device
        lp = torch.empty(n, dtype=torch.float32, device=dev)
        ent = torch.zeros_like(lp)
        lse_all = torch.empty_like(lp)  # logsumexp(z) per token
        ez_all = torch.zeros_like(lp)  # E_p[z] per token (entropy only)
        zbuf, ebuf = _z_scratch(n, logits, chunk, n_valid, temperature), _scratch(n, logits, chunk, n_valid)
        for a in range(0, n, chunk):
            z = _chunk_z(logits[a : a + chunk], temperature, n_valid, zbuf)
            m = z.shape[0]
            t = target[a : a + chunk] - v0
            local = (t >= 0) & (t < n_valid)
            if n_valid:
                zmax = z.amax(dim=-1)
                e = torch.sub(z, zmax[:, None], out=ebuf[:m]).exp_()  # e^{z - max}
                s_r = e.sum(-1)
                l_r = zmax + torch.log(s_r)
                zt = torch.where(local, z.gather(1, t.clamp(0, n_valid - 1)[:, None]).squeeze(1), 0.0)
                if with_entropy:
                    e_r = e.mul_(z).sum(-1) / s_r
                else:
                    e_r = torch.zeros_like(l_r)
            else:  # this shard holds only vocabulary padding
                l_r = torch.full((m,), float("-inf"), device=dev)
                zt, e_r = torch.zeros(m, device=dev), torch.zeros(m, device=dev)
            big = l_r.clone()
            _all_reduce(big, group, dist.ReduceOp.MAX)
            w = torch.exp(l_r - big)
            red = torch.stack([w, w * e_r, zt], dim=1)
            _all_reduce(red, group)
            lse = big + torch.log(red[:, 0])
            lp[a : a + chunk] = red[:, 2] - lse
            lse_all[a : a + chunk] = lse
            if with_entropy:
                ez_all[a : a + chunk] = red[:, 1] / red[:, 0]
                ent[a : a + chunk] = lse - ez_all[a : a + chunk]
        del zbuf, ebuf
        ctx.save_for_backward(logits, target, lse_all, ez_all)
        ctx.cfg = (temperature, v0, n_valid, chunk, with_entropy)
        ctx.set_materialize_grads(False)
        return lp, ent

    @staticmethod
    def backward(ctx, g_lp, g_ent):
        logits, target, lse_all, ez_all = ctx.saved_tensors
        temperature, v0, n_valid, chunk, with_entropy = ctx.cfg
        if not with_entropy:  # the entropy output was a constant
            g_ent = None
        if (g_lp is None and g_ent is None) or n_valid == 0:
            return (torch.zeros_like(logits) if n_valid == 0 and g_lp is not None else None,) + (None,) * 7
        n, vloc = logits.shape
        dev = logits.device
        direct = logits.dtype == torch.float32 and n_valid == vloc  # write into grad itself
        grad = torch.zeros_like(logits) if n_valid < vloc else torch.empty_like(logits)
        zbuf = _z_scratch(n, logits, chunk, n_valid, temperature)
        gbuf = None if direct else _scratch(n, logits, chunk, n_valid)
        hbuf = _scratch(n, logits, chunk, n_valid) if g_ent is not None else None
        for a in range(0, n, chunk):
            z = _chunk_z(logits[a : a + chunk], temperature, n_valid, zbuf)
            m = z.shape[0]
            gl = g_lp[a : a + chunk].float() if g_lp is not None else torch.zeros(m, device=dev)
            gz = grad[a : a + chunk] if direct else gbuf[:m]
            p = torch.sub(z, lse_all[a : a + chunk, None], out=gz).exp_()  # softmax(z)
            if g_ent is not None:  # gz = -p (g + h (z - E_p[z])) = p (h E_p[z] - g - h z)
                h = g_ent[a : a + chunk].float()
                c = torch.mul(z, -h[:, None], out=hbuf[:m]).add_((h * ez_all[a : a + chunk] - gl)[:, None])
                p.mul_(c)
            else:  # gz = -g p
                p.mul_(-gl[:, None])
            if g_lp is not None:
                t = target[a : a + chunk] - v0
                rows = torch.nonzero((t >= 0) & (t < n_valid)).squeeze(1)
                gz[rows, t[rows]] += gl[rows]
            if temperature != 1.0:
                gz.div_(temperature)
            if not direct:
                grad[a : a + chunk, :n_valid] = gz
        return grad, None, None, None, None, None, None, None


def chunked_logprobs_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    true_vocab: Optional[int] = None,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
    tp_group=None,
    tp_rank: Optional[int] = None,
    with_entropy: bool = True,
):
    """``(logprob of target, entropy)`` per token from this rank's vocab shard of the logits.

    ``logits`` [..., V/tp] (any dtype; math in float32), ``target`` [...] token ids of the
    full vocabulary. ``true_vocab``: columns at or beyond it (megatron's padding) get zero
    probability. ``tp_rank`` None: megatron's tensor-parallel group and rank; a ``tp_rank``
    with ``tp_group`` None means no TP (single shard). ``with_entropy`` False: the entropy is
    not computed (zeros; old-logprob and reference passes only need the logprobs).
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
    lp, ent = _ChunkedLogprobEntropy.apply(
        flat, target.reshape(-1), float(temperature), v0, n_valid, int(chunk_size), tp_group, bool(with_entropy)
    )
    return lp.reshape(lead), ent.reshape(lead)
