"""The range of every numeric config field, declared next to its default (``_f(..., range=...)``
in config/schema.py) and enforced by one walk over the tree (:func:`check_ranges`, called first
by ``validate``): finite, sign, open or closed bounds, integer. NaN and the infinities fail every
range (NaN passes no comparison, so a check written as ``v < 0`` would let it through)."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Iterator, Optional


@dataclass(frozen=True)
class Range:
    """A closed or open interval of finite numbers, optionally integers only."""

    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        if self.lo is not None and self.hi is not None:
            left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
            return f"{kind} in {left}{_num(self.lo)}, {_num(self.hi)}{right}"
        if self.lo is not None:
            return f"{kind} {'>' if self.lo_open else '>='} {_num(self.lo)}"
        if self.hi is not None:
            return f"{kind} {'<' if self.hi_open else '<='} {_num(self.hi)}"
        return kind

    def contains(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return False
        if self.integer and not isinstance(v, int):
            return False
        if not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


#: the ranges most fields take
COUNT = Range(1, integer=True)  # sizes, counts: >= 1
EVERY = Range(0, integer=True)  # intervals and counts where 0 means "off" or "none"
POSITIVE = Range(0, lo_open=True)  # > 0
NONNEGATIVE = Range(0)  # >= 0
FINITE = Range()
FRACTION = Range(0, 1)  # [0, 1]
OPEN_FRACTION = Range(0, 1, lo_open=True)  # (0, 1]
ABOVE_ONE = Range(1, lo_open=True)  # > 1
SEED = Range(0, 2**32 - 1, integer=True)


def numeric_fields(tree: Any, flag_of) -> Iterator[tuple[dataclasses.Field, str, Any]]:
    """(field, flag, value) of every int / float leaf of a config dataclass tree (Optional
    included; booleans are not numbers)."""
    hints = typing.get_type_hints(type(tree))
    for f in dataclasses.fields(tree):
        value = getattr(tree, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            yield from numeric_fields(value, flag_of)
            continue
        if is_numeric(hints[f.name]):
            yield f, flag_of(f), value


def is_numeric(tp: Any) -> bool:
    args = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
    return bool(args) and bool not in args and all(a in (int, float) for a in args)


def range_error(f: dataclasses.Field, flag: str, value: Any) -> Optional[str]:
    """The one-line refusal of ``value`` for field ``f``, or None when it is in range (None is
    allowed for an Optional field whose default is None: "not set")."""
    rng = f.metadata.get("range")
    if rng is None:
        return f"{flag}: no range declared for this numeric field (a bug: declare range= in config/schema.py)"
    if value is None:
        return None
    if rng.contains(value):
        return None
    if isinstance(value, float) and math.isnan(value):
        shown = "nan"
    else:
        shown = repr(value)
    return f"{flag} must be {rng.describe()}, got {shown}"
