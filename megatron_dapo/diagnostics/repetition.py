"""Repetition-loop detection on token ids, and the ``repetition_rate`` metric.

Definition (the one the trainer's ``repetition_rate`` metric uses)
------------------------------------------------------------------
A response *has a repetition loop* when the last ``tail`` tokens of it contain some n-gram,
``1 <= n <= ngram``, repeated back to back at least ``r(n)`` times, where

    r(n) = max(min_repeats, ceil(min_span / n)),

i.e. the loop repeats at least ``min_repeats`` times *and* covers at least ``min_span`` tokens.
The span condition keeps short legitimate repeats ("0000", "1, 1, 1", "= 0\\n= 0") from
counting; the repeat condition keeps a long n-gram seen twice from counting.

``repetition_rate(responses)`` is the fraction of responses that have a repetition loop.

Defaults and why
----------------
* ``ngram = 128``: degenerate LLM loops are mostly one token up to one sentence or short
  paragraph; 128 tokens covers a long sentence of a math derivation.
* ``min_repeats = 4``: a loop the policy has fallen into runs until the generation cap, so it is
  seen many times; four verbatim back-to-back copies essentially never happen in sound text.
* ``min_span = 64``: a single token must repeat 64 times, a 2-gram 32 times, an 8-gram 8 times;
  from 16-grams on the ``min_repeats`` condition decides.
* ``tail = 1024``: a loop that derails a response runs to its end (usually to truncation), so
  only the tail is examined, which also bounds the cost for 20k-token responses.

Cost: one vectorised comparison per candidate n over at most ``tail`` tokens (numpy), i.e.
``O(ngram * tail)`` elementary work per response, a fraction of a millisecond at the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_MIN_REPEATS",
    "DEFAULT_MIN_SPAN",
    "DEFAULT_NGRAM",
    "DEFAULT_TAIL",
    "find_repetition_loop",
    "has_repetition_loop",
    "repetition_rate",
]

DEFAULT_NGRAM = 128
DEFAULT_MIN_REPEATS = 4
DEFAULT_MIN_SPAN = 64
DEFAULT_TAIL = 1024


def _as_array(token_ids: Any) -> np.ndarray:
    if hasattr(token_ids, "detach"):  # torch tensor, without importing torch
        token_ids = token_ids.detach().cpu().numpy()
    arr = np.asarray(token_ids)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr


def find_repetition_loop(
    token_ids: Sequence[int] | np.ndarray,
    ngram: int = DEFAULT_NGRAM,
    min_repeats: int = DEFAULT_MIN_REPEATS,
    min_span: int = DEFAULT_MIN_SPAN,
    tail: int | None = DEFAULT_TAIL,
) -> tuple[int, int, int] | None:
    """Find a repetition loop (see the module docstring); ``None`` if there is none.

    Returns ``(n, start, repeats)`` for the shortest loop period ``n`` found: the n-gram starting
    at index ``start`` of ``token_ids`` (an index into the full sequence, not the tail) repeats
    back to back ``repeats`` times (the longest such run for that ``n``).
    ``tail=None`` examines the whole sequence.
    """
    if ngram < 1 or min_repeats < 2 or min_span < 1:
        raise ValueError(
            f"need ngram >= 1, min_repeats >= 2, min_span >= 1; got "
            f"ngram={ngram}, min_repeats={min_repeats}, min_span={min_span}"
        )
    arr = _as_array(token_ids)
    offset = 0
    if tail is not None and arr.shape[0] > tail:
        offset = arr.shape[0] - int(tail)
        arr = arr[offset:]
    length = arr.shape[0]
    for n in range(1, min(ngram, length // min_repeats) + 1):
        need = max(min_repeats, math.ceil(min_span / n))
        if n * need > length:
            continue
        # position j continues the loop when arr[j] == arr[j + n]; an n-gram repeated r times
        # back to back is a run of (r - 1) * n such positions.
        eq = arr[n:] == arr[:-n]
        if not eq.any():
            continue
        padded = np.concatenate(([False], eq, [False])).astype(np.int8)
        d = np.diff(padded)
        starts = np.flatnonzero(d == 1)
        ends = np.flatnonzero(d == -1)
        runs = ends - starts
        best = int(np.argmax(runs))
        repeats = int(runs[best]) // n + 1
        if repeats >= need:
            return n, offset + int(starts[best]), repeats
    return None


def has_repetition_loop(
    token_ids: Sequence[int] | np.ndarray,
    ngram: int = DEFAULT_NGRAM,
    min_repeats: int = DEFAULT_MIN_REPEATS,
    min_span: int = DEFAULT_MIN_SPAN,
    tail: int | None = DEFAULT_TAIL,
) -> bool:
    """True when the tail of ``token_ids`` contains an n-gram (``n <= ngram``) repeated back to
    back at least ``max(min_repeats, ceil(min_span / n))`` times. Accepts lists, tuples, numpy
    arrays and 1-D torch tensors of token ids."""
    return find_repetition_loop(token_ids, ngram, min_repeats, min_span, tail) is not None


def repetition_rate(
    responses: Iterable[Sequence[int] | np.ndarray],
    ngram: int = DEFAULT_NGRAM,
    min_repeats: int = DEFAULT_MIN_REPEATS,
    min_span: int = DEFAULT_MIN_SPAN,
    tail: int | None = DEFAULT_TAIL,
) -> float:
    """Fraction of ``responses`` (lists of token ids) that have a repetition loop; 0.0 for none."""
    total = hits = 0
    for r in responses:
        total += 1
        hits += has_repetition_loop(r, ngram, min_repeats, min_span, tail)
    return hits / total if total else 0.0
