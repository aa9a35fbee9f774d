"""The differential verifier test's own answer reader and prover (used by `verifier_cases.py`).

It reads a gold or a written answer (LaTeX or ASCII / Unicode math, lists, tuples, intervals,
matrices, equations, names, multiple-choice letters, numbers in a base) into a `Value`: LaTeX
-> Python -> sympy through `parse_expr`, nothing from `megatron_dapo.reward`, so the labels it
proves are independent of the verifier under test. `values_equal` proves two values equal
(sympy ``simplify`` of the difference is 0, and it vanishes at 50 digits at random points) or
different (the difference is nonzero at 50 digits at some random point), else says None.

Its tables (one-letter symbols, sympy names, the LaTeX commands it translates, the Unicode it
rewrites) are the "reader" part of data/verifier/case_templates.json.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    rationalize,
    standard_transformations,
)

TEMPLATES_PATH = Path(__file__).resolve().parent / "data" / "verifier" / "case_templates.json"
_READER = json.loads(TEMPLATES_PATH.read_text(encoding="utf-8"))["reader"]

# --------------------------------------------------------------------------- reading
_T = standard_transformations + (implicit_multiplication_application, convert_xor, rationalize)
_LOCAL = {c: sympy.Symbol(c) for c in _READER["symbols"]}
_LOCAL.update({name: getattr(sympy, attr) for name, attr in _READER["sympy_names"].items()})


class Unreadable(Exception):
    """The reader does not understand this text (the case is dropped)."""


def _group(s: str, i: int) -> tuple[str, int]:
    """The argument at s[i]: a {group} (its inside) or one character / command."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise Unreadable("missing argument")
    if s[i] == "{":
        depth = 0
        for j in range(i, len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth == 0:
                return s[i + 1 : j], j + 1
        raise Unreadable("unclosed brace")
    if s[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", s[i:])
        return m.group(), i + m.end()
    return s[i], i + 1


def latex_to_python(s: str) -> str:
    """A LaTeX scalar (fractions, roots, pi, powers, i) as a Python expression for parse_expr."""
    s = re.sub(r"\\left|\\right|\\!|\\,|\\;|\\displaystyle", "", s)
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    out, i = [], 0
    while i < len(s):
        if s.startswith("\\frac", i):
            num, i = _group(s, i + 5)
            den, i = _group(s, i)
            out.append(f"(({latex_to_python(num)})/({latex_to_python(den)}))")
        elif s.startswith("\\sqrt", i):
            i += 5
            index = None
            if i < len(s) and s[i] == "[":
                j = s.index("]", i)
                index, i = s[i + 1 : j], j + 1
            arg, i = _group(s, i)
            inner = latex_to_python(arg)
            out.append(f"sqrt({inner})" if index is None else f"root({inner},{latex_to_python(index)})")
        elif s[i] == "\\":
            m = re.match(r"\\([a-zA-Z]+)", s[i:])
            if not m:
                raise Unreadable(s[i : i + 2])
            name = m.group(1)
            if name not in _READER["latex_commands"]:
                raise Unreadable(f"\\{name}")
            out.append(_READER["latex_commands"][name])
            i += m.end()
        elif s[i] == "{":
            out.append("(")
            i += 1
        elif s[i] == "}":
            out.append(")")
            i += 1
        elif s[i] == "^":
            out.append("**")
            i += 1
        else:
            out.append(s[i])
            i += 1
    text = "".join(out)
    return re.sub(r"(?<![A-Za-z])i(?![A-Za-z])", "I", text)


def read_scalar(text: str) -> sympy.Expr:
    """A scalar answer in LaTeX or ASCII (``3\\sqrt{13}``, ``3*sqrt(13)``, ``3√13``, ``6 - 5i``)."""
    s = text.strip().strip("$").strip()
    for a, b in _READER["unicode"]:
        s = s.replace(a, b)
    if re.fullmatch(r"[-+]?\d{1,3}(?:(?:,|\\,|\{,\}|,\\!)\d{3})+(?:\.\d+)?", s):
        s = re.sub(r"\\,|\{,\}|,\\!|,", "", s)
    s = re.sub(r"\\sqrt\s*(\d+|[a-zA-Z])", r"\\sqrt{\1}", s)  # √13 -> \sqrt13 -> \sqrt{13}
    m = re.fullmatch(r"(-?)(\d+)\s*\\frac\{(\d+)\}\{(\d+)\}", s) or re.fullmatch(r"(-?)(\d+) (\d+)/(\d+)", s)
    if m:  # mixed number
        value = int(m.group(2)) + sympy.Rational(int(m.group(3)), int(m.group(4)))
        return -value if m.group(1) else value
    py = latex_to_python(s) if "\\" in s or "{" in s or "^" in s else re.sub(r"(?<![A-Za-z])i(?![A-Za-z])", "I", s)
    py = py.replace("√", "sqrt")
    try:
        value = parse_expr(py, local_dict=dict(_LOCAL), transformations=_T)
    except Exception as exc:  # noqa: BLE001 - anything parse_expr refuses
        raise Unreadable(f"{text!r}: {exc}") from None
    if not isinstance(value, sympy.Expr):
        raise Unreadable(text)
    return value


@dataclass
class Value:
    """A read answer: kind is scalar, tuple, list, interval, matrix, equation, text, mcq or base."""

    kind: str
    items: tuple = ()  # scalar: (expr,); tuple/list/matrix rows: exprs; interval: pieces
    text: str = ""  # text / mcq / base: the normalised string


def _split_top(s: str, sep: str = ",") -> list[str]:
    parts, depth, start = [], 0, 0
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and s[i + 1 : i + 2] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(s[start:i])
            start = i + 1
        i += 1
    parts.append(s[start:])
    return parts


def _norm_text(s: str) -> str:
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    words = re.sub(r"[^A-Za-z ]", " ", s).lower().split()
    return " ".join(w for w in words if w not in ("the", "a", "an"))


def _interval_piece(s: str) -> tuple:
    s = s.strip()
    parts = _split_top(s[1:-1])
    if s[:1] not in "([" or s[-1:] not in ")]" or len(parts) != 2:
        raise Unreadable(s)
    return (s[0], read_scalar(parts[0]), read_scalar(parts[1]), s[-1])


def read_value(text: str) -> Value:
    """Read a gold or a written answer into a `Value` (raises Unreadable)."""
    s = text.strip()
    if s.startswith("$") and s.endswith("$"):
        s = s.strip("$").strip()
    s = re.sub(r"\\left|\\right|\\!|\\displaystyle", "", s).strip()
    if re.fullmatch(r"(?:\\\$)?\d{1,3}(?:(?:,|\\,|\{,\})\s*\d{3})+", s):  # 11,\! 111,\! 100; \$32,\!348
        return Value("scalar", items=(sympy.Integer(re.sub(r"\D", "", s)),))
    m = re.fullmatch(r"(?:\\text\{)?\(?([A-E])\)?\}?", s)
    if m and (s.startswith("\\text") or "(" in s):
        return Value("mcq", text=m.group(1))
    if re.fullmatch(r"(?:\\text(?:bf)?\{\s*)?[A-Za-z][A-Za-z ]*\}?\.?", s) and len(_norm_text(s)) > 2:
        return Value("text", text=_norm_text(s))
    m = re.fullmatch(r"(\d+)_\{?(\d+)\}?", s)
    if m:
        return Value("base", text=f"{m.group(1)}_{m.group(2)}")
    if s.startswith("\\begin{") and "matrix" in s:
        body = re.sub(r"\\(?:begin|end)\{[pb]?matrix\}", "", s)
        rows = [r for r in re.split(r"\\\\", body) if r.strip()]
        table = tuple(tuple(read_scalar(c) for c in r.split("&")) for r in rows)
        return Value("matrix", items=table)
    if "\\cup" in s or " U " in s:
        return Value("interval", items=tuple(_interval_piece(p) for p in re.split(r"\\cup| U ", s)))
    if "\\pm" in s:
        a, b = s.split("\\pm", 1)
        base = read_scalar(a) if a.strip() else sympy.Integer(0)
        off = read_scalar(b)
        return Value("list", items=(base + off, base - off))
    if s.startswith("\\{") and s.endswith("\\}"):
        return Value("list", items=tuple(x for part in _split_top(s[2:-2]) for x in read_value(part).items))
    if s[:1] in "([" and s[-1:] in ")]" and len(_split_top(s[1:-1])) >= 2:
        parts = _split_top(s[1:-1])
        values = tuple(read_scalar(p) for p in parts)
        if len(parts) == 2 and (s[0] + s[-1] in ("(]", "[)", "[]") or any(v.has(sympy.oo) for v in values)):
            return Value("interval", items=((s[0], values[0], values[1], s[-1]),))
        return Value("tuple", items=values)
    if "=" in s:
        lhs, rhs = s.split("=", 1)
        if re.fullmatch(r"\s*[a-z]\s*", lhs) and not read_scalar(rhs).free_symbols:
            return Value("scalar", items=(read_scalar(rhs),))  # "x=5": a labelled number
        return Value("equation", items=(read_scalar(lhs) - read_scalar(rhs),))
    if "\\in" in s:
        return read_value(s.split("\\in", 1)[1])
    parts = _split_top(s)
    if len(parts) >= 2:
        return Value("list", items=tuple(read_scalar(p) for p in parts))
    s = re.sub(r"\^\s*\{?\\circ\}?|°|\\text\{\s*degrees\}", "", s)
    s = re.sub(r"\\(?:text|mbox)\{\s*[a-z ]+\}(\^2)?$", "", s).replace("\\$", "").strip()
    return Value("scalar", items=(read_scalar(s),))


# --------------------------------------------------------------------------- proofs
_RNG_POINTS = random.Random(20261204)


def _points(symbols, n: int = 3) -> list[dict]:
    return [
        {
            s: sympy.Rational(_RNG_POINTS.randint(-97, 97) or 1, _RNG_POINTS.randint(1, 13)) + sympy.Rational(1, 7)
            for s in symbols
        }
        for _ in range(n)
    ]


def _num(expr, point) -> complex | None:
    try:
        v = sympy.N(expr.subs(point), 50)
        return complex(v) if v.is_number else None
    except Exception:  # noqa: BLE001
        return None


def scalars_equal(a: sympy.Expr, b: sympy.Expr) -> bool | None:
    """True when proved equal (simplify gives 0 and 50-digit values agree at random points),
    False when proved different (some point gives a nonzero difference), None otherwise."""
    if a.has(sympy.oo) or b.has(sympy.oo) or a.has(-sympy.oo) or b.has(-sympy.oo):
        return a == b
    diff = a - b
    points = _points(sorted(diff.free_symbols, key=str)) if diff.free_symbols else [{}]
    values = [_num(diff, p) for p in points]
    if any(v is None for v in values):
        return None
    scale = max([1.0] + [abs(x) for p in points if (x := _num(b, p)) is not None])
    if any(abs(v) > 1e-20 * scale for v in values):
        return False
    try:
        if sympy.simplify(diff) == 0 or sympy.expand(diff) == 0:
            return True
    except Exception:  # noqa: BLE001
        return None
    return None


def _multiset(xs, ys) -> bool | None:
    if len(xs) != len(ys):
        return False
    remaining = list(ys)
    for x in xs:
        verdicts = [scalars_equal(x, y) for y in remaining]
        if True in verdicts:
            del remaining[verdicts.index(True)]
        elif all(v is False for v in verdicts):
            return False
        else:
            return None
    return True


def values_equal(a: Value, b: Value) -> bool | None:
    """Proved equality of two read answers (True / False), None when not provable."""
    if a.kind in ("text", "mcq", "base") or b.kind in ("text", "mcq", "base"):
        return a.kind == b.kind and a.text == b.text
    if a.kind != b.kind:
        if {a.kind, b.kind} == {"matrix", "tuple"}:  # a column vector written as a tuple
            m, t = (a, b) if a.kind == "matrix" else (b, a)
            if all(len(r) == 1 for r in m.items):
                return values_equal(Value("tuple", tuple(r[0] for r in m.items)), t)
        return None
    if a.kind == "scalar" or a.kind == "equation":
        if a.kind == "equation":  # lhs - rhs up to a nonzero constant factor
            ratio = sympy.simplify(a.items[0] / b.items[0])
            if ratio.is_number and ratio != 0:
                return True
            return False if ratio.free_symbols else None
        return scalars_equal(a.items[0], b.items[0])
    if a.kind in ("tuple",):
        if len(a.items) != len(b.items):
            return False
        verdicts = [scalars_equal(x, y) for x, y in zip(a.items, b.items)]
        return False if False in verdicts else (True if all(verdicts) else None)
    if a.kind == "list":
        return _multiset(list(a.items), list(b.items))
    if a.kind == "matrix":
        if [len(r) for r in a.items] != [len(r) for r in b.items]:
            return False
        verdicts = [scalars_equal(x, y) for ra, rb in zip(a.items, b.items) for x, y in zip(ra, rb)]
        return False if False in verdicts else (True if all(verdicts) else None)
    if a.kind == "interval":
        if len(a.items) != len(b.items):
            return False
        for (l1, lo1, hi1, r1), (l2, lo2, hi2, r2) in zip(a.items, b.items):
            if (l1, r1) != (l2, r2):
                return False
            for x, y in ((lo1, lo2), (hi1, hi2)):
                v = scalars_equal(x, y)
                if v is not True:
                    return v
        return True
    return None
