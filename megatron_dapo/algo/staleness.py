r"""Asynchronous DAPO's off-policy arithmetic: policy versions, the admission rule, the measures
of how far the behaviour policy is from the proximal one, the interpolated proximal policy
(A-3PO), and the closed-loop staleness controller. Pure functions of tensors and numbers
(docs/rollout.md, "Asynchronous DAPO").

Three policies take part in an asynchronous step. The *behaviour* policy
:math:`\pi_{behav}` generated the tokens (the engine's weights of version :math:`v_b`, stamped
on every token); the *proximal* policy :math:`\pi_{prox}` is the trainer's weights at the start
of the step (version :math:`V`), which anchors the trust region; :math:`\pi_\theta` is being
optimised (it becomes version :math:`V+1`). The decoupled objective (Hilton et al. 2022; AReaL's
decoupled PPO) separates the off-policy correction from the clip:

.. math:: J(\theta) = \mathbb E\Big[\,\underbrace{\frac{\pi_{prox}}{\pi_{behav}}}_{w\ (\text{constant})}
          \min\big(u\,\hat A,\ \mathrm{clip}(u, 1-\varepsilon_{low}, 1+\varepsilon_{high})\,\hat A\big)\Big],
          \qquad u = \frac{\pi_\theta}{\pi_{prox}}

which is DAPO's clipped token-level loss with ``old_logprobs`` = :math:`\log\pi_{prox}`, times
the importance weight :math:`w` of ``--tis-mode`` (truncated at ``--tis-cap``). The sample's
*staleness* is :math:`V - v_b` for its oldest token.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import torch

from ._checks import as_tensor, check_same_shape

#: ``--proximal-logprobs``: how :math:`\log\pi_{prox}` is obtained
PROXIMAL_METHODS = ("recompute", "interpolate")


#: the importance ratio pi_old / pi_engine above which a stale token is in the tail, and the
#: quantile the controller watches: "the 99th-percentile ratio exceeds 3" is exactly "more than
#: 1% of the tokens exceed 3", a count that sums over micro-batches and ranks (``is_ratio_tail_frac``)
RATIO_TAIL = 3.0
TAIL_QUANTILE = 0.99


def staleness(trainer_version: int, oldest_token_version: int) -> int:
    """Versions between the weights being trained (``trainer_version``, the proximal policy)
    and the oldest weights that produced a token of the sample (0: on-policy)."""
    if oldest_token_version > trainer_version:
        raise ValueError(f"a token of version {oldest_token_version} is newer than the trainer's {trainer_version}")
    return int(trainer_version) - int(oldest_token_version)


def admit(oldest_token_version: int, trainer_version: int, max_staleness: int) -> bool:
    r"""The admission rule of ``--async-mode bounded``: a group enters a training batch only if
    its oldest token is at most ``max_staleness`` versions behind the trainer,
    :math:`V - \min_{i,t} v_{i,t} \le k`."""
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return staleness(trainer_version, oldest_token_version) <= max_staleness


def ess_fraction(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r"""Effective sample size of the importance weights over the valid tokens, as a fraction of
    their number (Kong 1992):

    .. math:: \frac{\mathrm{ESS}}{N} = \frac{\big(\sum_t w_t\big)^2}{N \sum_t w_t^2} \in (0, 1],

    1 when every weight is equal (on-policy), about :math:`1/N` when one weight dominates.
    A 0-dim tensor; 1 when no token is valid."""
    w = as_tensor(weights, "weights")
    m = as_tensor(mask, "mask")
    check_same_shape(m, "mask", w, "weights")
    valid = m.to(torch.bool)
    n = valid.sum()
    if int(n) == 0:
        return torch.ones((), dtype=torch.float64)
    v = w[valid].to(torch.float64)
    denom = n.to(torch.float64) * (v * v).sum()
    if float(denom) == 0.0:
        return torch.zeros((), dtype=torch.float64)
    return v.sum() ** 2 / denom


def ratio_tail(log_ratio: torch.Tensor, mask: torch.Tensor, q: float = 0.99) -> tuple[float, float]:
    """``(max, q-quantile)`` of the importance ratio :math:`\\exp(\\log\\rho)` over the valid
    tokens (``(1, 1)`` when none is valid): the heavy tail that precedes an off-policy collapse."""
    lr = as_tensor(log_ratio, "log_ratio")
    m = as_tensor(mask, "mask").to(torch.bool)
    check_same_shape(m, "mask", lr, "log_ratio")
    v = lr[m].to(torch.float64)
    if v.numel() == 0:
        return 1.0, 1.0
    r = torch.exp(v)
    return float(r.max()), float(torch.quantile(r, q))


def interpolation_alpha(behaviour_version: torch.Tensor, trainer_version: int) -> torch.Tensor:
    r"""A-3PO's weight (arXiv 2512.06547) of each token: the proximal policy's place between the
    behaviour policy and the policy being optimised, by version,

    .. math:: \alpha = \frac{v_{prox} - v_b}{v_\theta - v_b} = \frac{V - v_b}{V + 1 - v_b} \in [0, 1),

    0 for a token of the trainer's own version (the proximal policy is then the behaviour one)."""
    vb = as_tensor(behaviour_version, "behaviour_version").to(torch.float64)
    if bool((vb > trainer_version).any()):
        raise ValueError(f"a token's version is newer than the trainer's {trainer_version}")
    lag = float(trainer_version) - vb
    return lag / (lag + 1.0)


def interpolated_proximal_logprobs(
    behaviour_logprobs: torch.Tensor,
    current_logprobs: torch.Tensor,
    behaviour_version: torch.Tensor,
    trainer_version: int,
) -> torch.Tensor:
    r"""The proximal policy's log-probabilities without a forward pass (A-3PO, log-linear):

    .. math:: \log\pi_{prox} \approx \log\pi_{behav} + \alpha\,\big(\log\pi_\theta - \log\pi_{behav}\big)

    with :math:`\alpha` of :func:`interpolation_alpha`; ``current_logprobs`` is detached (the
    proximal policy is a constant of the loss). Shapes ``[batch, seq]``; versions ``[batch,
    seq]`` or ``[batch]`` (one per sample)."""
    alpha = interpolation_alpha(behaviour_version, trainer_version)
    if alpha.dim() == 1 and as_tensor(behaviour_logprobs, "behaviour_logprobs").dim() == 2:
        alpha = alpha[:, None]
    return proximal_from_alpha(behaviour_logprobs, current_logprobs, alpha)


def proximal_from_alpha(
    behaviour_logprobs: torch.Tensor, current_logprobs: torch.Tensor, alpha: torch.Tensor
) -> torch.Tensor:
    r""":math:`\log\pi_{behav} + \alpha\,(\log\pi_\theta - \log\pi_{behav})` with each token's
    :math:`\alpha` given (the trainer's loss gets it per token, ``TrainItem.prox_alpha``);
    ``current_logprobs`` detached."""
    b = as_tensor(behaviour_logprobs, "behaviour_logprobs")
    c = as_tensor(current_logprobs, "current_logprobs").detach().to(b.dtype)
    check_same_shape(c, "current_logprobs", b, "behaviour_logprobs")
    return b + torch.as_tensor(alpha).to(device=b.device, dtype=b.dtype) * (c - b)


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """The ESS controller's thresholds (``--staleness-control ess``)."""

    max_staleness: int  # the largest lag it may allow (--max-staleness)
    ess_low: float = 0.6  # below this ESS/N the lag is lowered at once
    ess_high: float = 0.85  # at or above this (every step of the window) the lag may rise
    ratio_high: float = RATIO_TAIL  # a 99th-percentile ratio above this is degraded too
    patience: int = 3  # healthy steps in a row before the lag rises (the hysteresis)
    max_patience: int = 48  # the longest wait after failed raises (doubling from patience)
    start: Optional[int] = None  # the first lag (default: max_staleness)

    def __post_init__(self):
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if not 0.0 < self.ess_low < self.ess_high <= 1.0:
            raise ValueError(f"need 0 < ess_low < ess_high <= 1, got {self.ess_low}, {self.ess_high}")
        if not self.ratio_high > 1.0:
            raise ValueError(f"ratio_high must be > 1, got {self.ratio_high}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")


@dataclasses.dataclass(frozen=True)
class Decision:
    """The lag allowed for the next step, and why (logged with every change)."""

    k: int
    changed: bool
    reason: str


class StalenessController:
    """Closed-loop staleness (``--staleness-control ess``): the allowed lag ``k`` moves between 0
    (synchronous) and ``max_staleness`` from what the last steps measured.

    * degraded (ESS/N < ``ess_low`` or the 99th-percentile ratio > ``ratio_high``): ``k`` drops
      by one at once, and the healthy count restarts;
    * healthy (ESS/N >= ``ess_high`` and ratio p99 <= ``ratio_high``) for ``patience`` steps in
      a row: ``k`` rises by one (the band between the two thresholds and the patience are the
      hysteresis: no oscillation on a trace that sits in the band);
    * otherwise ``k`` holds.

    A raise that degrades within ``patience`` steps failed: the next raise from that lag waits
    twice as long (at most ``max_patience`` steps), so a lag that does not hold is probed ever
    more rarely instead of every few steps.
    """

    def __init__(self, settings: ControllerSettings):
        self.s = settings
        self.k = settings.max_staleness if settings.start is None else settings.start
        if not 0 <= self.k <= settings.max_staleness:
            raise ValueError(f"start lag {self.k} outside [0, {settings.max_staleness}]")
        self.healthy_run = 0
        self.failed_raises = [0] * (settings.max_staleness + 1)  # per lag: raises from it that failed
        self.since_raise: Optional[int] = None  # steps since the last raise (None: no raise pending)
        self.history: list[Decision] = []

    def state_dict(self) -> dict:
        """What a resume needs to decide as the uninterrupted run would (the history is logged)."""
        return {
            "k": self.k,
            "healthy_run": self.healthy_run,
            "failed_raises": list(self.failed_raises),
            "since_raise": self.since_raise,
        }

    def load_state_dict(self, s: dict) -> None:
        k = int(s["k"])
        failed = [int(x) for x in s["failed_raises"]]
        if not 0 <= k <= self.s.max_staleness or len(failed) != self.s.max_staleness + 1:
            raise ValueError(
                f"the saved controller (lag {k}, bound {len(failed) - 1}) does not fit max_staleness "
                f"{self.s.max_staleness}"
            )
        self.k, self.healthy_run, self.failed_raises = k, int(s["healthy_run"]), failed
        self.since_raise = None if s["since_raise"] is None else int(s["since_raise"])

    def wait(self, k: int) -> int:
        """Healthy steps needed to raise the lag from ``k``."""
        return min(self.s.max_patience, self.s.patience * 2 ** self.failed_raises[k])

    def observe(self, ess: float, ratio_p99: Optional[float] = None, tail_frac: Optional[float] = None) -> Decision:
        """One step's measures (of the batch just trained) -> the lag for the next step: its
        ESS / N and its ratio tail, as the 99th-percentile ratio ``ratio_p99`` or as
        ``tail_frac``, the fraction of tokens whose ratio exceeds ``ratio_high`` (the p99 exceeds
        ``ratio_high`` exactly when ``tail_frac > 1 - TAIL_QUANTILE``)."""
        s = self.s
        if ratio_p99 is not None:
            tail = ratio_p99
            tail_bad, tail_why = tail > s.ratio_high, f"ratio p99 {tail:.2f} > {s.ratio_high:.2f}"
        elif tail_frac is not None:
            tail = tail_frac
            tail_bad = tail > 1.0 - TAIL_QUANTILE
            tail_why = f"{tail:.1%} of the ratios > {s.ratio_high:.2f} (the p99 above it)"
        else:
            raise ValueError("observe needs the ratio tail: ratio_p99 or tail_frac")
        if not (math.isfinite(ess) and math.isfinite(tail)):
            degraded, why = True, f"non-finite measures (ESS/N {ess}, ratio tail {tail})"
        elif ess < s.ess_low or tail_bad:
            parts = [f"ESS/N {ess:.2f} < {s.ess_low:.2f}"] if ess < s.ess_low else []
            parts += [tail_why] if tail_bad else []
            degraded, why = True, " and ".join(parts)
        else:
            degraded, why = False, ""
        old = self.k
        if self.since_raise is not None:
            self.since_raise += 1
        if degraded:
            self.healthy_run = 0
            if self.since_raise is not None and self.since_raise <= s.patience and self.k > 0:
                self.failed_raises[self.k - 1] += 1  # the raise to this lag did not hold
            self.since_raise = None
            self.k = max(0, self.k - 1)
            reason = f"{why} at lag {old}: " + (f"lag lowered to {self.k}" if self.k != old else "lag stays 0")
        elif ess >= s.ess_high:
            self.healthy_run += 1
            need = self.wait(self.k) if self.k < s.max_staleness else 0
            if self.k < s.max_staleness and self.healthy_run >= need:
                self.k += 1
                self.healthy_run = 0
                self.since_raise = 0
                reason = f"ESS/N >= {s.ess_high:.2f} for {need} steps at lag {old}: lag raised to {self.k}"
            else:
                reason = f"healthy (ESS/N {ess:.2f}), lag {self.k}"
        else:
            self.healthy_run = 0
            reason = f"ESS/N {ess:.2f} inside [{s.ess_low:.2f}, {s.ess_high:.2f}): lag holds at {self.k}"
        d = Decision(self.k, self.k != old, reason)
        self.history.append(d)
        return d


def ess_step_scale(ess: float, floor: float = 0.1) -> float:
    """VCPO-style step scaling (arXiv 2602.17616): the update is scaled by the batch's ESS/N,
    never below ``floor`` (an optional part of ``--staleness-control ess``)."""
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor must be in (0, 1], got {floor}")
    return max(floor, min(1.0, float(ess)))


def staleness_histogram(lags: Sequence[int], top: int = 8) -> dict[str, int]:
    """Counts of the samples' lags, ``{"0": n0, "1": n1, ..., "top+": n}`` (logged per step)."""
    out: dict[str, int] = {}
    for lag in lags:
        key = str(lag) if lag < top else f"{top}+"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0].rstrip("+"))))
