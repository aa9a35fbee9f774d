"""Tolerances that come from the computation, not from one machine's result.

Weights compared after an optimizer step
----------------------------------------
Two runs that start from the same weights and compute the same gradient in another reduction order
(DP 2 vs one rank, EP 2 vs EP 1, CP 2 vs DP 2, another CPU's kernel blocking) get gradients that
differ by float32 rounding. Adam turns that difference into a weight difference:

* Adam moves a weight by ``lr * m_hat / (sqrt(v_hat) + eps)`` per step (plus the decoupled decay
  ``lr * wd * theta``, the same in both runs). At the first step ``m_hat = g`` and
  ``v_hat = g**2``: the move is ``lr * g / (|g| + eps)``, about ``lr`` whatever the size of ``g``.
* Its slope in ``g`` is ``lr * eps / (|g| + eps)**2 <= lr / eps``. With the default
  ``eps = 1e-8`` a gradient that is zero up to rounding (``|g|`` ~ 1e-9, its sign the
  summation order's choice) moves the weight by up to ``2 * lr`` between the runs: no tolerance
  below that can hold on every CPU (issue #44: 1.47e-5 at lr 1e-3 on an AMD EPYC, under 1e-5 on
  the Intel machine where the bound was picked from one result).
* So the tests that compare weights after Adam set ``eps`` to :data:`COMPARE_ADAM_EPS`: the move
  is then Lipschitz in ``g`` with constant ``lr / eps``, and two runs whose gradients differ by at
  most ``dg`` per element end at most ``steps * lr * dg / eps`` apart (capped at ``2 * lr`` per
  step, since ``|g| / (|g| + eps) < 1``). Clipping by the global norm scales both gradients by
  factors that agree to the same relative rounding, which doubles ``dg`` at most.
* ``dg``: a float32 sum of ``n`` terms in another order differs by at most about
  ``n * 2**-24`` times the sum of their magnitudes. The tests compare the gradient norms of the
  two runs within ``GRAD_REL`` (1e-5, i.e. sums of ~170 float32 terms at the worst-case rounding);
  the same relative bound applied to the (clipped) gradient norm bounds one element's difference.
* Plus the rounding of the stored fp32 weight itself: a few half-ulps of the largest ``|theta|``.

:func:`adam_weight_atol` is that bound. Each test names the numbers it plugs in beside it.
"""

from __future__ import annotations

#: Adam's eps in the tests that compare weights after a step (see the module docstring): large
#: enough that a rounding-level gradient difference cannot become a difference of order ``lr``.
COMPARE_ADAM_EPS = 1e-3
#: Relative agreement of two reduction orders' gradient norms in float32 (the tests assert it).
GRAD_REL = 1e-5
_FP32_HALF_ULP = 2.0**-24


def adam_weight_atol(
    lr: float,
    grad_norm: float,
    param_max: float,
    *,
    eps: float = COMPARE_ADAM_EPS,
    steps: int = 1,
    clip_grad: float = 0.0,
    grad_rel: float = GRAD_REL,
) -> float:
    """The largest ``|theta_a - theta_b|`` two runs may show after ``steps`` Adam steps of
    learning rate ``lr`` from the same weights, when their gradients (norm ``grad_norm``, clipped
    at ``clip_grad`` if > 0) differ only by float32 reduction order; ``param_max`` is the largest
    ``|theta|`` (for the fp32 rounding of the weights themselves)."""
    if lr <= 0 or eps <= 0 or steps < 1:
        raise ValueError(f"lr and eps must be > 0 and steps >= 1, got lr={lr}, eps={eps}, steps={steps}")
    norm = min(grad_norm, clip_grad) if clip_grad > 0 else grad_norm
    dg = 2.0 * grad_rel * norm  # elementwise gradient difference; x2 for the clipping factor's own rounding
    per_step = lr * min(2.0, dg / eps)
    return steps * per_step + 4.0 * _FP32_HALF_ULP * max(param_max, 1.0) * steps


def max_abs(tensors) -> float:
    """The largest ``|x|`` over a mapping or iterable of tensors."""
    values = tensors.values() if hasattr(tensors, "values") else tensors
    return max(float(t.abs().max()) for t in values)
