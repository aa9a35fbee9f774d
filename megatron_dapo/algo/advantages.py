"""Advantage estimators: outcome rewards of groups of responses -> one advantage per response.

Each estimator is a pure function ``fn(rewards, group_size, eps) -> advantages`` over a
``[batch]`` tensor of contiguous groups of ``group_size`` responses, registered by name in
:data:`ADVANTAGE_ESTIMATORS`; ``--advantage-estimator NAME`` picks one (its choices are the
registry's names) and the driver calls :func:`compute_advantages`. Adding one: see
"Adding an advantage estimator" in docs/design.md.
"""

from __future__ import annotations

import torch

from ._checks import as_tensor, check_1d_nonempty, check_group_size, check_real
from .registry import Registry

#: name -> estimator ``fn(rewards, group_size, eps) -> advantages``; the order is the order of
#: the flag's choices, the first is the default.
ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator", flag="--advantage-estimator")


def compute_group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, normalize_std: bool = True
) -> torch.Tensor:
    r"""Group-relative advantage of every sample (GRPO / DAPO paper sections 2.2 and 3).

    .. math::

        \hat A_{i} = \frac{R_i - \operatorname{mean}(\{R_j\}_{j=1}^{G})}
                          {\operatorname{std}(\{R_j\}_{j=1}^{G}) + \varepsilon}

    for the group of ``G = group_size`` responses to the same prompt. Groups are the
    contiguous blocks ``rewards[k*G:(k+1)*G]``. ``std`` is the unbiased sample standard
    deviation (divisor ``G - 1``), as in the official implementation; ``eps`` guards the
    division. With ``normalize_std=False`` the advantage is only mean-centred,
    ``R_i - mean(R)``.

    Guarantees:

    * a group whose rewards are all equal gets advantages that are exactly ``0.0``
      (not merely close to it), with or without std normalisation;
    * ``G = 1`` is allowed: every advantage is 0 (a single sample carries no
      group-relative signal);
    * the result has the shape ``[batch]`` of ``rewards``; the trainer broadcasts it over
      the response tokens (``policy_loss`` accepts ``[batch]`` directly). The dtype is
      that of ``rewards`` when floating, float32 otherwise; the arithmetic is done in
      float64. The result never carries gradient.

    Args:
        rewards: ``[batch]`` scalar rewards (the shaped score, e.g. ``+1/-1`` correctness
            plus the overlong penalty).
        group_size: responses per prompt ``G``; must divide ``batch``.
        eps: added to the std before dividing, ``>= 0``.
        normalize_std: divide by ``std + eps`` (GRPO/DAPO) or not.

    Raises:
        ValueError: naming ``rewards`` (not 1-D, empty), ``group_size`` (not an int >= 1,
            does not divide the batch) or ``eps`` (negative, not finite).
    """
    rewards = as_tensor(rewards, "rewards")
    check_1d_nonempty(rewards, "rewards")
    g = check_group_size(group_size, rewards.shape[0], batch_name="rewards batch")
    eps = check_real(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    if not isinstance(normalize_std, bool):
        raise ValueError(f"normalize_std must be a bool, got {normalize_std!r}")

    out_dtype = rewards.dtype if torch.is_floating_point(rewards) else torch.float32
    r = rewards.detach().to(torch.float64).view(-1, g)
    mean = r.mean(dim=1, keepdim=True)
    centred = r - mean
    if normalize_std and g > 1:
        std = r.std(dim=1, unbiased=True, keepdim=True)
        adv = centred / (std + eps)
    else:
        adv = centred
    # Uniform groups: exactly zero, independent of rounding in the mean.
    uniform = (r == r[:, :1]).all(dim=1, keepdim=True)
    adv = torch.where(uniform, torch.zeros_like(adv), adv)
    return adv.reshape(-1).to(out_dtype)


def _check_eps(eps) -> float:
    eps = check_real(eps, "eps")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    return eps


@ADVANTAGE_ESTIMATORS.register("group-norm")
def group_norm_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    r"""GRPO / DAPO group-normalised advantage (paper sections 2.2 and 3), the default.

    .. math::

        \hat A_i = \frac{R_i - \operatorname{mean}(\{R_j\}_{j=1}^{G})}
                        {\operatorname{std}(\{R_j\}_{j=1}^{G}) + \varepsilon}

    ``std`` unbiased (divisor ``G - 1``); uniform groups and ``G = 1`` give exactly 0. This is
    :func:`compute_group_advantages` with ``normalize_std=True``.
    """
    return compute_group_advantages(rewards, group_size, eps=eps, normalize_std=True)


@ADVANTAGE_ESTIMATORS.register("group-mean")
def group_mean_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    r"""Group mean-centred advantage, without the division by the group's std.

    .. math::

        \hat A_i = R_i - \operatorname{mean}(\{R_j\}_{j=1}^{G})

    Dividing by the group std weights a prompt by how consistent its responses are (a group
    with one right answer out of 16 gets larger advantages than one with 8); dropping it
    (one of the corrections of Dr. GRPO, arXiv 2503.20783) keeps every group on the reward's
    own scale. ``eps`` is accepted for a uniform signature and unused. Uniform groups and
    ``G = 1`` give exactly 0. This is :func:`compute_group_advantages` with
    ``normalize_std=False`` (the removed ``--normalize-adv-std false``).
    """
    _check_eps(eps)
    return compute_group_advantages(rewards, group_size, eps=0.0, normalize_std=False)


@ADVANTAGE_ESTIMATORS.register("reinforce-pp-baseline")
def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    r"""REINFORCE++-baseline (Hu et al., arXiv 2501.03262): group mean as the baseline, then
    normalisation by the statistics of the whole batch instead of each group.

    .. math::

        A'_i = R_i - \operatorname{mean}(\{R_j\}_{j=1}^{G}), \qquad
        \hat A_i = \frac{A'_i - \operatorname{mean}_{\mathcal B}(A')}
                        {\operatorname{std}_{\mathcal B}(A') + \varepsilon}

    where :math:`\mathcal B` is every response passed in (the rollout step's kept groups)
    and ``std`` is unbiased (divisor ``|B| - 1``). Each response counts once (statistics over
    responses, not tokens). The batch std does not shrink to zero for a group whose rewards
    barely differ, so such groups are not blown up the way the per-group std does. Uniform
    groups, ``G = 1`` and a batch whose centred rewards are all 0 give exactly 0.
    """
    eps = _check_eps(eps)
    rewards = as_tensor(rewards, "rewards")
    centred = compute_group_advantages(rewards, group_size, eps=0.0, normalize_std=False)
    out_dtype = centred.dtype
    a = centred.to(torch.float64)
    uniform = a == 0  # exactly 0 for every response of a uniform group (and G = 1)
    if a.numel() < 2 or bool(uniform.all()):
        return torch.zeros_like(centred)
    adv = (a - a.mean()) / (a.std(unbiased=True) + eps)
    g = check_group_size(group_size, rewards.shape[0], batch_name="rewards batch")
    uniform_group = uniform.view(-1, g).all(dim=1, keepdim=True).expand(-1, g).reshape(-1)
    adv = torch.where(uniform_group, torch.zeros_like(adv), adv)
    return adv.to(out_dtype)


def compute_advantages(estimator: str, rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Advantages of ``rewards`` (contiguous groups of ``group_size``) by the estimator named
    ``estimator`` (``--advantage-estimator``; one of ``ADVANTAGE_ESTIMATORS.names()``).

    Raises:
        ValueError: an unknown estimator name (naming the flag and the registered names), or
            the estimator's own input errors.
    """
    return ADVANTAGE_ESTIMATORS.get(estimator)(rewards, group_size, eps)
