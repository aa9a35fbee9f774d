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
into the response is read back by the generator's own reader (``verifier_reader.py``:
LaTeX -> sympy through `parse_expr`, nothing from `megatron_dapo.reward`), then an
equivalent must be exactly equal to the gold (sympy ``simplify`` of the difference is 0,
and it vanishes at 50 digits at random points) and a wrong answer must differ from it (the
difference is nonzero at 50 digits at some random point; a hedge has a candidate that
differs from a single-valued gold). A case whose label cannot be proved is dropped, and
counted. ``read_value`` and ``values_equal`` are the reader's, imported here.

Cases are split by problem: ``split`` is ``dev`` or ``heldout`` from a hash of the
problem's ``unique_id``, so rewrites of one gold never straddle the halves.

The templates (the answer rewrites, hedges and traps that are fixed texts, the response
shapes, leads and tails) are data: ``data/verifier/case_templates.json``, filled here.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

import sympy
from verifier_reader import TEMPLATES_PATH, Unreadable, Value, read_value, scalars_equal, values_equal

ROOT = Path(__file__).resolve().parents[1]
GOLDS_PATH = ROOT / "tests" / "data" / "eval" / "math500.jsonl"
# The templates (answer rewrites, hedges, traps, response shapes): data, read once; this module
# holds the logic that fills them. Reading answers and proving labels: verifier_reader.py.
_DATA = json.loads(TEMPLATES_PATH.read_text(encoding="utf-8"))
_ANSWERS, _RESPONSES = _DATA["answers"], _DATA["responses"]


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


def _fill(template: dict, candidates: list[str] | None = None, **fields) -> Answer:
    """The answer of a template of case_templates.json, its text filled with `fields`."""
    text, shape = template["text"].format(**fields), template.get("shape", "")
    return Answer(text, template["style"], template["label"], template["transform"], candidates or [], shape)


def _scalar_rewrites(gold: str, e: sympy.Expr, gtype: str, rng: random.Random) -> list[Answer]:
    out = [Answer(gold, "latex", 1, "identity")]
    if gtype in ("degrees", "units"):
        return out + [_fill(t, ascii=ascii_form(e), latex=latex_form(e)) for t in _ANSWERS[gtype]]
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
        out += [Answer(n.replace(",", t["separator"]), t["style"], 1, t["transform"]) for t in _ANSWERS["thousands"]]
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
        out += [
            Answer(f"{ascii_form(e + 1)}°", "ascii", 0, "off-by-one"),
            Answer(f"{latex_form(180 - e)}^\\circ", "latex", 0, "supplement"),
        ]
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
            put(
                sympy.expand(e.subs(sym, sym) + sym ** (sympy.degree(e, sym) + 1) - sym ** sympy.degree(e, sym) * 0),
                "degree-term",
            )
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
            words = (
                ", ".join(ascii_form(x) for x in perm[:-1])
                + (", and " if len(items) > 2 else " and ")
                + ascii_form(perm[-1])
            )
            eq.append(Answer(words, "ascii", 1, "and-list"))
            eq.append(Answer("\\{" + ", ".join(latex_form(x) for x in items) + "\\}", "latex", 1, "set-braces"))
            eq.append(Answer(" or ".join(f"x = {latex_form(x)}" for x in items), "latex", 1, "labelled-or"))
            eq.append(Answer("; ".join(latex_form(x) for x in perm), "latex", 1, "semicolons"))
            eq.append(
                Answer(
                    ", ".join(ascii_form(x) for x in perm[:-1]) + " and " + ascii_form(perm[-1]),
                    "ascii",
                    1,
                    "and-no-comma",
                )
            )
        wrong.append(Answer(", ".join(latex_form(x) for x in items[:-1]), "latex", 0, "element-dropped"))
        k = rng.randrange(len(items))
        wrong.append(
            Answer(
                ", ".join(latex_form(x + 1 if j == k else x) for j, x in enumerate(items)), "latex", 0, "element-off"
            )
        )
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
            return (
                f"\\begin{{{env}}} "
                + " \\\\ ".join(" & ".join(latex_form(x) for x in r) for r in rs)
                + f" \\end{{{env}}}"
            )

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
            eq += [_fill(t, word=word) for t in _ANSWERS["mcq"]]
            other = rng.choice([c for c in "ABCDE" if c != word])
            trio = ", ".join(sorted({word, other, rng.choice("ABCDE")}))
            wrong += [_fill(t, word=word, other=other, trio=trio) for t in _ANSWERS["mcq_wrong"]]
        else:
            plain = re.sub(r"\\text\{([^{}]*)\}", r"\1", gold)
            eq += [_fill(t, plain=plain, lower=plain.lower(), title=plain.capitalize()) for t in _ANSWERS["text"]]
    elif value.kind == "base":
        digits, base = value.text.split("_")
        eq.append(Answer(f"{digits}_{{{base}}}", "latex", 1, "base-braced"))
        wrong.append(
            Answer(
                f"{int(digits) + 1 if not str(int(digits) + 1).endswith(base) else int(digits) - 1}_{{{base}}}",
                "latex",
                0,
                "off-by-one",
            )
        )
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
    out = [_fill(t, [gold, w.text], a=a, b=b, gold=gold, w=w.text) for t in _ANSWERS["hedges"]]
    if value.kind == "scalar" and not value.items[0].free_symbols:
        w2 = rng.choice(wrong)
        if w2.text != w.text:
            items = [gold, w.text, w2.text]
            rng.shuffle(items)
            out.append(Answer(", ".join(items), "latex", 0, "hedge-list", items))
        more = _ANSWERS["scalar_hedges"]
        if value.items[0] != 0 and gtype not in ("degrees", "units"):
            out.append(_fill(more["pm"], [gold, latex_form(-value.items[0])], pm=latex_form(value.items[0])))
        out.append(_fill(more["labelled"], [gold, w.text], gold=gold, w=w.text))
    return out


def _corrections(gold: str, value: Value, wrong: list[Answer], rng: random.Random) -> tuple[list[Answer], list[Answer]]:
    """Self-corrections in the open (the last committed answer counts): a wrong first answer
    corrected to the gold (label 1), and the gold "corrected" to a wrong value (label 0)."""
    wrong = [w for w in wrong if not w.candidates and not w.shape and w.style == "latex"]
    if value.kind in ("text", "mcq") or not wrong:
        return [], []
    w = rng.choice(wrong).text
    to_gold = Answer(gold, "latex", 1, "correction-to-gold", [w, gold], shape="correction")
    away = Answer(w, "latex", 0, "correction-away-from-gold", [gold, w], shape="correction")
    return [to_gold], [away]


def _traps(gold: str, value: Value, gtype: str, wrong: list[Answer], rng: random.Random) -> list[Answer]:
    """Wrong answers whose last number is the gold, and a gold named before a wrong final answer."""
    out = []
    if gtype == "integer" and value.items[0] > 0:
        g = value.items[0]
        for t in _ANSWERS["last_number"]:
            text = t["text"].format(g=g)
            if text not in ("1^2", "2^{1}") and not (text.startswith("2^") and g > 60):  # no 2^{10^{10}}
                out.append(_fill(t, [text.replace("*", "")], g=g))
    if wrong:
        w = rng.choice([w for w in wrong if not w.candidates] or wrong)
        out.append(Answer(w.text, w.style, 0, "intermediate-gold", shape="intermediate"))
    return out


# --------------------------------------------------------------------------- responses
def _lead(rng: random.Random) -> str:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    c = a + b
    middle = rng.choice(_RESPONSES["middles"]).format(a=a, b=b, c=c, d=2 * c, ab=a * b, cb=c - b)
    return f"{rng.choice(_RESPONSES['leads'])} {middle}"


def _math(text: str, style: str, rng: random.Random) -> str:
    """Inline math: $...$, or \\(...\\) now and then."""
    if style != "latex":
        return text
    return f"\\({text}\\)" if rng.random() < 0.2 else f"${text}$"


def write_response(ans: Answer, gold: str, rng: random.Random) -> tuple[str, str]:
    """(response text, shape) for an answer: a lead, then the answer in a shape of case_templates.json."""
    lead = _lead(rng)
    if ans.shape:  # a fixed shape: two boxes, a box then a wrong line, the same value twice, ...
        first, second = (ans.candidates + [gold, gold])[:2]
        shape = ans.shape
        if shape in ("boxes-or", "boxes-comma") and rng.random() < 0.5:
            first, second = second, first  # a hedge: either order is wrong
        if shape == "correction":  # a correction in the open: candidates in the order written
            shape = rng.choice([k for k in _RESPONSES["fixed"] if k.startswith("correction-")])
        text = _RESPONSES["fixed"][shape].format(lead=lead, gold=gold, text=ans.text, first=first, second=second)
        return text, shape
    shape = rng.choice(_RESPONSES["shapes_by_style"].get(ans.style, _RESPONSES["shapes"]))
    bodies = _RESPONSES["bodies"]
    body = bodies[shape]
    if shape == "boxed" and ans.style == "text":
        body = bodies["boxed/text"]
    elif shape == "boxed-display" and rng.random() >= 0.7:
        body = bodies["boxed-display/dollars"]
    elif shape == "answer-line" and rng.random() >= 0.5:
        body = bodies["answer-line/plain"]
    body = body.format(a=ans.text, m=_math(ans.text, ans.style, rng) if "{m}" in body else None)
    if shape == "answer-line" and ans.label == 1 and rng.random() < 0.15:
        body += rng.choice(_RESPONSES["answer_line_remarks"])
    tail = rng.choice(_RESPONSES["tails"]) if shape not in _RESPONSES["untailed"] else ""
    return f"{lead}\n\n{body}{tail}", shape


# --------------------------------------------------------------------------- labels
def _prove(ans: Answer, gold_value: Value) -> bool | None:
    """Whether the written answer is proved to carry its label (None: unprovable, dropped)."""
    if ans.shape == "correction":  # the first answer is superseded by the second
        try:
            first, second = (values_equal(gold_value, read_value(t)) for t in ans.candidates)
        except Exception:  # noqa: BLE001 - unreadable or a sympy failure: unprovable
            return None
        want = (False, True) if ans.label == 1 else (True, False)
        return (first, second) == want or None
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


def generate(
    seed: int = 0, golds_path: Path = GOLDS_PATH, limit: int | None = None, per_label: int = 5
) -> tuple[list[dict], dict]:
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
        fixed, broken = _corrections(gold, value, wrong, rng)
        wrong = wrong + _hedges(gold, value, gtype, wrong, rng) + _traps(gold, value, gtype, wrong, rng) + broken
        eq = eq + fixed
        eq, wrong = _distinct(eq), _distinct(wrong)
        chosen = rng.sample(eq, min(per_label, len(eq))) + rng.sample(wrong, min(per_label, len(wrong)))
        for ans in chosen:
            proved = _prove(ans, value)
            if proved is not True:
                drops["unprovable"] += 1
                continue
            response, shape = write_response(ans, gold, rng)
            cases.append(
                {
                    "split": split_of(row["unique_id"]),
                    "type": gtype,
                    "transform": ans.transform,
                    "shape": shape,
                    "label": ans.label,
                    "gold": gold,
                    "response": response,
                    "id": row["unique_id"],
                }
            )
    return cases, drops
