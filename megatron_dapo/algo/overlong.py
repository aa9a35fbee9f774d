"""Overlong reward shaping (soft overlong punishment) and overlong filtering."""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Optional, Sequence, Union

import torch

from ._checks import as_tensor, check_1d_nonempty, check_2d, check_int, check_real

#: Finish reasons that mean "the response was cut at the length limit".
TRUNCATED_FINISH_REASONS = ("length",)


def overlong_penalty(
    response_lengths: Union[torch.Tensor, Sequence[int]],
    max_response_length: int,
    overlong_buffer_length: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    r"""Soft overlong punishment, DAPO paper Eq. 13 (times ``penalty_factor``).

    With :math:`L_{max}` = ``max_response_length`` and :math:`L_{cache}` =
    ``overlong_buffer_length``:

    .. math::

        R_{length}(y) = \begin{cases}
            0, & |y| \le L_{max} - L_{cache} \\
            \frac{(L_{max} - L_{cache}) - |y|}{L_{cache}}, & L_{max} - L_{cache} < |y| \le L_{max} \\
            -1, & L_{max} < |y|
        \end{cases}

    The result is added to the correctness reward (+1 / -1) to form the training score;
    the correctness (``acc``) itself stays a separate field, and dynamic sampling filters
    on it, never on the shaped score. The penalty is continuous at
    :math:`L_{max} - L_{cache}` and at :math:`L_{max}`, non-increasing in the length and
    lies in ``[-penalty_factor, 0]``. ``overlong_buffer_length = 0`` degenerates to a hard
    step: 0 up to ``L_max``, ``-penalty_factor`` beyond.

    Args:
        response_lengths: ``[batch]`` response lengths in tokens (ints or floats, >= 0).
        max_response_length: :math:`L_{max}` > 0 (the generation cap).
        overlong_buffer_length: :math:`L_{cache}`, in ``[0, L_max]``.
        penalty_factor: scale of the penalty, >= 0 (1.0 in the paper).

    Returns:
        ``[batch]`` float32 penalties (float64 for float64 lengths).

    Raises:
        ValueError: naming the argument (negative or non-1-D lengths, an empty batch,
            ``max_response_length <= 0``, a buffer outside ``[0, L_max]``, a negative
            factor).
    """
    lengths = as_tensor(response_lengths, "response_lengths")
    check_1d_nonempty(lengths, "response_lengths")
    if lengths.dtype == torch.bool:
        raise ValueError("response_lengths must be numbers, got a bool tensor")
    max_response_length = check_int(max_response_length, "max_response_length")
    if max_response_length <= 0:
        raise ValueError(f"max_response_length must be > 0, got {max_response_length}")
    overlong_buffer_length = check_int(overlong_buffer_length, "overlong_buffer_length")
    if not 0 <= overlong_buffer_length <= max_response_length:
        raise ValueError(
            f"overlong_buffer_length must be in [0, max_response_length={max_response_length}], "
            f"got {overlong_buffer_length}"
        )
    factor = check_real(penalty_factor, "penalty_factor")
    if factor < 0:
        raise ValueError(f"penalty_factor must be >= 0, got {penalty_factor}")

    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    y = lengths.detach().to(dtype)
    if bool((y < 0).any()) or bool(torch.isnan(y).any()):
        raise ValueError("response_lengths must be >= 0 (got a negative or NaN length)")

    l_max = float(max_response_length)
    l_cache = float(overlong_buffer_length)
    expected = l_max - l_cache
    zero = torch.zeros_like(y)
    if l_cache > 0:
        soft = (expected - y) / l_cache * factor
    else:
        soft = zero
    out = torch.where(y <= expected, zero, soft)
    out = torch.where(y > l_max, torch.full_like(y, -factor), out)
    return out


def _is_numpy_bool(item: Any) -> bool:
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy ships with torch in practice
        return False
    return isinstance(item, np.bool_)


def _is_truncated(item: Any, reasons: Iterable[str], index: int) -> bool:
    if isinstance(item, dict):  # e.g. SGLang meta_info["finish_reason"] = {"type": "length", ...}
        if "type" not in item:
            raise ValueError(f"truncated[{index}] is a dict without a 'type' key: {item!r}")
        item = item["type"]
    if isinstance(item, str):
        return item in reasons
    if isinstance(item, (bool, numbers.Integral)) or _is_numpy_bool(item):
        return bool(item)
    if isinstance(item, torch.Tensor) and item.numel() == 1:
        return bool(item)
    raise ValueError(f"truncated[{index}] must be a bool, a finish-reason string or a finish-reason dict, got {item!r}")


def overlong_filter_mask(
    truncated: Union[torch.Tensor, Sequence[Any]],
    loss_mask: Optional[torch.Tensor] = None,
    truncated_reasons: Iterable[str] = TRUNCATED_FINISH_REASONS,
) -> torch.Tensor:
    r"""Overlong filtering (DAPO section 3.4): truncated responses get loss mask 0.

    A response that stopped because it hit the length limit carries no meaningful
    terminal reward, so its tokens are excluded from the loss:
    :math:`M_{i,t} \leftarrow M_{i,t}\cdot\mathbb{1}[o_i \text{ not truncated}]`.
    Filtered responses still count in their group's advantage statistics (the filter acts
    on the loss only); in ``token-mean`` they drop out of the token count too, so the
    global count must be taken from the filtered mask.

    Args:
        truncated: ``[batch]`` truncation flags (bool / 0-1 tensor or sequence), or a
            sequence of finish reasons: strings (``"length"`` means truncated; ``"stop"``,
            ``"abort"``, ... do not) or dicts with a ``"type"`` key as SGLang returns them.
        loss_mask: optional ``[batch, seq]`` mask to filter.
        truncated_reasons: finish reasons that count as truncation.

    Returns:
        Without ``loss_mask``: a ``[batch]`` float32 keep mask (1 keep, 0 filtered). With
        it: ``loss_mask`` with the rows of truncated responses zeroed (same dtype/device).

    Raises:
        ValueError: naming ``truncated`` (empty, not 1-D, unreadable entries) or
            ``loss_mask`` (shape not ``[batch, seq]`` with the same batch).
    """
    reasons = tuple(truncated_reasons)
    if isinstance(truncated, torch.Tensor):
        check_1d_nonempty(truncated, "truncated")
        flags = truncated.detach() != 0
    else:
        items = list(truncated)
        if not items:
            raise ValueError("truncated is empty: the batch must hold at least one sample")
        flags = torch.tensor([_is_truncated(x, reasons, i) for i, x in enumerate(items)], dtype=torch.bool)
    keep = (~flags).to(torch.float32)
    if loss_mask is None:
        return keep
    loss_mask = as_tensor(loss_mask, "loss_mask")
    check_2d(loss_mask, "loss_mask")
    if loss_mask.shape[0] != keep.shape[0]:
        raise ValueError(f"loss_mask has batch size {loss_mask.shape[0]} but truncated has {keep.shape[0]} entries")
    keep = keep.to(loss_mask.device)
    if loss_mask.dtype == torch.bool:
        return loss_mask & keep.bool().unsqueeze(1)
    return loss_mask * keep.to(loss_mask.dtype).unsqueeze(1)
