"""Generator of model-style responses with proved labels, for the differential verifier test.

Starts from the gold answers of ``tests/data/eval/math500.jsonl`` and, with a seeded RNG,
writes for each gold

* equivalent rewrites in the forms models write final answers (another LaTeX spelling,
  ASCII math ``3*sqrt(13)`` / ``15x - 80``, Unicode ``3√13`` / ``76°``, decimals of
  terminating fractions, mixed numbers, thousands separators, a label ``n = 5``, a permuted
  list, an expanded or factored polynomial, an interval as an inequality, ...), and
* near-miss wrong answers (off by one, sign, a dropped factor of 2, a rounded decimal of an
  irrational value, a swapped pair, a flipped bracket, a missing element, another name,
  hedges such as "3 or 4" and two boxes that differ, "2*pi + 18" for a gold of 18, ...),

each wrapped in a response shape (a box, an "Answer:" line, an answer sentence, a
concluding sentence, with some reasoning text and distracting numbers before it).

Every label is proved independently of the verifier under test: the answer text written
into the response is read back by this module's own reader (LaTeX -> sympy through
`parse_expr`, nothing from `megatron_dapo.reward`), then an equivalent must be exactly equal
to the gold (sympy ``simplify`` of the difference is 0, and it vanishes at 50 digits at
random points) and a wrong answer must differ from it (the difference is nonzero at 50
digits at some random point; a hedge has a candidate that differs from a single-valued
gold). A case whose label cannot be proved is dropped, and counted.

Cases are split by problem: ``split`` is ``dev`` or ``heldout`` from a hash of the
problem's ``unique_id``, so rewrites of one gold never straddle the halves.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import sympy
from sympy.parsing.sympy_parser import (
    convert_xor,
    implicit_multiplication_application,
    parse_expr,
    rationalize,
    standard_transformations,
)

ROOT = Path(__file__).resolve().parents[1]
GOLDS_PATH = ROOT / "tests" / "data" / "eval" / "math500.jsonl"

# --------------------------------------------------------------------------- reading
_T = standard_transformations + (implicit_multiplication_application, convert_xor, rationalize)
_LOCAL = {c: sympy.Symbol(c) for c in "abcdefghjklmnopqrstuvwxyzABCDEFGHJKLMNOPQRSTUVWXYZ"}
_LOCAL.update(
    pi=sympy.pi, I=sympy.I, oo=sympy.oo, sqrt=sympy.sqrt, root=sympy.root, sin=sympy.sin, cos=sympy.cos,
    tan=sympy.tan, cot=sympy.cot, sec=sympy.sec, csc=sympy.csc, log=sympy.log, ln=sympy.log,
)


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
            mapping = {"pi": " pi ", "infty": " oo ", "cdot": "*", "times": "*", "cot": " cot ", "sin": " sin ",
                       "cos": " cos ", "tan": " tan ", "ln": " ln ", "log": " log "}
            if name not in mapping:
                raise Unreadable(f"\\{name}")
            out.append(mapping[name])
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
    for a, b in (("√", "\\sqrt"), ("π", "\\pi"), ("−", "-"), ("·", "*"), ("²", "^2"), ("³", "^3"), ("∞", "\\infty")):
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
    return [{s: sympy.Rational(_RNG_POINTS.randint(-97, 97) or 1, _RNG_POINTS.randint(1, 13)) + sympy.Rational(1, 7) for s in symbols}
            for _ in range(n)]


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


# --------------------------------------------------------------------------- writing
def ascii_form(e: sympy.Expr, implicit: bool = False) -> str:
    """ "3*sqrt(13)", "6 - 5*i", "x^2 + 1" (implicit: "3sqrt(13)", "15x - 80")."""
    s = sympy.sstr(e).replace("**", "^")
    s = re.sub(r"\bI\b", "i", s)
    if implicit:
        s = re.sub(r"(?<=\d)\*(?=[A-Za-z(])", "", s)
    return s


def unicode_form(e: sympy.Expr) -> str:
    s = ascii_form(e, implicit=True)
    s = re.sub(r"sqrt\((\d+)\)", r"√\1", s)
    s = s.replace("pi", "π").replace("^2", "²").replace("^3", "³").replace("*", "·")
    return s


def latex_form(e: sympy.Expr) -> str:
    return sympy.latex(e).replace("i", "i") if not e.has(sympy.I) else sympy.latex(e).replace(" i", "i")


def decimal_form(e: sympy.Expr) -> str | None:
    """The exact decimal of a terminating rational, else None."""
    if not e.is_Rational or e.is_Integer:
        return None
    q = int(e.q)
    while q % 2 == 0:
        q //= 2
    while q % 5 == 0:
        q //= 5
    if q != 1:
        return None
    digits = 0
    while (e * 10**digits).is_Integer is False:
        digits += 1
    text = f"{float(e):.{digits}f}" if digits < 15 else None
    return text


def mixed_form(e: sympy.Expr, latex: bool) -> str | None:
    if not e.is_Rational or e.is_Integer or abs(e) < 1:
        return None
    whole = int(abs(e.p) // e.q)
    rest = abs(e) - whole
    sign = "-" if e < 0 else ""
    return f"{sign}{whole}\\frac{{{rest.p}}}{{{rest.q}}}" if latex else f"{sign}{whole} {rest.p}/{rest.q}"


def rounded_form(e: sympy.Expr, rng: random.Random) -> str | None:
    """A rounded decimal of an irrational constant (a near-miss for an exact gold)."""
    if e.free_symbols or e.is_Rational or e.has(sympy.I):
        return None
    try:
        v = float(sympy.N(e, 30))
    except (TypeError, ValueError):
        return None
    return f"{v:.{rng.choice([2, 3, 4])}f}"


# --------------------------------------------------------------------------- answer types
def answer_type(gold: str, value: Value) -> str:
    if value.kind in ("text", "mcq", "base", "tuple", "list", "interval", "matrix", "equation"):
        return {"list": "list/set", "matrix": "matrix/vector"}.get(value.kind, value.kind)
    e = value.items[0]
    if "\\circ" in gold or "degrees" in gold:
        return "degrees"
    if re.search(r"\\\$|\\mbox|\\text\{\s*[a-z]", gold):
        return "units"
    if e.free_symbols:
        return "expression"
    if e.has(sympy.I):
        return "complex"
    if e.is_Integer:
        return "integer"
    if e.is_Rational:
        return "decimal" if "." in gold else "fraction"
    return "irrational"


# --------------------------------------------------------------------------- transforms
@dataclass
class Answer:
    """An answer text to put in a response, its style (latex / ascii / text) and its candidates."""

    text: str
    style: str
    label: int
    transform: str
    candidates: list[str] = field(default_factory=list)  # hedges: each committed value's text
    shape: str = ""  # a fixed response shape (hedges with boxes), else chosen later


def _scalar_rewrites(gold: str, e: sympy.Expr, gtype: str, rng: random.Random) -> list[Answer]:
    out = [Answer(gold, "latex", 1, "identity")]
    if gtype in ("degrees", "units"):
        num = latex_form(e)
        if gtype == "degrees":
            out += [Answer(f"{ascii_form(e)}°", "ascii", 1, "degree-sign"), Answer(f"{num}^{{\\circ}}", "latex", 1, "degree-braced"),
                    Answer(f"{ascii_form(e)} degrees", "ascii", 1, "degree-word"), Answer(num, "latex", 1, "degree-bare"),
                    Answer(f"{num}\\text{{ degrees}}", "latex", 1, "degree-text")]
        else:
            out += [Answer(num, "latex", 1, "unit-dropped")]
        return out
    lf = latex_form(e)
    if lf.replace(" ", "") != gold.replace(" ", ""):
        out.append(Answer(lf, "latex", 1, "latex-respelled"))
    out.append(Answer(ascii_form(e), "ascii", 1, "ascii"))
    if ascii_form(e, implicit=True) != ascii_form(e):
        out.append(Answer(ascii_form(e, implicit=True), "ascii", 1, "ascii-implicit"))
    if e.has(sympy.I):
        out.append(Answer(latex_form(e).replace("i", "\\mathrm{i}"), "latex", 1, "upright-i"))
        out.append(Answer(ascii_form(e).replace("*i", " i"), "ascii", 1, "spaced-i"))
    if re.search(r"sqrt|pi|\^[23]", ascii_form(e)):
        out.append(Answer(unicode_form(e), "ascii", 1, "unicode"))
    if "\\frac" in gold:
        out.append(Answer(gold.replace("\\frac", "\\dfrac"), "latex", 1, "dfrac"))
    dec = decimal_form(e)
    if dec:
        out.append(Answer(dec, "ascii", 1, "decimal"))
    if e.is_Rational and not e.is_Integer and "." in gold:
        out.append(Answer(f"\\frac{{{e.p}}}{{{e.q}}}", "latex", 1, "fraction-of-decimal"))
    mixed = mixed_form(e, latex=True)
    if mixed and "." not in gold:
        out.append(Answer(mixed, "latex", 1, "mixed-number"))
    if e.is_Integer and rng.random() < 0.3:
        out.append(Answer(f"{int(e)}.0", "ascii", 1, "integer-as-decimal"))
    if e.is_Rational and e < 0:
        out.append(Answer(ascii_form(e).replace("-", "−"), "ascii", 1, "unicode-minus"))
    if dec and rng.random() < 0.5:
        out.append(Answer(dec + "0", "ascii", 1, "trailing-zero"))
    if e.is_Rational and not e.is_Integer and abs(e.p) < 10 and e.q < 10 and "\\frac" in gold:
        out.append(Answer(f"{'-' if e < 0 else ''}\\frac{abs(e.p)}{e.q}", "latex", 1, "frac-shorthand"))
    if e.is_Integer and abs(e) >= 1000:
        n = f"{int(e):,}"
        out += [Answer(n, "ascii", 1, "thousands-comma"), Answer(n.replace(",", "\\,"), "latex", 1, "thousands-thin"),
                Answer(n.replace(",", "{,}"), "latex", 1, "thousands-brace")]
    if not e.free_symbols:
        out.append(Answer(f"x = {lf}", "latex", 1, "label"))
        if not e.is_Rational and not e.has(sympy.I) or (e.is_Rational and not e.is_Integer and decimal_form(e) is None):
            approx = rounded_form(e, rng) if not e.is_Rational else f"{float(e):.3f}"
            if approx:
                out.append(Answer(f"{gold} \\approx {approx}", "latex", 1, "approx-gloss", [gold]))
    alt = dec or (ascii_form(e) if ascii_form(e) != gold else None)
    if alt:
        out.append(Answer(alt, "ascii", 1, "box-twice", [gold], shape="box-twice"))
        out.append(Answer(alt, "ascii", 1, "box-and-line", [gold], shape="box-and-line"))
    if e.free_symbols and e.is_polynomial():
        expanded, factored = sympy.expand(e), sympy.factor(e)
        if expanded != e:
            out.append(Answer(latex_form(expanded), "latex", 1, "expanded"))
        if factored != e and factored != expanded:
            out.append(Answer(latex_form(factored), "latex", 1, "factored"))
    if e.is_Add and len(e.args) >= 2:
        terms = list(e.as_ordered_terms())[::-1]
        text = " + ".join(latex_form(t) for t in terms).replace("+ -", "- ")
        out.append(Answer(text, "latex", 1, "reordered"))
    return out


def _shift_digit(n: int, rng: random.Random) -> int:
    s = str(abs(n))
    if len(s) < 2:
        return n + 2
    i = rng.randrange(len(s) - 1)
    t = s[:i] + s[i + 1] + s[i] + s[i + 2 :]
    return (-1 if n < 0 else 1) * int(t)


def _scalar_wrongs(gold: str, e: sympy.Expr, gtype: str, rng: random.Random) -> list[Answer]:
    out: list[Answer] = []
    style = "latex"

    def put(value, transform, ascii_too=True):
        if ascii_too and rng.random() < 0.35:
            out.append(Answer(ascii_form(value, implicit=rng.random() < 0.5), "ascii", 0, transform))
        else:
            out.append(Answer(latex_form(value), style, 0, transform))

    if gtype == "degrees":
        out += [Answer(f"{ascii_form(e + 1)}°", "ascii", 0, "off-by-one"), Answer(f"{latex_form(180 - e)}^\\circ", "latex", 0, "supplement")]
        return [a for a in out if not (gtype == "degrees" and e == 90 and a.transform == "supplement")]
    if e.free_symbols:
        terms = list(sympy.Add.make_args(sympy.expand(e)))
        if len(terms) >= 2:
            k = rng.randrange(len(terms))
            put(sympy.expand(e) - 2 * terms[k], "term-sign")
            put(sympy.expand(e) - terms[k], "term-dropped")
        put(e + 1, "off-by-one")
        put(2 * e, "double")
        sym = sorted(e.free_symbols, key=str)[0]
        if e.is_polynomial() and sympy.degree(e, sym) >= 2:
            put(sympy.expand(e.subs(sym, sym) + sym ** (sympy.degree(e, sym) + 1) - sym ** sympy.degree(e, sym) * 0), "degree-term")
        return out
    if e.is_Integer:
        put(e + rng.choice([1, -1]), "off-by-one")
        if e != 0:
            put(-e, "sign")
            put(2 * e, "double")
        if abs(e) >= 10:
            swapped = _shift_digit(int(e), rng)
            if swapped != e:
                put(sympy.Integer(swapped), "digit-swap")
        if e % 2 == 0 and e != 0:
            put(e / 2, "half")
        return out
    if e.is_Rational:
        put(sympy.Rational(e.p + 1, e.q), "numerator-off")
        put(1 / e, "reciprocal")
        if e != 0:
            put(-e, "sign")
        put(2 * e, "double")
        dec = decimal_form(e)
        if dec is None:
            out.append(Answer(f"{float(e):.{rng.choice([2, 3])}f}", "ascii", 0, "rounded"))
        else:
            out.append(Answer(dec[:-1] + str((int(dec[-1]) + 1) % 10), "ascii", 0, "last-digit"))
        return out
    # irrational or complex constants
    if e.has(sympy.I):
        put(sympy.conjugate(e), "conjugate")
        put(e + 1, "off-by-one")
        return out
    r = rounded_form(e, rng)
    if r:
        out.append(Answer(r, "ascii", 0, "rounded"))
    put(2 * e, "double")
    put(e / 2, "half")
    if e != 0:
        put(-e, "sign")
    if e.has(sympy.pi):
        put(e.subs(sympy.pi, 1), "pi-dropped", ascii_too=False)
    roots = [p for p in e.atoms(sympy.Pow) if p.exp == sympy.Rational(1, 2)]
    if roots:
        root = roots[0]
        put(e.subs(root, root.base), "root-dropped")
        put(e.subs(root, sympy.sqrt(root.base + 1)), "radicand-off")
    return out


def _structured_rewrites(gold: str, value: Value, rng: random.Random) -> tuple[list[Answer], list[Answer]]:
    eq, wrong = [Answer(gold, "latex", 1, "identity")], []
    if value.kind == "tuple":
        items = list(value.items)
        eq.append(Answer("(" + ", ".join(latex_form(x) for x in items) + ")", "latex", 1, "latex-respelled"))
        eq.append(Answer("(" + ", ".join(ascii_form(x) for x in items) + ")", "ascii", 1, "ascii"))
        if len(set(items)) > 1:
            swapped = items[::-1] if len(items) == 2 else items[1:] + items[:1]
            wrong.append(Answer("(" + ", ".join(latex_form(x) for x in swapped) + ")", "latex", 0, "swapped"))
        k = rng.randrange(len(items))
        changed = items[:k] + [items[k] + 1] + items[k + 1 :]
        wrong.append(Answer("(" + ", ".join(latex_form(x) for x in changed) + ")", "latex", 0, "element-off"))
        wrong.append(Answer("(" + ", ".join(latex_form(x) for x in items[:-1]) + ")", "latex", 0, "element-dropped"))
    elif value.kind == "list":
        items = list(value.items)
        perm = items[:]
        while len(set(map(str, items))) > 1 and perm == items:
            rng.shuffle(perm)
        eq.append(Answer(", ".join(latex_form(x) for x in perm), "latex", 1, "permuted"))
        if len(items) >= 2:
            words = ", ".join(ascii_form(x) for x in perm[:-1]) + (", and " if len(items) > 2 else " and ") + ascii_form(perm[-1])
            eq.append(Answer(words, "ascii", 1, "and-list"))
            eq.append(Answer("\\{" + ", ".join(latex_form(x) for x in items) + "\\}", "latex", 1, "set-braces"))
            eq.append(Answer(" or ".join(f"x = {latex_form(x)}" for x in items), "latex", 1, "labelled-or"))
            eq.append(Answer("; ".join(latex_form(x) for x in perm), "latex", 1, "semicolons"))
            eq.append(Answer(", ".join(ascii_form(x) for x in perm[:-1]) + " and " + ascii_form(perm[-1]), "ascii", 1, "and-no-comma"))
        wrong.append(Answer(", ".join(latex_form(x) for x in items[:-1]), "latex", 0, "element-dropped"))
        k = rng.randrange(len(items))
        wrong.append(Answer(", ".join(latex_form(x + 1 if j == k else x) for j, x in enumerate(items)), "latex", 0, "element-off"))
        extra = next(items[0] + k for k in range(2, 40) if all(scalars_equal(items[0] + k, x) is False for x in items))
        wrong.append(Answer(", ".join(latex_form(x) for x in items + [extra]), "latex", 0, "element-added"))
    elif value.kind == "interval":
        pieces = list(value.items)

        def show(ps, inf="\\infty"):
            def f(x):
                return latex_form(x).replace("\\infty", inf)

            return " \\cup ".join(f"{l}{f(lo)}, {f(hi)}{r}" for l, lo, hi, r in ps)

        eq.append(Answer(show(pieces), "latex", 1, "latex-respelled"))
        eq.append(Answer(f"x \\in {show(pieces)}", "latex", 1, "interval-membership"))
        if any(p[1].has(sympy.oo) or p[2].has(sympy.oo) for p in pieces):
            eq.append(Answer(show(pieces, "∞"), "latex", 1, "unicode-infinity"))
        if len(pieces) == 1:
            l, lo, hi, r = pieces[0]
            lt_l, lt_r = ("<" if l == "(" else "\\le"), ("<" if r == ")" else "\\le")
            gt_l = ">" if l == "(" else "\\ge"
            if lo == -sympy.oo:
                eq.append(Answer(f"x {lt_r} {latex_form(hi)}", "latex", 1, "inequality"))
            elif hi == sympy.oo:
                eq.append(Answer(f"x {gt_l} {latex_form(lo)}", "latex", 1, "inequality"))
            else:
                eq.append(Answer(f"{latex_form(lo)} {lt_l} x {lt_r} {latex_form(hi)}", "latex", 1, "inequality"))
        k = rng.randrange(len(pieces))
        l, lo, hi, r = pieces[k]
        if not lo.has(sympy.oo):
            flipped = pieces[:k] + [("[" if l == "(" else "(", lo, hi, r)] + pieces[k + 1 :]
            wrong.append(Answer(show(flipped), "latex", 0, "bracket-flipped"))
        elif not hi.has(sympy.oo):
            flipped = pieces[:k] + [(l, lo, hi, "]" if r == ")" else ")")] + pieces[k + 1 :]
            wrong.append(Answer(show(flipped), "latex", 0, "bracket-flipped"))
        end = hi if not hi.has(sympy.oo) else lo
        moved = [(a, b if b != end else b + 1, c if c != end else c + 1, d) for a, b, c, d in pieces]
        wrong.append(Answer(show(moved), "latex", 0, "endpoint-off"))
        if len(pieces) > 1:
            wrong.append(Answer(show(pieces[:-1]), "latex", 0, "piece-dropped"))
    elif value.kind == "matrix":
        rows = [list(r) for r in value.items]

        def mat(rs, env="pmatrix"):
            return f"\\begin{{{env}}} " + " \\\\ ".join(" & ".join(latex_form(x) for x in r) for r in rs) + f" \\end{{{env}}}"

        eq.append(Answer(mat(rows, "bmatrix"), "latex", 1, "bmatrix"))
        eq.append(Answer(mat(rows), "latex", 1, "latex-respelled"))
        if all(len(r) == 1 for r in rows):
            eq.append(Answer("(" + ", ".join(latex_form(r[0]) for r in rows) + ")", "latex", 1, "vector-as-tuple"))
        i = rng.randrange(len(rows))
        j = rng.randrange(len(rows[0]))
        changed = [r[:] for r in rows]
        changed[i][j] = changed[i][j] + 1
        wrong.append(Answer(mat(changed), "latex", 0, "element-off"))
        flat = [x for r in rows for x in r]
        if len(set(flat)) > 1:
            negated = [[-x if (a, b) == (i, j) and x != 0 else x for b, x in enumerate(r)] for a, r in enumerate(rows)]
            if negated != rows:
                wrong.append(Answer(mat(negated), "latex", 0, "sign"))
    elif value.kind == "equation":
        d = value.items[0]
        lhs, rhs = gold.split("=", 1)
        eq.append(Answer(f"{rhs.strip()} = {lhs.strip()}", "latex", 1, "sides-swapped"))
        scaled = sympy.expand(2 * d)
        eq.append(Answer(f"{latex_form(scaled)} = 0", "latex", 1, "scaled"))
        terms = list(sympy.Add.make_args(sympy.expand(d)))
        k = rng.randrange(len(terms))
        wrong.append(Answer(f"{latex_form(sympy.expand(d - 2 * terms[k]))} = 0", "latex", 0, "term-sign"))
        wrong.append(Answer(f"{latex_form(sympy.expand(d + 1))} = 0", "latex", 0, "constant-off"))
    elif value.kind in ("text", "mcq"):
        word = value.text
        if value.kind == "mcq":
            eq += [Answer(word, "text", 1, "mcq-letter"), Answer(f"({word})", "text", 1, "mcq-parens"),
                   Answer(f"\\text{{{word}}}", "latex", 1, "mcq-text")]
            other = rng.choice([c for c in "ABCDE" if c != word])
            wrong += [Answer(f"({other})", "text", 0, "mcq-other"), Answer(f"{word} or {other}", "text", 0, "hedge-or"),
                      Answer(", ".join(sorted({word, other, rng.choice('ABCDE')})), "text", 0, "hedge-list")]
        else:
            plain = re.sub(r"\\text\{([^{}]*)\}", r"\1", gold)
            eq += [Answer(plain, "text", 1, "text-plain"), Answer(plain.lower(), "text", 1, "text-case"),
                   Answer(f"\\textbf{{{plain.capitalize()}}}", "latex", 1, "text-bold")]
    elif value.kind == "base":
        digits, base = value.text.split("_")
        eq.append(Answer(f"{digits}_{{{base}}}", "latex", 1, "base-braced"))
        wrong.append(Answer(f"{int(digits) + 1 if not str(int(digits) + 1).endswith(base) else int(digits) - 1}_{{{base}}}", "latex", 0, "off-by-one"))
    return eq, wrong


def _same_style(gold: str, w: Answer, rng: random.Random) -> tuple[str, str]:
    """The gold and a wrong answer written alike: both in $...$, or both plain ASCII."""
    if w.style == "ascii":
        try:
            g = read_value(gold)
            if g.kind == "scalar" and "\\" not in ascii_form(g.items[0]):
                return ascii_form(g.items[0], implicit=rng.random() < 0.5), w.text
        except Exception:  # noqa: BLE001 - fall back to LaTeX
            pass
        try:
            w_value = read_value(w.text)
            if w_value.kind == "scalar":
                return f"${gold}$", f"${latex_form(w_value.items[0])}$"
        except Exception:  # noqa: BLE001
            pass
    return f"${gold}$", f"${w.text}$"


def _hedges(gold: str, value: Value, gtype: str, wrong: list[Answer], rng: random.Random) -> list[Answer]:
    """Hedges of a single-valued gold: the gold beside a wrong value (wrong by the hedge rule)."""
    wrong = [w for w in wrong if not w.candidates and not w.shape]
    if value.kind in ("list", "text", "mcq") or not wrong:
        return []
    w = rng.choice(wrong)
    g_text, w_text = _same_style(gold, w, rng)
    a, b = (g_text, w_text) if rng.random() < 0.5 else (w_text, g_text)
    out = [
        Answer(f"{a} or {b}", "mixed", 0, "hedge-or", [gold, w.text]),
        Answer(f"either {a} or {b}", "mixed", 0, "hedge-either", [gold, w.text]),
        Answer(f"\\boxed{{{w.text}}}", "latex", 0, "hedge-two-boxes", [gold, w.text], shape="two-boxes"),
        Answer(w.text, "latex", 0, "box-then-wrong-line", [gold, w.text], shape="box-then-wrong-line"),
        Answer(f"{gold} \\text{{ or }} {w.text}", "latex", 0, "hedge-text-or", [gold, w.text]),
    ]
    if value.kind == "scalar" and not value.items[0].free_symbols:
        w2 = rng.choice(wrong)
        if w2.text != w.text:
            items = [gold, w.text, w2.text]
            rng.shuffle(items)
            out.append(Answer(", ".join(items), "latex", 0, "hedge-list", items))
        if value.items[0] != 0 and gtype not in ("degrees", "units"):
            out.append(Answer(f"\\pm {latex_form(value.items[0])}", "latex", 0, "hedge-pm", [gold, latex_form(-value.items[0])]))
        out.append(Answer(f"x = {gold} \\text{{ or }} x = {w.text}", "latex", 0, "hedge-labelled", [gold, w.text]))
    return out


def _traps(gold: str, value: Value, gtype: str, wrong: list[Answer], rng: random.Random) -> list[Answer]:
    """Wrong answers whose last number is the gold, and a gold named before a wrong final answer."""
    out = []
    if gtype == "integer" and value.items[0] > 0:
        g = value.items[0]
        for text, style in ((f"2*pi + {g}", "ascii"), (f"{g}\\sqrt{{2}}", "latex"), (f"15x - {g}", "ascii"),
                            (f"\\frac{{1}}{{{g}}}", "latex"), (f"{g}^2", "ascii"), (f"2^{{{g}}}", "latex")):
            if text not in ("1^2", "2^{1}") and not (text.startswith("2^") and g > 60):  # no 2^{10^{10}}
                out.append(Answer(text, style, 0, "last-number", [text.replace("*", "")]))
    if wrong:
        w = rng.choice([w for w in wrong if not w.candidates] or wrong)
        out.append(Answer(w.text, w.style, 0, "intermediate-gold", shape="intermediate"))
    return out


# --------------------------------------------------------------------------- responses
_LEADS = [
    "Let's solve this step by step.",
    "We start from the given conditions.",
    "First, let me restate what is asked.",
    "I'll work through the problem carefully.",
]
_MIDDLES = [
    "Substituting, we get {a} + {b} = {c}, and then {c} \\cdot 2 = {d}.",
    "Note that $ {a} \\times {b} = {ab} $, so the next step uses {c}.",
    "Checking the case n = {a}: it gives {b}, which is too small.",
    "From step {a}, the remaining quantity is {c} - {b} = {cb}.",
]
_SHAPES = ("boxed", "boxed-display", "answer-line", "answer-bold", "sentence", "final-sentence", "conclusion",
           "header", "bold-sentence", "answer-caps", "answer-colon")


def _lead(rng: random.Random) -> str:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    c = a + b
    middle = rng.choice(_MIDDLES).format(a=a, b=b, c=c, d=2 * c, ab=a * b, cb=c - b)
    return f"{rng.choice(_LEADS)} {middle}"


def _math(text: str, style: str, rng: random.Random | None = None) -> str:
    """Inline math: $...$, or \\(...\\) now and then."""
    if style != "latex":
        return text
    return f"\\({text}\\)" if rng is not None and rng.random() < 0.2 else f"${text}$"


_TAILS = ["", "", "", " This completes the solution.", " Let me know if you need anything else!", "\n\nI hope this helps."]


def write_response(ans: Answer, gold: str, rng: random.Random) -> tuple[str, str]:
    """(response text, shape) for an answer."""
    lead = _lead(rng)
    if ans.shape == "two-boxes":
        w = ans.candidates[1]
        first, second = (w, gold) if rng.random() < 0.5 else (gold, w)
        return f"{lead} This gives $\\boxed{{{first}}}$. Let me double-check with another method.\n\nSo the answer is $\\boxed{{{second}}}$.", "two-boxes"
    if ans.shape == "box-then-wrong-line":
        return f"{lead}\n\nThe final answer is $\\boxed{{{gold}}}$.\n\nAnswer: {ans.text}", "box-then-wrong-line"
    if ans.shape == "box-twice":  # the same value boxed twice, in two forms: no hedge
        first = ans.candidates[0]
        return f"{lead} So far this gives $\\boxed{{{first}}}$.\n\nSimplifying, the final answer is $\\boxed{{{ans.text}}}$.", "box-twice"
    if ans.shape == "box-and-line":  # a box and an "Answer:" line with the same value
        return f"{lead}\n\nThe final answer is $\\boxed{{{ans.candidates[0]}}}$.\n\nAnswer: {ans.text}", "box-and-line"
    if ans.shape == "intermediate":
        return f"{lead} Along the way we found the value {_math(gold, 'latex')}, but that is not what is asked.\n\nAnswer: {ans.text}", "intermediate"
    if ans.style in ("text", "mixed"):
        shapes = ["answer-line", "sentence", "answer-bold"] if ans.style == "mixed" else ["answer-line", "sentence", "boxed"]
    elif ans.style == "ascii":
        shapes = ["answer-line", "answer-bold", "sentence", "conclusion", "bold-sentence", "answer-caps", "answer-colon"]
    else:
        shapes = list(_SHAPES)
    shape = rng.choice(shapes)
    a = ans.text
    if shape == "boxed":
        body = f"The final answer is $\\boxed{{{a}}}$." if ans.style != "text" else f"So the answer is $\\boxed{{\\text{{{a}}}}}$."
    elif shape == "boxed-display":
        body = f"**Final Answer**\n\\[\n\\boxed{{{a}}}\n\\]" if rng.random() < 0.7 else f"$$\\boxed{{{a}}}$$"
    elif shape == "answer-line":
        body = f"Answer: {_math(a, ans.style, rng) if rng.random() < 0.5 else a}"
        if ans.label == 1 and rng.random() < 0.15:
            body += rng.choice([" (as required)", ", as computed above.", " (this satisfies every condition)"])
    elif shape == "answer-bold":
        body = f"**Answer:** {_math(a, ans.style, rng)}"
    elif shape == "sentence":
        body = f"Therefore, the answer is {_math(a, ans.style, rng)}."
    elif shape == "final-sentence":
        body = f"The final answer is {_math(a, ans.style, rng)}. I hope it is correct."
    elif shape == "conclusion":
        body = f"Thus, the value we are looking for is {_math(a, ans.style, rng)}."
    elif shape == "header":
        body = f"### Final Answer\n\n$\\boxed{{{a}}}$"
    elif shape == "bold-sentence":
        body = f"So the answer is **{_math(a, ans.style, rng)}**."
    elif shape == "answer-caps":
        body = f"ANSWER: {a}"
    else:
        body = f"The final answer is: {_math(a, ans.style, rng)}"
    tail = rng.choice(_TAILS) if shape not in ("answer-line", "answer-caps", "answer-bold", "answer-colon") else ""
    return f"{lead}\n\n{body}{tail}", shape


# --------------------------------------------------------------------------- labels
def _prove(ans: Answer, gold_value: Value) -> bool | None:
    """Whether the written answer is proved to carry its label (None: unprovable, dropped)."""
    texts = ans.candidates or [ans.text]
    if ans.label == 1 and ans.candidates and ans.transform != "approx-gloss":
        texts = ans.candidates + [ans.text]  # a value written twice: both forms proved
    verdicts = []
    for text in texts:
        try:
            v = read_value(text)
        except Unreadable:
            return None
        except Exception:  # noqa: BLE001 - a sympy failure while reading: unprovable
            return None
        verdicts.append(values_equal(gold_value, v))
    if ans.label == 1:
        return all(v is True for v in verdicts) or None
    if ans.candidates and len(ans.candidates) > 1:  # a hedge: one candidate proved different
        return (any(v is False for v in verdicts) and any(v is True for v in verdicts)) or None
    return all(v is False for v in verdicts) or None


def _distinct(answers: list[Answer]) -> list[Answer]:
    """One answer per written text (an integer's ASCII form is its LaTeX form)."""
    seen, out = set(), []
    for a in answers:
        key = (a.text.replace(" ", ""), a.shape)
        if key not in seen:
            seen.add(key)
            out.append(a)
    return out


def split_of(unique_id: str) -> str:
    return "dev" if int(hashlib.sha256(unique_id.encode()).hexdigest(), 16) % 2 == 0 else "heldout"


def generate(seed: int = 0, golds_path: Path = GOLDS_PATH, limit: int | None = None, per_label: int = 5) -> tuple[list[dict], dict]:
    """Cases (dicts: split, type, transform, shape, label, gold, response) and drop counts."""
    rows = [json.loads(line) for line in golds_path.open()]
    if limit:
        rows = rows[:limit]
    pool_text = sorted({r["answer"] for r in rows if re.fullmatch(r"\\text\{[A-Za-z ]+\}", r["answer"])})
    cases, drops = [], {"unreadable gold": 0, "unprovable": 0}
    for row in rows:
        gold = row["answer"]
        rng = random.Random(f"{seed}:{row['unique_id']}")
        try:
            value = read_value(gold)
        except Exception:  # noqa: BLE001 - a gold this reader does not understand
            drops["unreadable gold"] += 1
            continue
        gtype = answer_type(gold, value)
        if value.kind == "scalar":
            e = value.items[0]
            eq, wrong = _scalar_rewrites(gold, e, gtype, rng), _scalar_wrongs(gold, e, gtype, rng)
        else:
            eq, wrong = _structured_rewrites(gold, value, rng)
        if value.kind == "text":
            others = [t for t in pool_text if read_value(t).text != value.text]
            if others:
                wrong.append(Answer(re.sub(r"\\text\{([^{}]*)\}", r"\1", rng.choice(others)), "text", 0, "text-other"))
            plain = re.sub(r"\\text\{([^{}]*)\}", r"\1", gold)
            wrong.append(Answer(f"{plain} and Bob", "text", 0, "text-extended"))
        wrong = wrong + _hedges(gold, value, gtype, wrong, rng) + _traps(gold, value, gtype, wrong, rng)
        eq, wrong = _distinct(eq), _distinct(wrong)
        chosen = rng.sample(eq, min(per_label, len(eq))) + rng.sample(wrong, min(per_label, len(wrong)))
        for ans in chosen:
            proved = _prove(ans, value)
            if proved is not True:
                drops["unprovable"] += 1
                continue
            response, shape = write_response(ans, gold, rng)
            cases.append({
                "split": split_of(row["unique_id"]), "type": gtype, "transform": ans.transform, "shape": shape,
                "label": ans.label, "gold": gold, "response": response, "id": row["unique_id"],
            })
    return cases, drops
