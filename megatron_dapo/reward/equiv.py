"""Equivalence of parsed answer values for `math` mode.

Rules, in order of trust:

* numbers: exact rational comparison ("1000.0" == 1000, 0.50000001 != 1/2, 1/2004! != 1/2006!);
  a rational and an irrational-looking value are equal only if sympy proves the difference
  is 0; two irrational values are equal within a relative 1e-9;
* symbolic expressions: expand / cancel / simplify of the difference must give exactly 0;
* tuples and intervals compare in order and with their brackets; sets and bare lists compare
  as multisets in any order; a tuple against a bare list compares in order;
* relations compare up to a constant factor (positive for inequalities) of lhs - rhs; a
  one-variable inequality (chain) also compares with the interval it describes;
* text compares as a whitespace/case-normalised string.
"""

from __future__ import annotations

import sympy

from .guards import MAX_ITEMS, MAX_SIMPLIFY_OPS
from .latex import PM, Rel, Seq, Text

_REL_TOL = sympy.Rational(1, 10**9)


class Labeled:
    """A top-level answer item "label = value" (the label kept for equation comparisons)."""

    __slots__ = ("label", "value")

    def __init__(self, label, value) -> None:
        self.label = label
        self.value = value

    def __repr__(self) -> str:
        return f"Labeled({self.label!r}, {self.value!r})"


# --------------------------------------------------------------------------- numbers
def _is_plain_expr(v) -> bool:
    return isinstance(v, sympy.Expr) and not isinstance(v, sympy.MatrixBase)


def _numbers_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    if a.is_Rational and b.is_Rational:
        return a == b
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return a == b
    try:
        va, vb = sympy.N(a, 30), sympy.N(b, 30)
    except Exception:  # noqa: BLE001 - unevaluable
        return False
    if not (va.is_number and vb.is_number):
        return False
    scale = max(abs(va), abs(vb), sympy.Integer(1)) if (va.is_real and vb.is_real) else max(sympy.Abs(va), sympy.Abs(vb), 1)
    try:
        close = bool(sympy.Abs(va - vb) <= scale * sympy.Float(1e-9, 30))
    except TypeError:
        return False
    if not close:
        return False
    if a.is_Rational or b.is_Rational:
        # One side exact rational: require a proof, not a tolerance.
        return _proved_zero(a - b)
    return True


def _proved_zero(diff: sympy.Expr) -> bool:
    try:
        if diff == 0:
            return True
        if sympy.count_ops(diff) > MAX_SIMPLIFY_OPS * 4:
            return False
        e = sympy.expand(diff)
        if e == 0:
            return True
        if sympy.count_ops(e) > MAX_SIMPLIFY_OPS:
            return False
        if sympy.cancel(sympy.together(e)) == 0:
            return True
        return sympy.simplify(e) == 0
    except Exception:  # noqa: BLE001 - sympy failure means "not proved"
        return False


def _random_reject(a: sympy.Expr, b: sympy.Expr) -> bool:
    """True when a and b differ at a random rational point (cheap proof of inequality)."""
    syms = sorted(a.free_symbols | b.free_symbols, key=str)
    if not syms or a.has(sympy.Sum) or b.has(sympy.Sum) or a.atoms(sympy.Function) or b.atoms(sympy.Function):
        return False
    point = {s: sympy.Rational(37 + 11 * i, 17 + 3 * i) for i, s in enumerate(syms)}
    try:
        va = sympy.N(a.subs(point), 20)
        vb = sympy.N(b.subs(point), 20)
        if not (va.is_number and vb.is_number) or va.has(sympy.zoo, sympy.nan) or vb.has(sympy.zoo, sympy.nan):
            return False
        return bool(sympy.Abs(va - vb) > 1e-6 * max(1, sympy.Abs(va), sympy.Abs(vb)))
    except Exception:  # noqa: BLE001
        return False


def expr_equal(a, b) -> bool:
    """Exact equivalence of two sympy expressions (matrices elementwise)."""
    if a == b:
        return True
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        if not (isinstance(a, sympy.MatrixBase) and isinstance(b, sympy.MatrixBase)) or a.shape != b.shape:
            return False
        return all(expr_equal(x, y) for x, y in zip(a, b))
    if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
        return False
    if not a.free_symbols and not b.free_symbols:
        return _numbers_equal(a, b)
    if a.free_symbols != b.free_symbols:
        # Symbols may still cancel (x - x); only the exact route may say yes.
        return _proved_zero(a - b)
    if _random_reject(a, b):
        return False
    return _proved_zero(a - b)


# --------------------------------------------------------------------------- sets
def _interval(v):
    """sympy set for an interval-like value, or None."""
    if isinstance(v, Seq) and len(v.items) == 2 and v.kind in ("tuple", "bracket", "interval"):
        lo, hi = v.items
        if not (_is_plain_expr(lo) and _is_plain_expr(hi)):
            return None
        if lo.free_symbols or hi.free_symbols or not (lo.is_real or lo in (sympy.oo, -sympy.oo)) or not (hi.is_real or hi in (sympy.oo, -sympy.oo)):
            return None
        try:
            return sympy.Interval(lo, hi, v.left == "(" or lo == -sympy.oo, v.right == ")" or hi == sympy.oo)
        except Exception:  # noqa: BLE001
            return None
    if isinstance(v, Seq) and v.kind == "set":
        if all(_is_plain_expr(x) and not x.free_symbols for x in v.items):
            return sympy.FiniteSet(*v.items)
        return None
    if isinstance(v, tuple) and len(v) == 4 and v[0] == "setop":
        left, right = _interval(v[2]), _interval(v[3])
        if left is None or right is None:
            return None
        return {"\\cup": sympy.Union, "\\cap": sympy.Intersection, "\\setminus": sympy.Complement}[v[1]](left, right)
    if isinstance(v, Rel):
        return _rel_to_set(v)
    return None


def _rel_to_set(rel: Rel):
    """The solution set of a one-variable inequality (chain), or None."""
    ops, parts = rel.ops, rel.parts
    if not all(op in ("<", "<=", ">", ">=", "!=") for op in ops) or not all(_is_plain_expr(p) for p in parts):
        return None
    if len(ops) == 2 and ops[0][0] == ops[1][0] and "!" not in ops[0]:
        lo, mid, hi = parts
        if not lo.free_symbols and not hi.free_symbols and mid.free_symbols:
            left_open, right_open = ops[0] in ("<", ">"), ops[1] in ("<", ">")
            if ops[0][0] == ">":
                lo, hi, left_open, right_open = hi, lo, right_open, left_open
            try:
                if isinstance(mid, sympy.Abs) and mid.args[0].is_Symbol and bool(lo >= 0):
                    # lo <= |z| <= hi  ->  [-hi, -lo] U [lo, hi]
                    return sympy.Union(
                        sympy.Interval(-hi, -lo, right_open, left_open), sympy.Interval(lo, hi, left_open, right_open)
                    )
                if not isinstance(mid, sympy.Abs):
                    return sympy.Interval(lo, hi, left_open, right_open)
            except Exception:  # noqa: BLE001
                return None
    syms = set().union(*(p.free_symbols for p in parts))
    if len(syms) != 1:
        return None
    (x,) = syms
    try:
        conds = [_make_rel(op, parts[k], parts[k + 1]) for k, op in enumerate(ops)]
        if sympy.count_ops(parts) > 40:
            return None
        sol = sympy.solveset(sympy.And(*conds), x, domain=sympy.S.Reals) if len(conds) > 1 else None
        if sol is None:
            sol = sympy.solveset(conds[0], x, domain=sympy.S.Reals)
        return sol if isinstance(sol, sympy.Set) and not isinstance(sol, sympy.ConditionSet) else None
    except Exception:  # noqa: BLE001
        return None


def _make_rel(op, a, b):
    return {"<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "!=": sympy.Ne}[op](a, b, evaluate=False)


# --------------------------------------------------------------------------- relations
_FLIP = {">": "<", ">=": "<=", "<": "<", "<=": "<=", "=": "=", "!=": "!="}


def _rel_key(op, lhs, rhs):
    """(op class, expression d) with the relation meaning "d op 0" for < / <=, d == 0 for =."""
    if op in (">", ">="):
        return _FLIP[op], lhs - rhs
    if op in ("<", "<="):
        return op, rhs - lhs
    return op, lhs - rhs


def _rel_equal(a: Rel, b: Rel) -> bool:
    if len(a.ops) != len(b.ops):
        return False
    if not all(_is_plain_expr(p) for p in a.parts + b.parts):
        return False
    for k in range(len(a.ops)):
        op1, d1 = _rel_key(a.ops[k], a.parts[k], a.parts[k + 1])
        op2, d2 = _rel_key(b.ops[k], b.parts[k], b.parts[k + 1])
        if op1 != op2 and len(a.ops) == 1:
            return False
        if op1 != op2:
            return False
        if d1 == d2:
            continue
        if d1 == 0 or d2 == 0:
            return False
        try:
            ratio = sympy.cancel(sympy.together(d1 / d2))
        except Exception:  # noqa: BLE001
            return False
        if not (ratio.is_number and ratio != 0 and not ratio.free_symbols):
            return False
        if op1 in ("<", "<=") and not bool(ratio > 0):
            return False
    return True


# --------------------------------------------------------------------------- values
def expand_pm(v) -> list:
    """The values a ± expression stands for (one value when there is no ±)."""
    if _is_plain_expr(v) and v.has(PM):
        plus, minus = v.subs(PM, 1), v.subs(PM, -1)
        return [plus] if plus == minus else [plus, minus]
    return [v]


def _flatten(items) -> list:
    out = []
    for item in items:
        value = item.value if isinstance(item, Labeled) else item
        if isinstance(value, Seq) and value.kind in ("list", "set"):
            out.extend(value.items)
            continue
        expanded = expand_pm(value)
        if isinstance(item, Labeled) and len(expanded) == 1:
            out.append(item)
        else:
            out.extend(expanded)
    return out


def _dedupe(xs: list) -> list:
    out = []
    for x in xs:
        if not any(x == y or (isinstance(x, sympy.Basic) and isinstance(y, sympy.Basic) and x == y) for y in out):
            out.append(x)
    return out


def _set_equal(xs: list, ys: list) -> bool:
    """Set equality (duplicates ignored), any order."""
    return _multiset_equal(_dedupe(xs), _dedupe(ys))


def _multiset_equal(xs: list, ys: list) -> bool:
    if len(xs) != len(ys) or len(xs) > MAX_ITEMS:
        return False
    remaining = list(ys)
    for x in xs:
        for j, y in enumerate(remaining):
            if values_equal(x, y):
                del remaining[j]
                break
        else:
            return False
    return True


def _ordered_equal(xs, ys) -> bool:
    return len(xs) == len(ys) and all(values_equal(x, y) for x, y in zip(xs, ys))


def _unlabel(v):
    return v.value if isinstance(v, Labeled) else v


def _as_equation(v):
    """Labeled("y", e) -> Rel y = e, for comparison against an equation."""
    from .math_mode import parse_label

    if isinstance(v, Labeled) and v.label is not None and _is_plain_expr(v.value):
        label = parse_label(v.label)
        if _is_plain_expr(label):
            return Rel(("=",), (label, v.value))
    return None


def _numeric_equation_value(v):
    """ "1/2 = 10/9" (no unknowns): a computation whose value is its last part."""
    if isinstance(v, Rel) and v.ops == ("=",) * len(v.ops) and all(_is_plain_expr(p) and not p.free_symbols for p in v.parts):
        return v.parts[-1]
    return v


def values_equal(a, b) -> bool:
    """Equivalence of two parsed values (see module docstring)."""
    a, b = _numeric_equation_value(a), _numeric_equation_value(b)
    # Equations against "label = value".
    a_eq = isinstance(_unlabel(a), Rel) and _unlabel(a).ops == ("=",)
    b_eq = isinstance(_unlabel(b), Rel) and _unlabel(b).ops == ("=",)
    if a_eq and not b_eq:
        eq = _as_equation(b)
        return eq is not None and _rel_equal(_unlabel(a), eq)
    if b_eq and not a_eq:
        eq = _as_equation(a)
        return eq is not None and _rel_equal(eq, _unlabel(b))
    a, b = _unlabel(a), _unlabel(b)

    if isinstance(a, Text) or isinstance(b, Text):
        return _text_key(a) == _text_key(b)
    if _is_plain_expr(a) and _is_plain_expr(b) and not (a.has(PM) or b.has(PM)):
        return expr_equal(a, b)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        return isinstance(a, sympy.Basic) and isinstance(b, sympy.Basic) and expr_equal(a, b)

    a_pm, b_pm = expand_pm(a), expand_pm(b)
    if len(a_pm) > 1 or len(b_pm) > 1:
        return _collection_equal(Seq(tuple(a_pm), "set"), Seq(tuple(b_pm), "set"))

    if isinstance(a, Rel) and isinstance(b, Rel):
        if _rel_equal(a, b):
            return True
        sa, sb = _rel_to_set(a), _rel_to_set(b)
        return sa is not None and sb is not None and sa == sb
    if isinstance(a, Seq) or isinstance(b, Seq) or isinstance(a, tuple) or isinstance(b, tuple) or isinstance(a, Rel) or isinstance(b, Rel):
        return _collection_equal(a, b)
    return False


def _collection_equal(a, b) -> bool:
    # One-element collections (after removing duplicates) stand for their element.
    if isinstance(a, Seq) and a.kind in ("list", "set") and not isinstance(b, Seq):
        items = _dedupe(_flatten(a.items))
        return len(items) == 1 and values_equal(items[0], b)
    if isinstance(b, Seq) and b.kind in ("list", "set") and not isinstance(a, Seq):
        items = _dedupe(_flatten(b.items))
        return len(items) == 1 and values_equal(a, items[0])
    if isinstance(a, Seq) and isinstance(b, Seq):
        if a.kind == "ratio" or b.kind == "ratio":
            return a.kind == b.kind and _ordered_equal(a.items, b.items)
        ordered_kinds = ("tuple", "bracket", "interval")
        if a.kind in ordered_kinds and b.kind in ordered_kinds:
            if (a.left, a.right) != (b.left, b.right):
                return False
            return _ordered_equal(a.items, b.items)
        if a.kind in ordered_kinds or b.kind in ordered_kinds:
            tup, other = (a, b) if a.kind in ordered_kinds else (b, a)
            if other.kind == "list" and _ordered_equal(tup.items, other.items):
                return True
            if other.kind == "set" and len(other.items) == 1:
                return values_equal(tup, other.items[0])
            if other.kind == "set" and _multiset_equal(list(tup.items), list(other.items)) and tup.kind == "tuple":
                return True
            return False
        xs, ys = _flatten(a.items), _flatten(b.items)
        if _set_equal(xs, ys):
            return True
        return _chunked_equal(xs, ys) or _chunked_equal(ys, xs)
    sa, sb = _interval(a), _interval(b)
    if sa is not None and sb is not None:
        try:
            return bool(sa == sb)
        except Exception:  # noqa: BLE001
            return False
    return False


def _chunked_equal(flat: list, tuples: list) -> bool:
    """[5, 2, 7, 2] against [(5, 2), (7, 2)]: group the flat list into tuples of that size."""
    if not tuples or not all(isinstance(_unlabel(t), Seq) and _unlabel(t).kind == "tuple" for t in tuples):
        return False
    size = len(_unlabel(tuples[0]).items)
    if size < 2 or len(flat) != size * len(tuples) or any(isinstance(_unlabel(x), Seq) for x in flat):
        return False
    groups = [Seq(tuple(_unlabel(x) for x in flat[k : k + size]), "tuple", "(", ")") for k in range(0, len(flat), size)]
    return _multiset_equal(groups, [_unlabel(t) for t in tuples])


def _text_key(v) -> str:
    if isinstance(v, Text):
        s = v.text
    elif isinstance(v, sympy.Symbol):
        s = v.name
    else:
        s = str(v)
    return " ".join(s.replace("\\", "").split()).lower()
