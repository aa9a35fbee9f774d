"""Equivalence of parsed answer values for `math` mode.

Rules, in order of trust:

* numbers: exact rational comparison ("1000.0" == 1000, 0.50000001 != 1/2, 1/2004! != 1/2006!);
  a rational and an irrational-looking value are equal only if sympy proves the difference
  is 0; two irrational values are equal when sympy proves it, or cannot decide and the
  difference vanishes at 60 digits (never within a loose tolerance: a difference sympy
  knows to be nonzero, however tiny, means "not equal");
* symbolic expressions: expand / cancel / simplify of the difference must give exactly 0;
* tuples and intervals compare in order and with their brackets; sets and bare lists compare
  as multisets in any order; a tuple against a bare list compares in order;
* relations compare up to a constant factor (positive for inequalities) of lhs - rhs; a
  one-variable inequality (chain) also compares with the interval it describes;
* text compares as a whitespace/case-normalised string.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

import sympy
from sympy.core.function import AppliedUndef

from .answer_cleanup import clean_answer
from .guards import MAX_EXPANSION_TERMS, MAX_ITEMS, MAX_SIMPLIFY_OPS
from .latex import PM, Rel, Seq, Text, parse_latex


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
    """Exact equality of two constants.

    Rationals compare exactly. Otherwise a cheap 30-digit evaluation rejects values that
    differ by more than a relative 1e-9; values that close are equal only when sympy proves
    the difference is 0, or when it cannot decide (`is_zero` is None: an identity it cannot
    simplify, such as ``atan(1/2) + atan(1/3) - pi/4``) and the difference evaluates to 0
    at 60 digits. A difference that sympy knows is nonzero (``\\pi + 10^{-10}\\pi`` against
    ``\\pi``) is never accepted, however small.
    """
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
    scale = (
        max(abs(va), abs(vb), sympy.Integer(1)) if (va.is_real and vb.is_real) else max(sympy.Abs(va), sympy.Abs(vb), 1)
    )
    try:
        close = bool(sympy.Abs(va - vb) <= scale * sympy.Float(1e-9, 30))
    except TypeError:
        return False
    if not close:
        return False
    diff = a - b
    if _proved_zero(diff):
        return True
    if a.is_Rational or b.is_Rational:
        return False  # one side exact rational: only a proof counts
    try:
        if diff.is_zero is not None or sympy.count_ops(diff) > MAX_SIMPLIFY_OPS * 4:
            return bool(diff.is_zero)
        return bool(sympy.Abs(sympy.N(diff, 60)) < scale * sympy.Float(10, 60) ** -50)
    except Exception:  # noqa: BLE001 - undecidable: not equal
        return False


def expansion_terms(e) -> int:
    """Upper bound on the number of terms `sympy.expand(e)` produces (cheap, no expansion)."""
    if e.is_Add:
        return sum(expansion_terms(a) for a in e.args)
    if e.is_Mul:
        total = 1
        for a in e.args:
            total *= expansion_terms(a)
        return total
    if e.is_Pow and e.exp.is_Integer and e.exp > 1:
        t = expansion_terms(e.base)
        return math.comb(int(e.exp) + t - 1, t - 1) if t > 1 else 1
    return 1


def _proved_zero(diff: sympy.Expr) -> bool:
    try:
        if diff == 0:
            return True
        if sympy.count_ops(diff) > MAX_SIMPLIFY_OPS * 4 or expansion_terms(diff) > MAX_EXPANSION_TERMS:
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
    if not syms or a.has(sympy.Sum) or b.has(sympy.Sum):
        return False  # (an undefined function f(x) does not evaluate to a number: no verdict)
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
    # Different at a random point: not equal (symbols may still cancel, as in x - x + 5,
    # so a difference in free symbols alone proves nothing); else only a proof says yes.
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
        if (
            lo.free_symbols
            or hi.free_symbols
            or not (lo.is_real or lo in (sympy.oo, -sympy.oo))
            or not (hi.is_real or hi in (sympy.oo, -sympy.oo))
        ):
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
    if _is_inequality_list(v):
        sets = [_point_set(item) or _interval(_unlabel(item)) for item in v.items]
        if any(x is None for x in sets):
            return None
        try:
            return sympy.Intersection(*sets) if v.left == "and" else sympy.Union(*sets)
        except Exception:  # noqa: BLE001
            return None
    return None


def _point_set(item):
    """{c} for an item "x = c" of an inequality list ("a <= -2 or a = 1"), else None."""
    if isinstance(item, Labeled) and _is_plain_expr(item.value):
        sym, value = parse_label(item.label), item.value
    elif isinstance(item, Rel) and item.ops == ("=",) and all(_is_plain_expr(p) for p in item.parts):
        sym, value = item.parts if isinstance(item.parts[0], sympy.Symbol) else item.parts[::-1]
    else:
        return None
    if isinstance(sym, sympy.Symbol) and value.is_number and value.is_real:
        return sympy.FiniteSet(value)
    return None


def _is_inequality_list(v) -> bool:
    """A bare list with an inequality in it ("x < -1 or x > 2"): it stands for a set of reals."""
    return (
        isinstance(v, Seq)
        and v.kind == "list"
        and any(
            isinstance(_unlabel(x), Rel) and any(op in ("<", "<=", ">", ">=") for op in _unlabel(x).ops)
            for x in v.items
        )
    )


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
    """Set equality (duplicates ignored), any order; as multisets first (w=16, a=1, b=1 vs 16, 1, 1)."""
    if len(xs) == len(ys) and _multiset_equal(xs, ys):
        return True
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


@lru_cache(maxsize=4096)
def parse_label(label: str):
    """Parse the left side of "label = value" (used when comparing against an equation)."""
    try:
        return parse_latex(clean_answer(label))
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - ParseError, TooComplex or a sympy failure: not a label
        return None


def _as_equation(v):
    """Labeled("y", e) -> Rel y = e, for comparison against an equation."""
    if isinstance(v, Labeled) and v.label is not None and _is_plain_expr(v.value):
        label = parse_label(v.label)
        if _is_plain_expr(label):
            return Rel(("=",), (label, v.value))
    return None


def _numeric_equation_value(v):
    """ "1/2 = 10/9" (no unknowns): a computation whose value is its last part."""
    if (
        isinstance(v, Rel)
        and v.ops == ("=",) * len(v.ops)
        and all(_is_plain_expr(p) and not p.free_symbols for p in v.parts)
    ):
        return v.parts[-1]
    return v


def _function_label(label):
    """(name, argument symbols) of a label such as "f(x)" or "g(a, b)", else None."""
    parsed = parse_label(label) if isinstance(label, str) else None
    if isinstance(parsed, AppliedUndef) and all(isinstance(x, sympy.Symbol) for x in parsed.args):
        if len(set(parsed.args)) == len(parsed.args):
            return parsed.func.__name__, parsed.args
    return None


def _labels_equal(a: Labeled, b: Labeled):
    """Compare two "label = value" items whose labels are functions: f(x)=2x vs f(z)=2z.

    The bound variables of `b` are renamed to those of `a` (a variable of `a` that `b` uses
    freely becomes a fresh one, so g(u)=t^2 does not match g(t)=t^2). Returns None when the
    labels are not both functions (the caller then compares the values alone).
    """
    fa, fb = _function_label(a.label), _function_label(b.label)
    if fa is None or fb is None:
        return None
    if fa[0] != fb[0] or len(fa[1]) != len(fb[1]):
        return False
    if not (_is_plain_expr(a.value) and _is_plain_expr(b.value)):
        return None
    mapping = {old: new for old, new in zip(fb[1], fa[1])}
    for sym in fa[1]:
        if sym not in mapping:
            mapping[sym] = sympy.Dummy(sym.name)
    return expr_equal(a.value, b.value.xreplace(mapping))


def _label_key(label) -> str:
    return re.sub(r"\s+|\\text|[{}]", "", str(label)).lower()


def _labelled_map(v):
    """{label: [values]} when every item of a list is "label = value" (else None)."""
    if not (isinstance(v, Seq) and v.kind == "list" and all(isinstance(x, Labeled) and x.label for x in v.items)):
        return None
    out: dict[str, list] = {}
    for x in v.items:
        out.setdefault(_label_key(x.label), []).append(x.value)
    if len({re.sub(r"_.*$", "", k) for k in out}) == 1 and len(out) > 1:
        return None  # x_1, x_2, x_3: numbered solutions, an unordered set
    return out


def _vector_items(m):
    """The entries of a row or column vector, else None."""
    if isinstance(m, sympy.MatrixBase) and 1 in m.shape:
        return list(m)
    return None


def values_equal(a, b) -> bool:
    """Equivalence of two parsed values (see module docstring)."""
    if isinstance(a, Labeled) and isinstance(b, Labeled):
        same = _labels_equal(a, b)
        if same is not None:
            return same
    ma, mb = _labelled_map(a), _labelled_map(b)
    if ma is not None and mb is not None and set(ma) == set(mb):
        # p=4, q=7 against q=7, p=4: the values of each label (in any order for a repeated one).
        return all(
            _set_equal(ma[k], mb[k]) if len(ma[k]) > 1 or len(mb[k]) > 1 else values_equal(ma[k][0], mb[k][0])
            for k in ma
        )
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
        # A row or column vector is the tuple of its entries (in order).
        va, vb = _vector_items(a), _vector_items(b)
        if va is not None and isinstance(b, Seq) and b.kind in ("tuple", "bracket", "list"):
            return _ordered_equal(va, list(b.items))
        if vb is not None and isinstance(a, Seq) and a.kind in ("tuple", "bracket", "list"):
            return _ordered_equal(list(a.items), vb)
        return isinstance(a, sympy.Basic) and isinstance(b, sympy.Basic) and expr_equal(a, b)

    a_pm, b_pm = expand_pm(a), expand_pm(b)
    if len(a_pm) > 1 or len(b_pm) > 1:
        return _collection_equal(Seq(tuple(a_pm), "set"), Seq(tuple(b_pm), "set"))

    if isinstance(a, Rel) and isinstance(b, Rel):
        if _rel_equal(a, b):
            return True
        sa, sb = _rel_to_set(a), _rel_to_set(b)
        return sa is not None and sb is not None and sa == sb
    if (
        isinstance(a, Seq)
        or isinstance(b, Seq)
        or isinstance(a, tuple)
        or isinstance(b, tuple)
        or isinstance(a, Rel)
        or isinstance(b, Rel)
    ):
        return _collection_equal(a, b)
    return False


def _ratio_equal(a: Seq, b: Seq) -> bool:
    """5:2 = 10:4 (proportional, in order; all parts nonzero numbers)."""
    if len(a.items) != len(b.items) or not all(_is_plain_expr(x) and x.is_number and x != 0 for x in a.items + b.items):
        return False
    return all(expr_equal(a.items[0] * y, b.items[0] * x) for x, y in zip(a.items[1:], b.items[1:]))


def ratio_value(v):
    """The number a two-part ratio a:b stands for (a/b), else None."""
    if isinstance(v, Seq) and v.kind == "ratio" and len(v.items) == 2:
        num, den = v.items
        if _is_plain_expr(num) and _is_plain_expr(den) and num.is_number and den.is_number and den != 0:
            return num / den
    return None


def _collection_equal(a, b) -> bool:
    for x, y in ((a, b), (b, a)):
        if _is_plain_expr(y) and ratio_value(x) is not None:
            return expr_equal(ratio_value(x), y)  # 5:8 is 5/8
    if _is_inequality_list(a) or _is_inequality_list(b):
        # "x < -1 or x > 2" against (-oo, -1) U (2, oo): compare the sets of reals.
        sa, sb = _interval(a), _interval(b)
        try:
            return sa is not None and sb is not None and bool(sa == sb)
        except Exception:  # noqa: BLE001
            return False
    # One-element collections (after removing duplicates) stand for their element.
    if isinstance(a, Seq) and a.kind in ("list", "set") and not isinstance(b, Seq):
        items = _dedupe(_flatten(a.items))
        return len(items) == 1 and values_equal(items[0], b)
    if isinstance(b, Seq) and b.kind in ("list", "set") and not isinstance(a, Seq):
        items = _dedupe(_flatten(b.items))
        return len(items) == 1 and values_equal(a, items[0])
    if isinstance(a, Seq) and isinstance(b, Seq):
        if a.kind == "ratio" or b.kind == "ratio":
            return a.kind == b.kind and (_ordered_equal(a.items, b.items) or _ratio_equal(a, b))
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
