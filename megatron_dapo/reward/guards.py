"""Limits that keep pathological answers away from sympy.

A reward must never hang a run. The pool's timeout is the last line of defence; these
checks are the first: they reject inputs whose evaluation would explode (huge exponents
such as ``9^{9^{9^{9}}}``, factorials of huge numbers, 10^5-digit literals, deep nesting)
*before* sympy sees them. A rejected answer falls back to exact string comparison.
"""

from __future__ import annotations

#: Longest answer (characters, after extraction) that is parsed at all.
MAX_PARSE_CHARS = 2000
#: Longest digit string parsed as a number.
MAX_NUMBER_DIGITS = 400
#: Deepest bracket nesting parsed.
MAX_NESTING = 40
#: Largest integer power result, in decimal digits, evaluated exactly.
MAX_POWER_DIGITS = 3000
#: Largest n for which n! is evaluated.
MAX_FACTORIAL = 2500
#: Largest integer exponent of a symbolic sum (expansion cost).
MAX_SYMBOLIC_EXPONENT = 24
#: Largest total exponent of a single symbol (x^{2024} is fine; evaluating x^{10^9} at a
#: rational point is not).
MAX_SYMBOL_EXPONENT = 10_000
#: Largest exponent of any other non-rational base (a function, an irrational constant).
MAX_OTHER_EXPONENT = 1000
#: Most terms of a \sum with numeric bounds.
MAX_SUM_TERMS = 10_000
#: Most terms of a \sum or \prod with numeric bounds evaluated term by term (a sum of a
#: polynomial in its index is summed in closed form, up to MAX_SUM_TERMS terms).
MAX_BIGOP_TERMS = 300
#: Most decimal digits, over all exact terms, of a \sum or \prod evaluated term by term.
MAX_BIGOP_DIGITS = 30_000
#: Largest `count_ops` of one irrational term of such a sum or product.
MAX_BIGOP_TERM_OPS = 40
#: Largest number inside \binom with a symbolic partner, or on either side when the
#: value would exceed MAX_POWER_DIGITS digits.
MAX_BINOM_ARG = 10_000
#: Most elements in a tuple / set / list.
MAX_ITEMS = 64
#: Most terms an expansion may produce ((x+y+z+w)^{24} has 2925) before it is not attempted.
MAX_EXPANSION_TERMS = 1000
#: sympy `count_ops` above which `simplify` is not attempted.
MAX_SIMPLIFY_OPS = 80


class TooComplex(Exception):
    """The answer is too large or too deeply nested to evaluate safely."""


def nesting_depth(text: str) -> int:
    """Maximum nesting of (), [], {} in `text` (linear scan, ignores mismatches)."""
    depth = best = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            if depth > best:
                best = depth
        elif ch in ")]}" and depth > 0:
            depth -= 1
    return best


def check_parsable(text: str) -> None:
    """Raise TooComplex when `text` is too long or too deeply nested to parse."""
    if len(text) > MAX_PARSE_CHARS:
        raise TooComplex(f"answer longer than {MAX_PARSE_CHARS} characters")
    if nesting_depth(text) > MAX_NESTING:
        raise TooComplex(f"answer nested deeper than {MAX_NESTING}")
