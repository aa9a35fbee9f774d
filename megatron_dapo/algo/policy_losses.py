r"""The policy losses ``--policy-loss`` selects: DAPO's decoupled clip, GSPO, CISPO, Dr. GRPO.

Every loss is a pure function of tensors with one signature,

.. code-block:: python

    loss(logprobs, old_logprobs, advantages, loss_mask, cfg: AlgorithmConfig)
        -> (per_token_loss [batch, seq], metrics)

``logprobs`` carries the gradient; ``old_logprobs`` and ``advantages`` (``[batch]`` or
``[batch, seq]``) are constants; ``cfg`` is the whole :class:`~megatron_dapo.algo.AlgorithmConfig`
(a loss reads the fields it needs: ``eps_clip_low``, ``eps_clip_high``, ...). The per-token
loss is 0 on masked positions; the trainer multiplies it by the importance weights
(``loss_token_weights``) and reduces it with ``--loss-agg-mode`` over the whole optimizer step
(:func:`~megatron_dapo.algo.aggregate_loss`). ``metrics`` holds the keys of
:data:`POLICY_LOSS_METRICS` (detached 0-dim tensors over the valid tokens).

Adding a loss: write the function here with its equation in the docstring, register it with
``@POLICY_LOSSES.register(name, aggregation=..., whole_sequences=...)``, add a hand-computed
test (tests/algo/test_algo_policy_losses.py) and a row to docs/algorithm.md. The flag's
choices, ``--help`` and the config check come from the registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from ._checks import as_tensor, check_2d, check_float_tensor, check_same_shape
from .policy_loss import LOG_RATIO_CLAMP, LOSS_AGG_MODES, _check_advantages, _masked_mean, policy_loss
from .registry import Registry

#: The metric keys every policy loss returns (the trainer logs them; docs/metrics.md).
POLICY_LOSS_METRICS = ("clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "ratio_mean", "ratio_max")


@dataclass(frozen=True)
class PolicyLoss:
    """A registered loss: the function, the ``--loss-agg-mode`` values it is defined with
    (``None``: any), and whether it needs each sequence whole on one rank (a sequence-level
    ratio: not with context parallelism, which splits a sequence over ranks)."""

    fn: Callable
    aggregation: Optional[Tuple[str, ...]] = None
    whole_sequences: bool = False

    def __call__(self, logprobs, old_logprobs, advantages, loss_mask, cfg):
        return self.fn(logprobs, old_logprobs, advantages, loss_mask, cfg)


class _PolicyLossRegistry(Registry[PolicyLoss]):
    def register(
        self, name: str, obj=None, *, aggregation: Optional[Tuple[str, ...]] = None, whole_sequences: bool = False
    ):
        for mode in aggregation or ():
            if mode not in LOSS_AGG_MODES:
                raise ValueError(f"policy loss {name!r}: unknown aggregation {mode!r}")

        def add(fn):
            Registry.register(self, name, PolicyLoss(fn, aggregation, whole_sequences))
            return fn

        return add(obj) if obj is not None else add


POLICY_LOSSES = _PolicyLossRegistry("policy loss", flag="--policy-loss")


def _inputs(logprobs, old_logprobs, advantages, loss_mask):
    """Checked inputs in the compute dtype; the log-ratio (0 on masked positions, clamped)."""
    logprobs = as_tensor(logprobs, "logprobs")
    old_logprobs = as_tensor(old_logprobs, "old_logprobs")
    loss_mask = as_tensor(loss_mask, "loss_mask")
    check_2d(logprobs, "logprobs")
    check_float_tensor(logprobs, "logprobs")
    check_same_shape(old_logprobs, "old_logprobs", logprobs, "logprobs")
    check_same_shape(loss_mask, "loss_mask", logprobs, "logprobs")
    adv = _check_advantages(as_tensor(advantages, "advantages"), logprobs)
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    valid = loss_mask.to(device=logprobs.device) != 0
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lp = torch.where(valid, logprobs.to(dtype), zero)
    old = torch.where(valid, old_logprobs.detach().to(dtype), zero)
    log_ratio = torch.clamp(lp - old, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return lp, log_ratio, adv.detach().to(dtype), valid


def _metrics(ratio, log_ratio, valid, low, high, dual=None) -> Dict[str, torch.Tensor]:
    with torch.no_grad():
        count = valid.sum().to(torch.float32).clamp(min=1.0)
        r32 = ratio.detach().to(torch.float32)
        f = lambda m: _masked_mean(m.to(torch.float32), valid, count)  # noqa: E731
        return {
            "clip_frac_low": f(low),
            "clip_frac_high": f(high),
            "dual_clip_frac": f(dual if dual is not None else torch.zeros_like(valid)),
            "approx_kl": _masked_mean(-log_ratio.detach().to(torch.float32), valid, count),
            "ratio_mean": _masked_mean(r32, valid, count),
            "ratio_max": torch.where(valid, r32, torch.zeros_like(r32)).max()
            if r32.numel()
            else torch.zeros((), device=r32.device),
        }


@POLICY_LOSSES.register("decoupled-clip")
def decoupled_clip_loss(logprobs, old_logprobs, advantages, loss_mask, cfg):
    r"""DAPO's clipped surrogate with Clip-Higher (paper Eq. 10), and the optional dual clip:

    .. math:: L_{i,t} = -\min\big(r_{i,t}\hat A_i,\ \mathrm{clip}(r_{i,t}, 1-\varepsilon_{low},
              1+\varepsilon_{high})\hat A_i\big),\qquad r_{i,t} = \pi_\theta/\pi_{old}

    (:func:`~megatron_dapo.algo.policy_loss`; ``--eps-clip-low/high``, ``--clip-ratio-c``).
    The default; with ``eps_low = eps_high = 0.2`` and no dual clip it is GRPO's."""
    return policy_loss(
        logprobs, old_logprobs, advantages, loss_mask, cfg.eps_clip_low, cfg.eps_clip_high, cfg.clip_ratio_c
    )


@POLICY_LOSSES.register("gspo", aggregation=("seq-mean-token-mean",), whole_sequences=True)
def gspo_loss(logprobs, old_logprobs, advantages, loss_mask, cfg):
    r"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): one importance ratio per
    sequence, the length-normalised (geometric-mean) ratio, clipped per sequence:

    .. math::

        s_i = \exp\Big(\frac{1}{|o_i|}\sum_t \log\frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}\Big),\qquad
        J = \frac{1}{G}\sum_i \min\big(s_i \hat A_i,\ \mathrm{clip}(s_i, 1-\varepsilon_{low},
        1+\varepsilon_{high})\hat A_i\big)

    computed per token as :math:`s_{i,t} = \mathrm{sg}[s_i]\cdot\pi_\theta(o_{i,t})/\mathrm{sg}[\pi_\theta(o_{i,t})]`
    (equal to :math:`s_i` in value; its gradient, averaged over the sequence's tokens, is the
    gradient of :math:`s_i`), so ``seq-mean-token-mean`` aggregation gives :math:`J`'s gradient.
    The paper's clip ranges are tiny (3e-4 / 4e-4: a sequence ratio sits close to 1); the dual
    clip (``--clip-ratio-c``) does not apply. Needs whole sequences (no CP > 1)."""
    lp, log_ratio, adv, valid = _inputs(logprobs, old_logprobs, advantages, loss_mask)
    n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
    log_seq = (log_ratio.sum(dim=1, keepdim=True) / n).detach()
    log_tok = torch.clamp(lp - lp.detach() + log_seq, max=LOG_RATIO_CLAMP)
    ratio = torch.exp(log_tok)
    low_c, high_c = 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, low_c, high_c))
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    r = ratio.detach()
    return loss, _metrics(r, log_seq.expand_as(r), valid, (r < low_c) & (adv < 0), (r > high_c) & (adv > 0))


@POLICY_LOSSES.register("cispo")
def cispo_loss(logprobs, old_logprobs, advantages, loss_mask, cfg):
    r"""CISPO (MiniMax-M1, 2025): clip the importance-sampling WEIGHT, under a stop-gradient,
    and keep every token's gradient (PPO's clip zeroes the gradient of clipped tokens, often
    the rare "reflection" tokens):

    .. math:: J = \frac{1}{\sum_i|o_i|}\sum_i\sum_t \mathrm{sg}\big(\mathrm{clip}(r_{i,t},
              1-\varepsilon_{low}, 1+\varepsilon_{high})\big)\,\hat A_i\,\log\pi_\theta(o_{i,t})

    so :math:`L_{i,t} = -\mathrm{sg}(\hat r_{i,t})\hat A_i\log\pi_\theta(o_{i,t})`
    (token-mean aggregation, as in the paper). ``--eps-clip-low/high`` are the weight's
    bounds: MiniMax-M1 imposes no lower bound (``--eps-clip-low 1``) and tunes only the upper
    one. The loss VALUE is not a surrogate of J's value (it is ``-w A log pi``); its gradient
    is J's. No dual clip."""
    lp, log_ratio, adv, valid = _inputs(logprobs, old_logprobs, advantages, loss_mask)
    ratio = torch.exp(log_ratio.detach())
    low_c, high_c = 1.0 - cfg.eps_clip_low, 1.0 + cfg.eps_clip_high
    w = torch.clamp(ratio, low_c, high_c)
    loss = torch.where(valid, -w * adv * lp, torch.zeros_like(lp))
    return loss, _metrics(ratio, log_ratio, valid, ratio < low_c, ratio > high_c)


@POLICY_LOSSES.register("dr-grpo", aggregation=("seq-mean-token-sum",))
def dr_grpo_loss(logprobs, old_logprobs, advantages, loss_mask, cfg):
    r"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without its two
    biases: no :math:`1/|o_i|` per response (long wrong answers are not penalised less per
    token) and no division by the group's std (``--advantage-estimator group-mean``):

    .. math:: J = \frac{1}{G}\sum_i \frac{1}{L_{max}}\sum_t \min\big(r_{i,t}\hat A_i,\
              \mathrm{clip}(r_{i,t}, 1-\varepsilon_{low}, 1+\varepsilon_{high})\hat A_i\big)

    The constant :math:`L_{max}` (``--max-response-length``) only keeps the loss on the usual
    scale. Per token: the decoupled-clip loss divided by :math:`L_{max}`, reduced with
    ``seq-mean-token-sum`` (the only aggregation it is defined with)."""
    loss, m = policy_loss(
        logprobs, old_logprobs, advantages, loss_mask, cfg.eps_clip_low, cfg.eps_clip_high, cfg.clip_ratio_c
    )
    return loss / float(cfg.max_response_length), m


__all__ = [
    "POLICY_LOSSES",
    "POLICY_LOSS_METRICS",
    "PolicyLoss",
    "cispo_loss",
    "decoupled_clip_loss",
    "dr_grpo_loss",
    "gspo_loss",
]
