r"""Importance-sampling correction of the rollout-engine / trainer mismatch.

The responses are sampled by the rollout engine (SGLang, or HF transformers on CPU), whose
probabilities :math:`\pi_{eng}` differ from the trainer's :math:`\pi_{old}` for the same
weights (other kernels, other precision; and, with ``--partial-rollout``, tokens generated
under older weights). The PPO surrogate assumes the tokens were drawn from
:math:`\pi_{old}`; the per-token importance weight

.. math:: \rho_{i,t} = \frac{\pi_{old}(o_{i,t}\mid q, o_{i,<t})}{\pi_{eng}(o_{i,t}\mid q, o_{i,<t})}
          = \exp(\log\pi_{old} - \log\pi_{eng})

makes the gradient unbiased again, and multiplies the per-token loss:
:math:`L^{IS}_{i,t} = w_{i,t}\,L_{i,t}` with a weight :math:`w` derived from :math:`\rho`
(treated as a constant: no gradient flows through it) by one of the modes of
:data:`TIS_MODES` (``--tis-mode``; the cap :math:`C > 1` is ``--tis-cap``):

* ``token-truncate`` (truncated importance sampling, TIS; Yao et al. 2025, "Your efficient
  RL framework secretly brings you off-policy RL training"):
  :math:`w_{i,t} = \min(\rho_{i,t}, C)`;
* ``token-mask`` (token-level rejection): :math:`w_{i,t} = \mathbb 1[1/C \le \rho_{i,t} \le C]`;
* ``sequence-mask`` (sequence-level rejection): :math:`w_{i,t} = \mathbb 1[1/C \le \bar\rho_i \le C]`
  with the length-normalised (geometric-mean) sequence ratio
  :math:`\bar\rho_i = \exp\big(\frac{1}{|o_i|}\sum_t (\log\pi_{old} - \log\pi_{eng})\big)`
  (the plain product :math:`\prod_t\rho_{i,t}` leaves any fixed band for long responses
  even when every token agrees closely);
* ``none``: :math:`w = 1`.

The mismatch itself is measured by :func:`mismatch_kl`, the k3 estimate of
:math:`\mathrm{KL}(\pi_{eng}\,\|\,\pi_{old})` from the engine's samples. All inputs are
``[batch, seq]``; positions with ``loss_mask == 0`` get weight 1 and count in no metric.
"""

from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import torch

from ._checks import as_tensor, check_2d, check_float_tensor, check_real, check_same_shape
from .kl import kl_k3
from .registry import Registry

#: ``--tis-mode``: name -> ``fn(log_ratio, valid, cap, seq_cap) -> (weights, clipped)`` on
#: ``[batch, seq]`` (``log_ratio`` 0 and ``valid`` False on masked positions).
TIS_MODES: Registry = Registry("TIS mode", flag="--tis-mode")


@TIS_MODES.register("none")
def _tis_none(log_ratio, valid, cap, seq_cap):
    r"""No correction: :math:`w = 1`."""
    return torch.ones_like(log_ratio), torch.zeros_like(valid)


@TIS_MODES.register("token-truncate")
def _tis_token_truncate(log_ratio, valid, cap, seq_cap):
    r"""Truncated importance sampling (Yao et al. 2025): :math:`w_{i,t} = \min(\rho_{i,t}, C)`."""
    ratio = torch.exp(log_ratio)
    return torch.clamp(ratio, max=cap), ratio > cap


@TIS_MODES.register("token-mask")
def _tis_token_mask(log_ratio, valid, cap, seq_cap):
    r"""Token-level rejection: :math:`w_{i,t} = \mathbb 1[1/C \le \rho_{i,t} \le C]`."""
    ratio = torch.exp(log_ratio)
    out = (ratio > cap) | (ratio < 1.0 / cap)
    return torch.where(out, torch.zeros_like(ratio), torch.ones_like(ratio)), out


@TIS_MODES.register("sequence-mask")
def _tis_sequence_mask(log_ratio, valid, cap, seq_cap):
    r"""Sequence-level rejection: :math:`w_{i,t} = \mathbb 1[1/C \le \bar\rho_i \le C]`, :math:`\bar\rho_i` the geometric-mean ratio (cap ``--tis-seq-cap``)."""
    c = cap if seq_cap is None else check_real(seq_cap, "seq_cap")
    if c <= 1.0:
        raise ValueError(f"seq_cap must be > 1, got {c}")
    n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    seq_ratio = torch.exp(log_ratio.sum(dim=1, keepdim=True) / n)
    out = ((seq_ratio > c) | (seq_ratio < 1.0 / c)).expand_as(log_ratio)
    return torch.where(out, torch.zeros_like(log_ratio), torch.ones_like(log_ratio)), out


#: Default band of ``sequence-mask`` (``--tis-seq-cap``): sequences whose geometric-mean ratio
#: leaves [1/1.001, 1.001] are rejected. verl's rollout-correction guide gives 1.0002-1.001 as
#: the typical range of its geometric rejection threshold; 1.001 is its lenient end. (The
#: token cap, 2, almost never triggers on a geometric mean: the mean of the log-ratios of
#: the engine's own samples is -KL(engine || trainer), about -1e-3 for bf16 kernels.)
TIS_SEQ_CAP_DEFAULT = 1.001

#: The log-ratio is clamped to this range before ``exp`` (like the policy ratio).
TIS_LOG_RATIO_CLAMP = 20.0


def _prepare(old_logprobs, engine_logprobs, loss_mask):
    old = as_tensor(old_logprobs, "old_logprobs")
    eng = as_tensor(engine_logprobs, "engine_logprobs")
    mask = as_tensor(loss_mask, "loss_mask")
    check_2d(old, "old_logprobs")
    check_float_tensor(old, "old_logprobs")
    check_same_shape(eng, "engine_logprobs", old, "old_logprobs")
    check_same_shape(mask, "loss_mask", old, "old_logprobs")
    dtype = torch.promote_types(old.dtype, torch.float32)
    valid = mask.to(device=old.device) != 0
    zero = torch.zeros((), dtype=dtype, device=old.device)
    # masked positions get a log-ratio of 0 before any arithmetic (NaN garbage there is harmless)
    log_ratio = torch.where(valid, old.detach().to(dtype) - eng.detach().to(dtype), zero)
    return torch.clamp(log_ratio, -TIS_LOG_RATIO_CLAMP, TIS_LOG_RATIO_CLAMP), valid


def tis_log_ratio(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    r""":math:`\log\rho_{i,t} = \log\pi_{old} - \log\pi_{eng}` per token (0 where ``loss_mask`` is 0,
    clamped to ``[-20, 20]``), detached."""
    return _prepare(old_logprobs, engine_logprobs, loss_mask)[0]


def tis_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str = "token-truncate",
    cap: float = 2.0,
    seq_cap: Optional[float] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    r"""Per-token importance weights :math:`w_{i,t}` of ``mode`` (see the module doc):

    .. math::

        \text{token-truncate: } w = \min(\rho, C);\quad
        \text{token-mask: } w = \mathbb 1[C^{-1} \le \rho \le C];\quad
        \text{sequence-mask: } w = \mathbb 1[C^{-1} \le \bar\rho_i \le C]

    with :math:`\rho = \exp(\log\pi_{old} - \log\pi_{eng})` and
    :math:`\bar\rho_i = \exp(\mathrm{mean}_t \log\rho_{i,t})` over the valid tokens of sequence i.
    ``sequence-mask`` uses ``seq_cap`` (``--tis-seq-cap``) when given, else ``cap``: a geometric
    mean sits much closer to 1 than a token's ratio, so its band is much narrower.

    Returns ``(weights, metrics)``: ``weights`` ``[batch, seq]`` (detached, float32 or
    float64; 1 on masked positions); ``metrics`` detached 0-dim tensors over the valid tokens:
    ``tis_weight_mean`` (mean of ``w``), ``tis_clip_frac`` (share of tokens whose weight was
    truncated (``rho > C``) or that were masked out), ``mismatch_kl`` (:func:`mismatch_kl`
    mean). With no valid token every metric is 0.

    Raises:
        ValueError: naming the argument: unknown ``mode``, ``cap <= 1``, shapes that are not
            ``[batch, seq]`` or do not match.
    """
    if mode not in TIS_MODES:
        raise ValueError(f"mode must be one of {', '.join(TIS_MODES)}; got {mode!r}")
    cap = check_real(cap, "cap")
    if cap <= 1.0:
        raise ValueError(f"cap must be > 1, got {cap}")
    log_ratio, valid = _prepare(old_logprobs, engine_logprobs, loss_mask)
    w, clipped = TIS_MODES.get(mode)(log_ratio, valid, cap, seq_cap)
    clipped = clipped & valid
    w = torch.where(valid, w, torch.ones_like(w))
    with torch.no_grad():
        count = valid.sum().to(torch.float32).clamp(min=1.0)
        f = valid.to(torch.float32)
        kl = mismatch_kl(old_logprobs, engine_logprobs, loss_mask)
        metrics = {
            "tis_weight_mean": (w.to(torch.float32) * f).sum() / count,
            "tis_clip_frac": clipped.to(torch.float32).sum() / count,
            "mismatch_kl": (kl.to(torch.float32) * f).sum() / count,
        }
    return w, metrics


def mismatch_kl(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    r"""Per-token k3 estimate of :math:`\mathrm{KL}(\pi_{eng}\,\|\,\pi_{old})` from the engine's samples:

    .. math:: k_3 = \rho - 1 - \log\rho,\qquad \rho = \pi_{old}/\pi_{eng}

    (unbiased, >= 0; 0 where ``loss_mask`` is 0). Detached, ``[batch, seq]``."""
    log_ratio, valid = _prepare(old_logprobs, engine_logprobs, loss_mask)
    zero = torch.zeros_like(log_ratio)
    # kl_k3(lp, ref) uses log rho = ref - lp: lp = 0 (engine, shifted), ref = log rho
    return torch.where(valid, kl_k3(zero, log_ratio), zero)


class LossTokenWeights(NamedTuple):
    """Per-token result of :func:`loss_token_weights`, all ``[batch, seq]``, detached."""

    weight: torch.Tensor  #: the factor of each token's loss (0 outside ``keep``)
    keep: torch.Tensor  #: bool: the token is in the loss AND in its denominator
    fresh: torch.Tensor  #: bool: a valid token generated by the current weights
    clipped: torch.Tensor  #: bool: a fresh token whose TIS weight was truncated or rejected


def loss_token_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    stale: Optional[torch.Tensor] = None,
    tis_mode: str = "none",
    tis_cap: float = 2.0,
    seq_cap: Optional[float] = None,
    offpolicy: Optional[str] = None,
) -> LossTokenWeights:
    r"""The weight of every token's loss, and whether it counts in the loss denominator, for
    each combination of ``--tis-mode`` and ``--partial-rollout-offpolicy``.

    A token is *fresh* when the current weights generated it, *stale* when older weights did
    (``stale != 0``, ``--partial-rollout``). Each token gets ONE importance weight
    (:math:`\rho = \pi_{old}/\pi_{eng}`, :math:`C` = ``tis_cap``, :math:`C_s` = ``seq_cap``):

    ================  =================================  ==============================  ===============
    token             weight :math:`w_{i,t}`             in the loss denominator         by
    ================  =================================  ==============================  ===============
    fresh             1 / :math:`\min(\rho, C)` /         yes, except rejected tokens     ``tis_mode``
                      :math:`\mathbb 1[\rho\in[1/C,C]]` /
                      :math:`\mathbb 1[\bar\rho_i\in[1/C_s,C_s]]`
    stale, mask       0                                  no                              ``offpolicy``
    stale, correct    :math:`\min(\rho, C)`               yes                             ``offpolicy``
    ================  =================================  ==============================  ===============

    so a stale token never gets the TIS weight on top of its off-policy weight, and a token
    that carries no gradient (a stale token under ``mask``, a token or sequence rejected by
    ``token-mask`` / ``sequence-mask``) leaves the token-mean denominator: the loss is the
    mean over the tokens it learns from, and the learning rate stays what the user set. The
    geometric mean :math:`\bar\rho_i` of ``sequence-mask`` is taken over the sequence's fresh
    tokens. With ``offpolicy=None`` (no partial rollout) every valid token is fresh.
    Positions with ``loss_mask == 0`` get weight 0 and ``keep`` False.
    """
    log_ratio, valid = _prepare(old_logprobs, engine_logprobs, loss_mask)
    if offpolicy not in (None, "mask", "correct"):
        raise ValueError(f"offpolicy must be None, 'mask' or 'correct'; got {offpolicy!r}")
    if stale is None or offpolicy is None:
        st = torch.zeros_like(valid)
    else:
        stale = as_tensor(stale, "stale")
        check_same_shape(stale, "stale", log_ratio, "old_logprobs")
        st = (stale.to(device=log_ratio.device) != 0) & valid
    fresh = valid & ~st
    w_fresh, _ = tis_weights(old_logprobs, engine_logprobs, fresh, tis_mode, tis_cap, seq_cap)
    ratio = torch.exp(log_ratio)
    if tis_mode == "token-truncate":
        clipped = fresh & (ratio > tis_cap)
        rejected = torch.zeros_like(fresh)
    else:  # mask modes: weight 0 means rejected; "none": nothing
        rejected = fresh & (w_fresh == 0)
        clipped = rejected
    zero = torch.zeros_like(ratio)
    if offpolicy == "correct":
        w_stale = torch.clamp(ratio, max=check_real(tis_cap, "tis_cap"))
        keep = valid & ~rejected
    else:
        w_stale = zero
        keep = fresh & ~rejected
    w = torch.where(fresh, w_fresh, w_stale)
    return LossTokenWeights(torch.where(keep, w, zero), keep, fresh, clipped)
