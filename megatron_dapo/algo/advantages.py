"""Group-relative advantages (GRPO / DAPO)."""

from __future__ import annotations

import torch

from ._checks import as_tensor, check_1d_nonempty, check_group_size, check_real


def compute_group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    normalize_std: bool = True,
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
