r"""Per-token KL estimators against a reference policy (Schulman, "Approximating KL
Divergence", 2020).

DAPO removes the KL term (paper section 2.3: the long-CoT policy is expected to move far
from the initial model); these are used only when ``--kl-coef > 0``. All three estimate
:math:`\mathrm{KL}(\pi_\theta \,\|\, \pi_{ref})` from tokens sampled from
:math:`\pi_\theta`; with :math:`\log\rho = \log\pi_{ref} - \log\pi_\theta`:

* k1 = :math:`-\log\rho` (unbiased, high variance, can be negative);
* k2 = :math:`\tfrac12(\log\rho)^2` (biased, low variance, >= 0);
* k3 = :math:`\rho - 1 - \log\rho` (unbiased, low variance, >= 0; GRPO's choice).

Inputs are ``[batch, seq]`` (any equal shapes work); the result is per token, to be
reduced with :func:`megatron_dapo.algo.aggregate_loss` and scaled by the coefficient.
``ref_logprobs`` is treated as a constant.
"""

from __future__ import annotations

import torch

from ._checks import as_tensor, check_float_tensor, check_same_shape
from .registry import Registry

#: ``--kl-estimator``: name -> ``fn(logprobs, ref_logprobs) -> per-token KL``.
KL_ESTIMATORS: Registry = Registry("KL estimator", flag="--kl-estimator")

#: log-ratio clamp before ``exp`` in k3 (same range as the policy ratio).
KL_LOG_RATIO_CLAMP = 20.0


def _prepare(logprobs, ref_logprobs):
    logprobs = as_tensor(logprobs, "logprobs")
    ref_logprobs = as_tensor(ref_logprobs, "ref_logprobs")
    check_float_tensor(logprobs, "logprobs")
    check_same_shape(ref_logprobs, "ref_logprobs", logprobs, "logprobs")
    if logprobs.numel() == 0:
        raise ValueError("logprobs is empty: the batch must hold at least one token")
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    return logprobs.to(dtype), ref_logprobs.detach().to(dtype)


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    r"""k1 estimator: :math:`\log\pi_\theta - \log\pi_{ref}` per token."""
    lp, ref = _prepare(logprobs, ref_logprobs)
    return lp - ref


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    r"""k2 estimator: :math:`\tfrac12(\log\pi_\theta - \log\pi_{ref})^2` per token."""
    lp, ref = _prepare(logprobs, ref_logprobs)
    return 0.5 * (lp - ref) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    r"""k3 estimator: :math:`e^{\log\rho} - 1 - \log\rho` with
    :math:`\log\rho = \log\pi_{ref} - \log\pi_\theta` (clamped to ``[-20, 20]``)."""
    lp, ref = _prepare(logprobs, ref_logprobs)
    log_rho = torch.clamp(ref - lp, -KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.exp(log_rho) - 1.0 - log_rho


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (``"k1"``, ``"k2"`` or ``"k3"``), see the module doc.

    Raises:
        ValueError: naming ``kind`` when unknown, or the tensors when their shapes differ.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kind must be one of {', '.join(KL_ESTIMATORS)}; got {kind!r}")
    return KL_ESTIMATORS.get(kind)(logprobs, ref_logprobs)
