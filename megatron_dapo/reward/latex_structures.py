"""The LaTeX answer parser's structures: tuples, intervals, sets, matrices, sums and products.

`_StructuresMixin` holds the `latex._Parser` methods for bracketed collections (tuples,
intervals, sets), matrix environments and \\sum / \\prod; they use the host parser's token
helpers (peek, next, at, expect) and grammar entry points (parse_list, parse_expr, parse_term,
parse_script, raw_group). `bigop_value` evaluates a sum or product under the size guards.
"""

from __future__ import annotations

import sympy

from .guards import (
    MAX_BIGOP_DIGITS,
    MAX_BIGOP_TERM_OPS,
    MAX_BIGOP_TERMS,
    MAX_SUM_TERMS,
    MAX_SYMBOLIC_EXPONENT,
    TooComplex,
)
from .latex_tokens import _GREEK
from .latex_values import ParseError, Seq
from .sympy_build import _digits_estimate, _expr, _sym, make_binomial, make_factorial, make_pow


class _StructuresMixin:
    """The `latex._Parser` methods for brackets, sets, matrices, sums and products."""

    def parse_brackets(self):
        left = self.next()[1]
        closers = (")", "]") if left in ("(", "[") else ("\\}",)
        value = self.parse_list(stops=closers)
        right = self.next()[1]
        if right not in closers:
            raise ParseError(f"unclosed {left}")
        if left == "\\{":
            items = value.items if isinstance(value, Seq) and value.kind == "list" else (value,)
            return Seq(tuple(items), "set", "{", "}")
        if isinstance(value, Seq) and value.kind == "list":
            kind = "tuple" if (left, right) == ("(", ")") else "bracket" if (left, right) == ("[", "]") else "interval"
            return Seq(value.items, kind, left, right)
        if (left, right) in (("(", ")"), ("[", "]")):
            return value
        raise ParseError("mismatched brackets")

    def parse_matrix(self, env: str):
        if env == "array" and self.at("{"):
            self.raw_group()
        rows, row = [], []
        while True:
            if self.at("\\end"):
                self.next()
                self.raw_group()
                break
            if self.peek()[0] == "eof":
                raise ParseError("unclosed matrix")
            if self.peek()[0] == "rowsep":
                self.next()
                if row:
                    rows.append(row)
                row = []
                continue
            if self.at("&"):
                self.next()
                continue
            row.append(_expr(self.parse_expr()))
        if row:
            rows.append(row)
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return sympy.ImmutableMatrix(rows)

    def parse_bigop(self, kind: str):
        """\\sum / \\prod with an index ``_{k=a}`` and a bound ``^{b}`` (either order, \\limits allowed).

        The index letter is bound while the body is parsed (``i`` and ``e`` are then the index,
        not the constants). Numeric bounds are evaluated term by term (`bigop_value`).
        """
        lower = upper = var = None
        for _ in range(4):
            if self.at("\\limits", "\\nolimits", "\\displaystyle"):
                self.next()
            elif self.at("_") and var is None:
                self.next()
                var, lower = self.bigop_index()
            elif self.at("^") and upper is None:
                self.next()
                upper = _expr(self.parse_script())
            else:
                break
        if var is None or upper is None:
            raise ParseError(f"{kind} without limits")
        saved = dict(self.bound)
        self.bound[var.name] = var
        try:
            body = _expr(self.parse_term())
        finally:
            self.bound = saved
        return bigop_value(kind, body, var, lower, upper)

    def bigop_index(self):
        """(index symbol, lower bound) of ``_{k=1}`` / ``_k=1`` / ``_{k = 1}``."""
        braced = self.at("{")
        if braced:
            self.next()
        kind, text = self.next()
        if kind == "word" and len(text) == 1:
            var = _sym(text)
        elif kind == "cmd" and text[1:] in _GREEK:
            var = _sym(text[1:])
        else:
            raise ParseError("sum without index")
        if not self.at("="):
            raise ParseError("sum without index")
        self.next()
        if braced:
            lower = _expr(self.parse_list(stops=("}",)))
            self.expect("}")
        else:
            lower = _expr(self.parse_script())
        return var, lower


def guarded_subs(expr, var: sympy.Symbol, value):
    """`expr` with `var` replaced by `value`, rebuilt through the size guards (make_pow ...).

    A plain substitution would evaluate ``k^{k}`` at k = 2000, or ``2^{2^{k}}``, before any
    check could see it; here each power, factorial and binomial is checked as it is rebuilt.
    """
    if expr == var:
        return value
    if not expr.args or not expr.has(var):
        return expr
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        raise TooComplex("nested sum with a symbolic bound")
    args = [guarded_subs(a, var, value) for a in expr.args]
    if expr.is_Pow:
        return make_pow(args[0], args[1])
    if isinstance(expr, sympy.factorial):
        return make_factorial(args[0])
    if isinstance(expr, sympy.binomial):
        return make_binomial(*args)
    return expr.func(*args)


def bigop_value(kind: str, body, var, lower, upper):
    """The value of a sum or product.

    Numeric bounds: a polynomial sum in closed form; anything else term by term, each term
    rebuilt through the guards, at most `MAX_BIGOP_TERMS` terms and `MAX_BIGOP_DIGITS` digits
    of exact terms in all (``\\sum_{k=1}^{2000} k^{k}`` is refused, whatever its index letter
    or spelling, before sympy tries Euler-Maclaurin on it). Symbolic bounds: an unevaluated
    `sympy.Sum` within `check_sum_cost`; a product with a symbolic bound is not parsed.
    """
    if not (lower.is_number and upper.is_number):
        if kind == "prod":
            raise ParseError("product with a symbolic bound")
        check_sum_cost(body, lower, upper)
        return sympy.Sum(body, (var, lower, upper))
    if not (lower.is_Integer and upper.is_Integer):
        raise ParseError(f"{kind} with non-integer bounds")
    terms = int(upper) - int(lower) + 1
    if terms > MAX_SUM_TERMS:
        raise TooComplex(f"{kind} too long")
    if terms <= 0:
        return sympy.Integer(0 if kind == "sum" else 1)
    if kind == "sum" and body.is_polynomial(var):
        degree = sympy.degree(body, var) if body.has(var) else 0
        if degree > MAX_SYMBOLIC_EXPONENT or any(abs(r) > 10**6 for r in body.atoms(sympy.Rational)):
            raise TooComplex("sum of a high power")
        return sympy.summation(body, (var, lower, upper))
    if terms > MAX_BIGOP_TERMS:
        raise TooComplex(f"{kind} of too many general terms")
    values, digits = [], 0
    for k in range(int(lower), int(upper) + 1):
        term = guarded_subs(body, var, sympy.Integer(k))
        if term.is_Rational:
            digits += _digits_estimate(term)
            if digits > MAX_BIGOP_DIGITS:
                raise TooComplex(f"{kind} of huge terms")
        elif term.is_number and sympy.count_ops(term) > MAX_BIGOP_TERM_OPS:
            raise TooComplex(f"{kind} of complicated terms")
        values.append(term)
    return sympy.Add(*values) if kind == "sum" else sympy.Mul(*values)


def check_sum_cost(body: sympy.Expr, lower: sympy.Expr, upper: sympy.Expr) -> None:
    """Raise for a \\sum with a symbolic bound whose evaluation would be costly (high powers,
    huge constants)."""
    exponents = [abs(int(p.exp.p)) for p in body.atoms(sympy.Pow) if p.exp.is_Rational]
    if max(exponents, default=1) > MAX_SYMBOLIC_EXPONENT:
        raise TooComplex("symbolic sum of a high power")
    if any(not p.exp.is_number for p in body.atoms(sympy.Pow)):
        raise TooComplex("symbolic sum of a variable power")
    if any(abs(r) > 10**6 for r in body.atoms(sympy.Rational)):
        raise TooComplex("symbolic sum with huge constants")
