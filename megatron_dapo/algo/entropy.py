"""Token entropy of the policy, computed chunk by chunk."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ._checks import as_tensor, check_float_tensor

DEFAULT_ENTROPY_CHUNK_SIZE = 512


def _chunk_logp(chunk: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """log-softmax of one chunk in ``dtype``, in a fresh buffer (the input is untouched)."""
    z = chunk.to(dtype=dtype, copy=True)
    z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))
    # -inf logits (banned tokens) have p = 0: keep 0 * log p finite (= 0), not NaN.
    return z.clamp_(min=torch.finfo(dtype).min)


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy with a chunked forward and a chunked, recomputing backward.

    Nothing vocabulary-sized is saved for backward except the input itself; the gradient
    ``dH/dz_j = -p_j (log p_j + H)`` is recomputed one chunk at a time and written into
    the (unavoidable) full-size gradient of the logits.
    """

    @staticmethod
    def forward(ctx, logits2d: torch.Tensor, chunk_size: int, dtype: torch.dtype) -> torch.Tensor:
        n = logits2d.shape[0]
        out = torch.empty(n, dtype=dtype, device=logits2d.device)
        for start in range(0, n, chunk_size):
            logp = _chunk_logp(logits2d[start : start + chunk_size], dtype)
            p = logp.exp()
            out[start : start + chunk_size] = -p.mul_(logp).sum(dim=-1)
            del logp, p
        ctx.save_for_backward(logits2d, out)
        ctx.chunk_size = chunk_size
        ctx.dtype = dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        logits2d, entropy = ctx.saved_tensors
        chunk_size, dtype = ctx.chunk_size, ctx.dtype
        grad = torch.empty_like(logits2d)
        for start in range(0, logits2d.shape[0], chunk_size):
            sl = slice(start, start + chunk_size)
            logp = _chunk_logp(logits2d[sl], dtype)
            p = logp.exp()
            # -p * (log p + H) * grad_out, in place in the logp buffer
            logp.add_(entropy[sl].unsqueeze(1)).mul_(p).mul_(-grad_out[sl].to(dtype).unsqueeze(1))
            grad[sl] = logp.to(grad.dtype)
            del logp, p
        return grad, None, None


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_ENTROPY_CHUNK_SIZE) -> torch.Tensor:
    r"""Entropy of the categorical distribution given by ``logits`` over the last dim.

    .. math:: H_t = -\sum_{v} p_{t,v}\log p_{t,v}, \qquad p_{t,\cdot} = \operatorname{softmax}(z_{t,\cdot})

    The rows (all leading dimensions flattened, e.g. ``[batch, seq, vocab]`` ->
    ``batch*seq`` rows) are processed ``chunk_size`` at a time, in float32 (float64 for
    float64 logits), so at most about two ``chunk_size x vocab`` float buffers exist at
    once, never a second full-size float tensor (a 152k vocabulary x 20k tokens in float32
    would be 12 GB). Differentiable: the backward pass recomputes the softmax chunk by
    chunk instead of saving it, and only the gradient of the logits (full size by
    nature, in the logits' dtype) is allocated. The reference of the equation: the
    trainer computes the same quantity fused with the token logprobs over its vocab-parallel
    shards (``training.logprobs.chunked_logprobs_entropy``, tested against it and against HF);
    logged as ``entropy``, in the loss only when ``--entropy-coef > 0``.

    Args:
        logits: ``[..., vocab]`` floating tensor (bf16/fp16/fp32/fp64).
        chunk_size: rows per chunk, >= 1.

    Returns:
        ``logits.shape[:-1]`` entropies in nats, float32 (float64 for float64 logits).

    Raises:
        ValueError: naming ``logits`` (not floating, no vocab dim, empty) or ``chunk_size``.
    """
    logits = as_tensor(logits, "logits")
    check_float_tensor(logits, "logits")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocab) dimension, got shape {tuple(logits.shape)}")
    if logits.numel() == 0:
        raise ValueError(f"logits is empty, got shape {tuple(logits.shape)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    dtype = torch.promote_types(logits.dtype, torch.float32)
    lead = logits.shape[:-1]
    logits2d = logits.reshape(-1, logits.shape[-1])
    out = _ChunkedEntropy.apply(logits2d, chunk_size, dtype)
    return out.reshape(lead)
