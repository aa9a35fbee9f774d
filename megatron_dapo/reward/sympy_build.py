"""Building sympy values for the LaTeX answer parser (`latex`), each size checked first.

Exact numbers from decimal literals, powers, binomials and factorials refused when they would
explode (against the limits in `guards`), the cached symbol table, \\text{} contents, and the
combinators the grammar applies (sign, product, quotient) that keep matrices and non-expressions
apart.
"""

from __future__ import annotations

import math
import re

import sympy

from .guards import (
    MAX_BINOM_ARG,
    MAX_FACTORIAL,
    MAX_NUMBER_DIGITS,
    MAX_OTHER_EXPONENT,
    MAX_POWER_DIGITS,
    MAX_SYMBOL_EXPONENT,
    MAX_SYMBOLIC_EXPONENT,
    TooComplex,
)
from .latex_values import PM, ParseError, Text

_SYMBOL_CACHE: dict[str, sympy.Symbol] = {}


def _sym(name: str) -> sympy.Symbol:
    sym = _SYMBOL_CACHE.get(name)
    if sym is None:
        sym = _SYMBOL_CACHE[name] = sympy.Symbol(name)
    return sym


# --------------------------------------------------------------------------- numbers
def make_number(text: str) -> sympy.Expr:
    """Exact number from a decimal literal ("1000.0" -> 1000, "0.5" -> 1/2)."""
    if len(text) > MAX_NUMBER_DIGITS:
        raise TooComplex("number literal too long")
    if "." in text:
        whole, frac = text.split(".")
        return sympy.Rational(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    return sympy.Integer(int(text))


def _digits_estimate(value: sympy.Expr) -> float:
    """Rough decimal size of a rational (numerator/denominator digits)."""
    p, q = sympy.fraction(value)
    return max(abs(int(p)).bit_length(), abs(int(q)).bit_length()) * 0.30103 + 1


def check_power_cost(base: sympy.Expr, n: int) -> None:
    """Raise TooComplex when ``base**e`` with ``|numerator of e| = n`` would be costly.

    sympy rewrites ``((x-1)^2)^n`` as ``(x-1)^(2n)`` and ``(2x)^n`` as ``2^n x^n``, and the
    checks later expand sums and evaluate at rational points, so each factor of the base is
    checked with the exponent it will really carry: a rational's digits times n, a symbol's
    total exponent, a sum's expansion degree.
    """
    for factor in sympy.Mul.make_args(base):
        if factor.is_Rational:
            if factor not in (0, 1, -1) and _digits_estimate(factor) * n > MAX_POWER_DIGITS:
                raise TooComplex("power too large")
        elif factor.is_Symbol:
            if n > MAX_SYMBOL_EXPONENT:
                raise TooComplex("symbolic power too large")
        elif factor.is_Pow and factor.exp.is_Rational:
            check_power_cost(factor.base, n * abs(int(factor.exp.p)))
        elif factor.is_Add:
            if n > MAX_SYMBOLIC_EXPONENT:
                raise TooComplex("power of a sum too large")
        elif n > MAX_OTHER_EXPONENT:
            raise TooComplex("power too large")


def make_pow(base, exp):
    """base**exp with size guards (refuses 9^(9^(9^9)), ((x-1)^2)^(10^8) and friends)."""
    if not isinstance(base, sympy.Basic) or not isinstance(exp, sympy.Basic):
        raise ParseError("power of a non-expression")
    if isinstance(base, sympy.MatrixBase):
        if exp.is_Integer and 0 <= int(exp) <= 16:
            return base ** int(exp)
        raise ParseError("matrix power")
    if exp.is_number and not exp.free_symbols:
        if exp.is_Rational:
            if (
                abs(exp.p) > 10**6
                and base.is_number
                and base not in (sympy.Integer(1), sympy.Integer(0), sympy.Integer(-1))
            ):
                raise TooComplex("exponent too large")
            if abs(exp.p) > 1 and base not in (sympy.Integer(1), sympy.Integer(0), sympy.Integer(-1)):
                check_power_cost(base, abs(int(exp.p)))
        else:
            approx = sympy.N(exp, 15)
            if approx.is_real and abs(approx) > 10**6:
                raise TooComplex("exponent too large")
    elif exp.free_symbols and any(a.is_number and a.is_Rational and abs(a) > 10**6 for a in exp.atoms(sympy.Rational)):
        raise TooComplex("exponent too large")
    return sympy.Pow(base, exp)


def make_binomial(n, k):
    """binomial(n, k) with size guards (a huge value, or a huge argument beside a symbol)."""
    numbers = [a for a in (n, k) if a.is_number]
    if any(not a.is_finite for a in numbers):
        raise ParseError("binomial of infinity")
    if n.is_Integer and k.is_Integer:
        small = min(int(k), int(n) - int(k))
        if int(n) > MAX_BINOM_ARG and small > 0:
            # log10 C(n, k) <= k log10(e n / k)
            if small * (math.log10(int(n)) - math.log10(small) + 0.44) > MAX_POWER_DIGITS:
                raise TooComplex("binomial too large")
        return sympy.binomial(n, k)
    for a in (n, k):
        if any(abs(r) > MAX_BINOM_ARG for r in a.atoms(sympy.Rational)):
            raise TooComplex("binomial argument too large")
    return sympy.binomial(n, k)


def make_factorial(value):
    if value.is_Integer:
        if int(value) > MAX_FACTORIAL:
            raise TooComplex("factorial too large")
        if int(value) < 0:
            raise ParseError("negative factorial")
    elif value.is_number:
        raise ParseError("factorial of a non-integer")
    return sympy.factorial(value)


# --------------------------------------------------------------------------- combinators
def _text_value(raw: str):
    """\\text{...}: numbers parse as numbers, words become Text / symbols."""
    content = raw.strip()
    if not content:
        return sympy.Integer(1)
    if re.fullmatch(r"[-+]?\d+(\.\d+)?", content):
        return make_number(content.lstrip("+")) if not content.startswith("-") else -make_number(content[1:])
    if re.fullmatch(r"\(?[A-Za-z]\)?", content):
        letter = content.strip("()")
        return sympy.E if letter == "e" else sympy.I if letter == "i" else _sym(letter)
    words = " ".join(content.split())
    if re.fullmatch(r"[A-Za-z]+", words):
        return _sym(words)
    return Text(words)


def _expr(value):
    if isinstance(value, sympy.Basic):
        return value
    raise ParseError(f"expected an expression, got {type(value).__name__}")


def _apply_sign(sign, value):
    if sign is None or sign == "+":
        return value
    value = _expr(value)
    if sign == "-":
        return -value
    if sign == "\\pm":
        return PM * value
    if sign == "\\mp":
        return -PM * value
    raise ParseError(sign)


def _mul(a, b):
    a, b = _expr(a), _expr(b)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        try:
            return a * b
        except Exception as exc:  # shape mismatch
            raise ParseError(str(exc)) from None
    return sympy.Mul(a, b)


def _div(a, b):
    a, b = _expr(a), _expr(b)
    if isinstance(b, sympy.MatrixBase):
        raise ParseError("division by a matrix")
    if b == 0:
        raise ParseError("division by zero")
    if isinstance(a, sympy.MatrixBase):
        return a / b
    return sympy.Mul(a, sympy.Pow(b, -1))
