"""Decoupled-clip (clip-higher) surrogate loss and its aggregation over an optimizer step."""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from ._checks import as_tensor, check_2d, check_float_tensor, check_real, check_same_shape, mask_as

#: The log-ratio ``logp - old_logp`` is clamped to this range before ``exp``: beyond it
#: the ratio is ``e^20 ~ 4.9e8`` (or its inverse), far outside any clip range, so the
#: clamp changes no clipped objective but keeps ``exp`` finite in float16/bfloat16/float32.
LOG_RATIO_CLAMP = 20.0

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")


def _check_advantages(advantages: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """Return advantages broadcast to ``[batch, seq]``."""
    if advantages.dim() == 1:
        if advantages.shape[0] != logprobs.shape[0]:
            raise ValueError(
                f"advantages has shape {tuple(advantages.shape)} but logprobs has batch size "
                f"{logprobs.shape[0]}; per-sample advantages must have shape [batch]"
            )
        return advantages.unsqueeze(1).expand_as(logprobs)
    if advantages.dim() == 2:
        check_same_shape(advantages, "advantages", logprobs, "logprobs")
        return advantages
    raise ValueError(f"advantages must have shape [batch] or [batch, seq], got shape {tuple(advantages.shape)}")


def _masked_mean(x: torch.Tensor, valid: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, x, torch.zeros_like(x)).sum() / count


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    clip_ratio_c: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    r"""Per-token decoupled-clip PPO surrogate loss (DAPO paper section 3: the DAPO objective with Clip-Higher).

    With the token ratio :math:`r_{i,t} = \pi_\theta(o_{i,t}\mid q, o_{i,<t}) /
    \pi_{\theta_{old}}(o_{i,t}\mid q, o_{i,<t}) = \exp(\log\pi_\theta - \log\pi_{old})`:

    .. math::

        L_{i,t} = -\min\big(r_{i,t}\hat A_{i,t},\;
                  \operatorname{clip}(r_{i,t}, 1-\varepsilon_{low}, 1+\varepsilon_{high})\,\hat A_{i,t}\big)

    i.e. the negative of the summand of the DAPO objective. ``eps_low = eps_high = 0.2``
    is the symmetric PPO/GRPO clip; DAPO's *clip-higher* uses ``eps_high = 0.28``.

    Optional dual clip (Ye et al. 2020, used by the official DAPO script with ``c = 10``):
    for tokens with :math:`\hat A < 0` the loss is capped,
    :math:`L_{i,t} \leftarrow \min(L_{i,t}, -c\,\hat A_{i,t})`, so a huge ratio on a
    negative-advantage token cannot dominate the update. ``clip_ratio_c=None`` turns it off.

    The log-ratio is clamped to ``[-20, 20]`` before ``exp`` (see ``LOG_RATIO_CLAMP``).
    ``old_logprobs`` and ``advantages`` are treated as constants (detached): the gradient
    flows through ``logprobs`` only. Tokens with ``loss_mask == 0`` get loss exactly 0
    (whatever garbage their logprobs hold) and no gradient.

    Args:
        logprobs: ``[batch, seq]`` log-probabilities of the sampled tokens under the
            current policy (carries gradient).
        old_logprobs: ``[batch, seq]`` the same under the rollout (old) policy.
        advantages: ``[batch]`` per-sample (broadcast over tokens) or ``[batch, seq]``.
        loss_mask: ``[batch, seq]`` 1 for response tokens that count, 0 otherwise
            (bool or numeric).
        eps_low: lower clip ``eps_low`` in ``[0, 1]`` (1: no lower clip, the ratio is > 0).
        eps_high: upper clip ``eps_high >= 0``.
        clip_ratio_c: dual-clip constant ``c > 1``, or ``None``.

    Returns:
        ``(per_token_loss, metrics)``: ``per_token_loss`` is ``[batch, seq]`` in float32
        (float64 for float64 inputs; feed it to :func:`aggregate_loss`); ``metrics`` holds detached 0-dim tensors computed over
        the masked (valid) tokens of this call:

        * ``clip_frac_low``: share of tokens where the lower clip is active
          (:math:`r < 1-\varepsilon_{low}` and :math:`\hat A < 0`: the clipped term is
          the minimum and the token gets no gradient);
        * ``clip_frac_high``: share where the upper clip is active
          (:math:`r > 1+\varepsilon_{high}` and :math:`\hat A > 0`);
        * ``dual_clip_frac``: share where the dual-clip cap is active (0 when off);
        * ``approx_kl``: mean of ``old_logp - logp`` (the k1 estimate of
          KL(pi_old || pi_theta));
        * ``ratio_mean``, ``ratio_max``: mean and max of ``r`` (after the clamp).

        With no valid token every metric is 0. To combine metrics of several
        micro-batches, weight them by their valid-token counts.

    Raises:
        ValueError: naming the argument: shapes that are not ``[batch, seq]`` or do not
            match, an empty batch, ``eps_low`` outside ``[0, 1]``, negative ``eps_high``,
            ``clip_ratio_c <= 1``.
    """
    logprobs = as_tensor(logprobs, "logprobs")
    old_logprobs = as_tensor(old_logprobs, "old_logprobs")
    advantages = as_tensor(advantages, "advantages")
    loss_mask = as_tensor(loss_mask, "loss_mask")
    check_2d(logprobs, "logprobs")
    check_float_tensor(logprobs, "logprobs")
    check_same_shape(old_logprobs, "old_logprobs", logprobs, "logprobs")
    check_same_shape(loss_mask, "loss_mask", logprobs, "logprobs")
    adv = _check_advantages(advantages, logprobs)

    eps_low = check_real(eps_low, "eps_low")
    eps_high = check_real(eps_high, "eps_high")
    if not 0.0 <= eps_low <= 1.0:
        raise ValueError(f"eps_low must be in [0, 1], got {eps_low}")
    if eps_high < 0.0:
        raise ValueError(f"eps_high must be >= 0, got {eps_high}")
    if clip_ratio_c is not None:
        clip_ratio_c = check_real(clip_ratio_c, "clip_ratio_c")
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (or None to disable dual clip), got {clip_ratio_c}")

    # bf16/fp16 inputs are computed in float32 (a bf16 ratio has a 2^-8 resolution,
    # coarser than the clip range's edges); float64 stays float64.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    old = old_logprobs.detach().to(dtype)
    adv = adv.detach().to(dtype)
    valid = loss_mask.to(device=logprobs.device) != 0

    # Masked positions are replaced by a log-ratio of 0 *before* any arithmetic, so NaN/inf
    # garbage there reaches neither the loss nor (through where's backward) the gradient.
    log_ratio = torch.where(valid, logprobs.to(dtype) - old, torch.zeros((), dtype=dtype, device=old.device))
    log_ratio = torch.clamp(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)

    negative = adv < 0
    if clip_ratio_c is not None:
        cap = -clip_ratio_c * adv
        dual_active = negative & (loss > cap)
        loss = torch.where(dual_active, cap, loss)
    else:
        dual_active = torch.zeros_like(valid)

    # Masked positions: exactly 0 and no gradient (torch.where, not multiplication, so a
    # NaN/inf in a padded position cannot leak into the sum or the gradient).
    loss = torch.where(valid, loss, torch.zeros_like(loss))

    with torch.no_grad():
        count = valid.sum().to(torch.float32).clamp(min=1.0)
        r32 = ratio.detach().to(torch.float32)
        low = (r32 < 1.0 - eps_low) & negative
        high = (r32 > 1.0 + eps_high) & (adv > 0)
        # ratios are > 0, so filling masked positions with 0 makes an all-masked max 0
        if r32.numel() > 0:
            ratio_max = torch.where(valid, r32, torch.zeros_like(r32)).max()
        else:
            ratio_max = torch.zeros((), dtype=torch.float32, device=r32.device)
        metrics = {
            "clip_frac_low": _masked_mean(low.to(torch.float32), valid, count),
            "clip_frac_high": _masked_mean(high.to(torch.float32), valid, count),
            "dual_clip_frac": _masked_mean(dual_active.to(torch.float32), valid, count),
            "approx_kl": _masked_mean(-log_ratio.detach().to(torch.float32), valid, count),
            "ratio_mean": _masked_mean(r32, valid, count),
            "ratio_max": ratio_max,
        }
    return loss, metrics


def count_valid_tokens(loss_mask: torch.Tensor) -> torch.Tensor:
    """Number of valid tokens (``loss_mask != 0``) as a 0-dim int64 tensor.

    Sum this over every micro-batch of an optimizer step and all-reduce it over the
    data-parallel ranks to get ``global_token_count`` for ``token-mean``.
    """
    loss_mask = as_tensor(loss_mask, "loss_mask")
    return (loss_mask != 0).sum()


def count_valid_sequences(loss_mask: torch.Tensor) -> torch.Tensor:
    """Number of sequences with at least one valid token, as a 0-dim int64 tensor.

    Sum this over the optimizer step (micro-batches and data-parallel ranks) to get
    ``global_seq_count`` for the ``seq-mean-*`` modes.
    """
    loss_mask = as_tensor(loss_mask, "loss_mask")
    check_2d(loss_mask, "loss_mask")
    return (loss_mask != 0).any(dim=1).sum()


Count = Union[int, float, torch.Tensor, None]


def _check_count(count: Count, name: str) -> Count:
    if count is None:
        return None
    if isinstance(count, torch.Tensor):
        if count.numel() != 1:
            raise ValueError(f"{name} must be a scalar, got a tensor of shape {tuple(count.shape)}")
        return count
    value = check_real(count, name)
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {count}")
    return value


def aggregate_loss(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> torch.Tensor:
    r"""Reduce a per-token loss to the scalar that is back-propagated.

    Modes (``M`` = ``loss_mask``, ``L`` = ``per_token_loss``):

    * ``"token-mean"`` (DAPO, token-level policy-gradient loss, paper section 3.3):

      .. math:: \mathcal{L} = \frac{1}{\sum_{i}|o_i|}\sum_{i}\sum_{t} M_{i,t} L_{i,t}

      where :math:`\sum_i |o_i|` is the number of valid tokens of the **whole optimizer
      step**: pass it as ``global_token_count`` (sum of :func:`count_valid_tokens` over
      all micro-batches, all-reduced over the data-parallel ranks). Without it the local
      count of this call is used, which is only right for a single micro-batch on a
      single rank.
    * ``"seq-mean-token-mean"`` (original GRPO objective, paper section 2.2): mean over the valid tokens of
      each sequence, then mean over sequences,
      :math:`\frac{1}{N}\sum_i \frac{1}{|o_i|}\sum_t M_{i,t}L_{i,t}`.
    * ``"seq-mean-token-sum"``: sum over the tokens of each sequence, then mean over
      sequences, :math:`\frac{1}{N}\sum_i \sum_t M_{i,t}L_{i,t}`.

    For the ``seq-mean`` modes ``N`` counts only sequences with at least one valid token
    (fully masked ones, e.g. overlong-filtered responses, drop out); pass the optimizer
    step's total as ``global_seq_count`` (sum of :func:`count_valid_sequences`).

    With the global counts the result is this micro-batch's *share* of the step loss:
    summing it over the K micro-batches and D data-parallel ranks gives exactly the
    single-batch loss, and so do the accumulated gradients. (Gradient averaging over DP,
    as megatron's DDP does, divides by D: scale the loss by D, or reduce gradients by
    sum.) A call without any valid token returns 0 with a zero gradient. The result is
    float32 (float64 for float64 input). Masked positions
    never contribute, even if they hold NaN.

    Args:
        per_token_loss: ``[batch, seq]`` loss per token (from :func:`policy_loss`).
        loss_mask: ``[batch, seq]`` 0/1 mask.
        mode: one of ``LOSS_AGG_MODES``.
        global_token_count: valid tokens of the whole optimizer step (``token-mean``).
        global_seq_count: valid sequences of the whole optimizer step (``seq-mean-*``).

    Raises:
        ValueError: naming ``mode`` (unknown), ``per_token_loss`` / ``loss_mask``
            (shapes, empty batch) or a count (negative, not a scalar).
    """
    per_token_loss = as_tensor(per_token_loss, "per_token_loss")
    loss_mask = as_tensor(loss_mask, "loss_mask")
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"mode must be one of {', '.join(LOSS_AGG_MODES)}; got {mode!r}")
    check_2d(per_token_loss, "per_token_loss")
    check_float_tensor(per_token_loss, "per_token_loss")
    check_same_shape(loss_mask, "loss_mask", per_token_loss, "per_token_loss")
    global_token_count = _check_count(global_token_count, "global_token_count")
    global_seq_count = _check_count(global_seq_count, "global_seq_count")

    # Sums over a whole step (~10^7 tokens) are taken in float32 at least.
    per_token_loss = per_token_loss.to(torch.promote_types(per_token_loss.dtype, torch.float32))
    valid = loss_mask.to(device=per_token_loss.device) != 0
    masked = torch.where(valid, per_token_loss, torch.zeros_like(per_token_loss))
    m = mask_as(valid, per_token_loss)

    if mode == "token-mean":
        denom = m.sum() if global_token_count is None else global_token_count
        return masked.sum() / _as_denominator(denom, per_token_loss)

    seq_sum = masked.sum(dim=1)
    if mode == "seq-mean-token-mean":
        seq_value = seq_sum / m.sum(dim=1).clamp(min=1.0)
    else:  # seq-mean-token-sum
        seq_value = seq_sum
    denom = valid.any(dim=1).to(per_token_loss.dtype).sum() if global_seq_count is None else global_seq_count
    return seq_value.sum() / _as_denominator(denom, per_token_loss)


def _as_denominator(count, like: torch.Tensor) -> torch.Tensor:
    """Count as a tensor in ``like``'s dtype, at least 1 (an empty step has loss 0)."""
    c = torch.as_tensor(count, device=like.device).to(like.dtype)
    return c.clamp(min=1.0)
