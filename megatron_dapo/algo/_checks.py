"""Input checks shared by the algorithm functions.

Every check raises ``ValueError`` whose message starts with the name of the offending
argument, so a caller can tell at a glance which input was wrong. The checks only look at
shapes, dtypes and Python scalars, never at tensor values, except where a value check is
part of the contract (e.g. negative response lengths); they therefore add no device
synchronisation to the training step.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Any

import torch


def as_tensor(value: Any, name: str) -> torch.Tensor:
    """Return ``value`` as a tensor (lists and tuples of numbers are converted)."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(f"{name} must be a tensor or a sequence of numbers, got {type(value).__name__}") from exc


def check_2d(t: torch.Tensor, name: str) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must have shape [batch, seq], got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty: the batch must hold at least one sequence")


def check_1d_nonempty(t: torch.Tensor, name: str) -> None:
    if t.dim() != 1:
        raise ValueError(f"{name} must have shape [batch], got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty: the batch must hold at least one sample")


def check_same_shape(t: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if t.shape != ref.shape:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} but {ref_name} has shape {tuple(ref.shape)}; they must match"
        )


def check_int(value: Any, name: str) -> int:
    """An integer (Python or numpy), not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return operator.index(value)


def check_group_size(group_size: Any, batch: int, name: str = "group_size", batch_name: str = "batch") -> int:
    group_size = check_int(group_size, name)
    if group_size < 1:
        raise ValueError(f"{name} must be >= 1, got {group_size}")
    if batch % group_size != 0:
        raise ValueError(f"{name}={group_size} does not divide the {batch_name} size {batch}")
    return group_size


def check_real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_float_tensor(t: torch.Tensor, name: str) -> None:
    if not torch.is_floating_point(t):
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def mask_as(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The 0/1 loss mask in the floating dtype of ``like``."""
    return mask.to(dtype=like.dtype, device=like.device)
