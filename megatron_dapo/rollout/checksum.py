"""Exact per-tensor checksums of weights, cheap on a GPU (the weight-sync check's first half).

``tensor_checksum(t)`` reads the tensor's bytes as integers of its element size (bf16/fp16 as
int16, fp32 as int32, 1-byte types as uint8) and returns ``(dtype, shape, sum, weighted)``:

* ``sum``: the sum of those integers modulo 2**64;
* ``weighted``: the sum of ``x[i] * (i * _MUL + 1)`` modulo 2**64 over the flat index ``i``.

Both are integer sums, so they are exact and independent of the reduction order (any
chunking, any device). Two tensors with equal bytes give equal checksums; ``sum`` alone would
not see elements moved inside a tensor (a TP shard in the wrong order, a transposed block),
``weighted`` does, since each position has its own odd weight. The cost is a few elementwise
int64 passes per chunk of ``_CHUNK`` elements (no full int64 copy of a large tensor).

A checksum is a plain tuple (picklable, comparable with ``==``); :func:`describe` prints one.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

Checksum = Tuple[str, Tuple[int, ...], int, int]

_CHUNK = 1 << 24  # elements per int64 pass (128 MiB of int64 temporaries)
_MUL = 0x9E3779B1  # odd: weights i * _MUL + 1 differ for every i < 2**63
_MASK = (1 << 64) - 1
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@torch.no_grad()
def tensor_checksum(t: torch.Tensor, dtype: Optional[torch.dtype] = None) -> Checksum:
    """The exact checksum of ``t``'s values in ``dtype`` (default its own; a cast first
    where they differ)."""
    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    flat = t.contiguous().view(-1)
    ints = flat.view(_INT_VIEW[flat.element_size()]) if flat.numel() else flat
    total, weighted = 0, 0
    for start in range(0, ints.numel(), _CHUNK):
        x = ints[start : start + _CHUNK].to(torch.int64, copy=True)
        w = torch.arange(start, start + x.numel(), dtype=torch.int64, device=x.device)
        w.mul_(_MUL).add_(1)
        total += int(x.sum().item())
        weighted += int(x.mul_(w).sum().item())
    return (str(t.dtype), tuple(t.shape), total & _MASK, weighted & _MASK)


def describe(c) -> str:
    """A checksum in words; an engine's line saying why it has none to give (a str) as is."""
    if c is None:
        return "none"
    if isinstance(c, str):
        return c
    dtype, shape, s, w = c
    return f"{dtype}{list(shape)} sum {s:016x} weighted {w:016x}"


def itemsize(dtype_name: str) -> int:
    """Bytes per element of a dtype named as ``str(torch.dtype)``."""
    return torch.empty((), dtype=getattr(torch, dtype_name.replace("torch.", ""))).element_size()


def dtype_of(dtype_name: str) -> torch.dtype:
    return getattr(torch, dtype_name.replace("torch.", ""))
