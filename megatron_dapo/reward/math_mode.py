"""Mode `math`: sympy-based answer equivalence that accepts what strict matching misses.

Pipeline: extract the final answer (`answer_reading.extract_final_answer`), clean
presentation LaTeX (`answer_cleanup.clean_answer`), split top-level lists and
"label = value" items (`answer_cleanup.split_top`, `answer_cleanup.split_label`), parse each
item (`latex.parse_latex`) and compare (`equiv.values_equal`). Anything the parser refuses
(unknown LaTeX) or that the guards reject (huge powers, 10^5-digit numbers, deep nesting)
falls back to exact comparison of the cleaned strings, so it can still be right when
identical and is never evaluated. Multiple-choice golds ("C", "(D) Alina") compare the
chosen letter (a letter inside a list of letters chose nothing). Short worded answers on
both sides compare as normalised strings. A side with a percent or degree sign is also read
as a fraction or in radians against a side without one, and a gold given to 2-3 decimals
also accepts an exact response that rounds to it (`_rounded_gold_equal`).
"""

from __future__ import annotations

import re

import sympy

from .answer_cleanup import clean_answer, split_label, split_top
from .answer_reading import Reading, extract_final_answer, read_answer
from .equiv import Labeled, _dedupe, _flatten, expand_pm, ratio_value, values_equal
from .latex import Seq, Text, parse_latex
from .result import RewardResult, check_ground_truth

_MCQ_GOLD = (
    re.compile(r"^\s*\(?([A-E])\)?\s*$"),
    re.compile(r"^\s*\(([A-E])\)\s+\S"),
    re.compile(r"^\s*([A-E])\s+[A-Z][a-z]"),
    re.compile(r"answer is\s*\(?([A-E])\)?(?:\s|$)", re.IGNORECASE),
)
_MCQ_PRED = (
    re.compile(r"(?i:answer)\s*(?:is|:)?\s*(?:[a-z]+\s+){0,3}?\(?([A-E])\)?(?![A-Za-z'])"),
    re.compile(r"^\s*\(?([A-E])\)?(?:[\s.,:)]|$)"),
    re.compile(r"\(([A-E])\)"),
    re.compile(r"(?<![A-Za-z'])([A-E])(?![A-Za-z'])"),
)


def mcq_gold_letter(gold: str) -> str | None:
    """The option letter of a multiple-choice gold ("C", "(D) Alina", "... answer is\\n(C) x")."""
    if "$" in gold or "\\" in gold:
        return None
    for pattern in _MCQ_GOLD:
        m = pattern.search(gold)
        if m:
            return m.group(1)
    return None


# Several option letters in a row ("C, B, D, E, A", "A or C", "(A) (B) (C)"): an enumeration.
_MCQ_ENUM = re.compile(
    r"\(?(?<![A-Za-z'])[A-E](?![A-Za-z'])\)?"
    r"(?:(?:\s*(?:[,;/&]|\b(?:or|and|maybe|perhaps)\b))*\s*\(?(?<![A-Za-z'])[A-E](?![A-Za-z'])\)?)+"
)


# Letters ruled out ("not A", "can't be A or B", "rule out (C)", "不是 A", "排除 A、B"): removed
# before the chosen letter is read. A letter list after the negation goes with it.
_LETTER = r"\(?(?<![A-Za-z'])[A-E](?![A-Za-z'])\)?"
_RULED_OUT = re.compile(
    r"(?:\b(?:not|never|isn't|is\s+not|can't|cannot|can\s+not|couldn't|won't|rule[sd]?\s+out|ruling\s+out|"
    r"eliminat\w*|exclud\w*|except|other\s+than|instead\s+of|rather\s+than)\b(?:\s+(?:be|option|choice|answer))*"
    r"|不是|排除|并非|而非|不选|除了)\s*"
    + _LETTER
    + r"(?:\s*(?:,|，|、|/|\bor\b|\band\b|\bnor\b|或|和|与)\s*"
    + _LETTER
    + r")*",
    re.IGNORECASE,
)


def mcq_pred_letter(pred: str) -> str | None:
    """The option letter a response chose, or None (also when it lists several options).

    A response whose chosen letter stands in a list of different letters ("C, B, D, E, A",
    "A or C") chose none of them: taking the first or last would reward naming every option.
    A letter named elsewhere in prose ("D, it can't be A or B") does not count against it.
    """
    text = re.sub(r"\\text\{\s*\(?([A-E])\)?\s*\}", r"\1", pred)
    text = _RULED_OUT.sub(" ", text)
    for k, pattern in enumerate(_MCQ_PRED):
        matches = list(pattern.finditer(text))
        if matches:
            chosen = matches[-1] if k != 1 else matches[0]
            at = chosen.start(1)
            for enum in _MCQ_ENUM.finditer(text):
                if enum.start() <= at < enum.end() and len(set(re.findall(r"[A-E]", enum.group()))) > 1:
                    return None
            return chosen.group(1)
    return None


def _parse_item(text: str):
    try:
        return parse_latex(text)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - ParseError, TooComplex or a sympy failure: keep it as text
        return Text(_string_key(text))


def _string_key(text: str) -> str:
    return re.sub(r"\s+|\\[,;!: ]|\{|\}", "", text)


def answer_value(text: str):
    """Parse a gold or predicted text into one comparable value (None: no answer found)."""
    parts, _source = extract_final_answer(text)
    items = []
    for part in parts:
        cleaned = clean_answer(part)
        for piece in split_top(cleaned):
            piece = piece.strip()
            if not piece:
                continue
            label, value_text, is_equation = split_label(piece)
            if not value_text.strip():
                continue
            value = _parse_item(piece if is_equation else value_text)
            items.append(Labeled(label, value) if label is not None else value)
    if not items:
        return None, parts
    if len(items) == 1:
        return _expand_tuple_label(items[0]), parts
    return Seq(tuple(items), "list"), parts


def _expand_tuple_label(item):
    """(g(n), h(n)) = (n^2, 3) -> the list g(n) = n^2, h(n) = 3 (compared in order with a tuple)."""
    if not (isinstance(item, Labeled) and isinstance(item.value, Seq) and item.value.kind == "tuple"):
        return item
    label = item.label.strip()
    if not (label.startswith("(") and label.endswith(")")):
        return item
    names = [n.strip() for n in split_top(label[1:-1])]
    if len(names) != len(item.value.items) or not all(names):
        return item
    return Seq(tuple(Labeled(n, v) for n, v in zip(names, item.value.items)), "list")


def _fallback_equal(gold: str, pred: str) -> bool:
    """Exact string comparison of the cleaned final answers."""
    g_parts, _ = extract_final_answer(gold)
    p_parts, _ = extract_final_answer(pred)
    g = _string_key(",".join(clean_answer(x) for x in g_parts))
    p = _string_key(",".join(clean_answer(x) for x in p_parts))
    return bool(g) and g == p


def math_equivalent(gold: str, pred: str) -> bool:
    """Whether `pred` (a bare answer or a whole response) is mathematically equivalent to `gold`.

    The answer of `pred` is read exactly as `math_score` reads a response (`read_answer`: its
    last committed answer), so the two entries never disagree on what a text answers.
    """
    check_ground_truth(gold)
    if not isinstance(pred, str) or not pred.strip():
        return False
    if gold.strip() == pred.strip():
        return True
    reading = read_answer(pred)
    return reading is not None and committed_equal(gold, reading, pred)


def _answer_equal(gold: str, pred: str, statement: str = "") -> bool:
    """One answer against the gold. ``statement``: the whole statement it was read from (the
    letter of a multiple-choice answer is read there: "the answer is D, not A or B")."""
    if gold.strip() == pred.strip():
        return True
    letter = mcq_gold_letter(gold)
    if letter is not None:
        return mcq_pred_letter(statement or pred) == letter
    g_text = text_answer(gold)
    p_text = text_answer(pred) if g_text is not None else None
    if g_text is not None and p_text is not None:
        return g_text == p_text
    for g in _unit_readings(gold, pred):
        for p in _unit_readings(pred, gold):
            for g2 in _comma_readings(g):
                for p2 in _comma_readings(p):
                    if _equivalent_once(g2, p2):
                        return True
    return _rounded_gold_equal(gold, pred)


# --------------------------------------------------------------------------- hedges
def _joined(parts: list[str]) -> str:
    return ", ".join(p.strip() for p in parts if p.strip())


def gold_elements(gold: str) -> list | None:
    """The elements of a gold that is a list or set of several values ("3, 5, 7", "1 \\pm
    \\sqrt{19}", "\\{1, 2\\}"), else None (one value, a tuple, an interval ...)."""
    try:
        value, _ = answer_value(gold)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return None
    if isinstance(value, Labeled):
        value = value.value
    if isinstance(value, Seq) and value.kind in ("list", "set"):
        items = _dedupe(_flatten(value.items))
    elif isinstance(value, sympy.Expr):
        items = expand_pm(value)
    else:
        return None
    return items if len(items) > 1 else None


def _element_of(elements: list, pred: str) -> bool:
    try:
        value, _ = answer_value(pred)
        return value is not None and any(values_equal(e, value) for e in elements)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return False


#: Readings of a short text as a whole (no answer marker): the text itself is the answer, and
#: `_answer_equal` reads it again with its other readings (a decimal comma or a list: "4,7").
_WHOLE_TEXT = ("raw", "math", "number")


def committed_equal(gold: str, reading: Reading, text: str = "") -> bool:
    """The commitment rule: the last answer a response commits to is its answer (`read_answer`
    found it; earlier boxes, lines and sentences were superseded). Several candidates offered
    together in that final statement ("\\boxed{3} or \\boxed{4}", "the answer is 3 or 4",
    "\\boxed{3}, \\boxed{4}") are one answer that is a list, wrong against a single value
    (`equiv._collection_equal`). A gold that is a list or set may also be answered over
    several boxes (`reading.others`, then the final one), compared as their union.
    """
    primary = _joined(reading.parts)
    if not primary:
        return False
    if text and reading.source in _WHOLE_TEXT:
        return _answer_equal(gold, text)
    if _answer_equal(gold, primary, statement=reading.statement):
        return True
    others = [_joined(o) for o in reading.others if _joined(o)]
    if others and gold_elements(gold) is not None:
        return _answer_equal(gold, _joined(others + [primary]))
    return False


# --------------------------------------------------------------------------- text answers
_ARTICLES = {"a", "an", "the"}
_MATH_WORDS = {
    "pi",
    "sqrt",
    "frac",
    "infty",
    "inf",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "log",
    "ln",
    "exp",
    "mod",
    "cup",
    "cap",
    "le",
    "ge",
    "times",
    "cdot",
    "dfrac",
    "boxed",
    "left",
    "right",
}


def text_answer(text: str) -> str | None:
    """A short worded answer, normalised (case, articles, punctuation, \\text{}), else None.

    "\\text{The Cougars.}" -> "cougars". Only answers made of words qualify (no digits, no
    math commands, at most 8 words, one of two letters or more); they compare as whole
    normalised strings, never by substring ("Evelyn" is not "Evelyn and Bob").
    """
    parts, _ = extract_final_answer(text)
    answer = " ".join(parts)
    answer = re.sub(r"\\(?:text|textbf|mathrm|mbox|textit)\s*\{([^{}]*)\}", r" \1 ", answer)
    answer = answer.replace("$", " ")
    if re.search(r"[\d\\^_=<>+*/,;()\[\]{}|]", answer):
        return None  # numbers, math, lists and brackets are not worded answers
    words = re.sub(r"[^\w\s'-]|_", " ", answer).lower().replace("'", "").split()
    words = [w.strip("-") for w in words if w.strip("-") and w not in _ARTICLES]
    if not words or len(words) > 8 or not any(len(w) >= 2 for w in words) or set(words) & _MATH_WORDS:
        return None
    if len(words) == 1 and len(words[0]) <= 2:
        return None  # "x", "ab": symbols, not words
    return " ".join(words)


# --------------------------------------------------------------------------- percent
_PERCENT = re.compile(
    r"(?<![\d.])([-+]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:\\%|%|\\text\s*\{\s*\\?%\s*\}|\s*(?:percent|pct)\b)"
)


_DEGREES = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree)")
_RADIANS = re.compile(r"\\pi|π")


def _unit_readings(text: str, other: str) -> list[str]:
    """Readings of `text` against `other`: 37.5% is 37.5 or 0.375, and 30° is 30 or pi/6.

    The second reading is tried only when `other` lacks the mark (a percent sign; a degree
    sign, with pi on the other side), so 50% never matches 0.5%.
    """
    readings = [text]
    if _PERCENT.search(text) and not _PERCENT.search(other):
        readings.append(_PERCENT.sub(r"(\1/100)", text))
    if _DEGREES.search(text) and not _DEGREES.search(other) and _RADIANS.search(other):
        readings.append(_DEGREES.sub(r"(\1\\pi/180)", text))
    return readings


# --------------------------------------------------------------------------- rounding
#: A gold decimal read as rounded: two digits or more after the point (one digit, "0.5", "2.5",
#: is usually an exact value, and 1/3 must not pass for 0.3).
_ROUNDED = re.compile(r"[-+]?\d*\.(\d{2,})")
_MATRIX = re.compile(r"\\begin\{([pbvBV]?matrix)\}(.*)\\end\{\1\}", re.DOTALL)


def _rounds_to(value, gold_text: str) -> bool:
    """Whether the exact `value` (a fraction, a radical, pi ...; not a decimal, not an integer)
    rounds to the decimal `gold_text` at its stated digits: |value - gold| <= half a unit of
    its last digit (a tolerance from the gold's precision, never a fixed epsilon)."""
    m = _ROUNDED.fullmatch(gold_text.strip())
    if m is None or not isinstance(value, sympy.Expr) or isinstance(value, sympy.Float) or value.has(sympy.Float):
        return False
    if not value.is_number or value.free_symbols or value.is_Integer:
        return False
    decimals = len(m.group(1))
    try:
        approx = sympy.N(value, decimals + 30)
        if not approx.is_real:
            return False
        return bool(abs(approx - sympy.Rational(gold_text.strip())) <= sympy.Rational(5, 10 ** (decimals + 1)))
    except Exception:  # noqa: BLE001
        return False


def _rounded_gold_equal(gold: str, pred: str) -> bool:
    """A gold given in decimals (0.43, 4.123105625617661, "(-1.732, 1.732)") against an exact
    response that rounds to it at the gold's digits (3/7, \\sqrt{17}, "(-\\sqrt3, \\sqrt3)").

    One-sided: each gold decimal must be a bare decimal and the response's value exact (a
    decimal response is compared exactly, so 0.425 is not 0.43). Inside tuples, intervals,
    lists and matrices it holds element by element, the brackets compared as usual.
    """
    g_parts, _ = extract_final_answer(gold)
    if len(g_parts) != 1:
        return False
    g_text = clean_answer(g_parts[0])
    if _ROUNDED.search(g_text) is None:
        return False
    # 6.67% against 1/15: the response, in percent, rounds to the gold's digits.
    scale = 100 if _PERCENT.search(g_parts[0]) and not _PERCENT.search(pred) else 1
    p_parts, _ = extract_final_answer(pred)
    p_text = clean_answer(",".join(p_parts))
    if not p_text or re.search(r"\d?\.\d", p_text):
        return False  # a decimal response is compared exactly
    try:
        value, _ = answer_value(pred)
        if isinstance(value, Labeled):
            value = value.value
        value = ratio_value(value) if ratio_value(value) is not None else value  # 20:3 is 20/3
        if _ROUNDED.fullmatch(g_text):
            return isinstance(value, sympy.Expr) and _rounds_to(value * scale, g_text)
        return _rounded_elements_equal(g_text, value)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return False


def _gold_items(g_text: str) -> tuple[list[str], str] | None:
    """The element texts of a gold tuple / interval / list / set, or a matrix's entries (row by
    row), with the kind of container ("seq" or "matrix")."""
    m = _MATRIX.search(g_text)
    if m is not None:
        rows = [r for r in re.split(r"\\\\", m.group(2)) if r.strip()]
        return [c for r in rows for c in r.split("&")], "matrix"
    inner = g_text.strip()
    inner = re.sub(r"^\\left\s*|\\right\s*(?=[)\]])", "", inner)
    if inner[:2] == "\\{" and inner[-2:] == "\\}":
        inner = inner[2:-2]
    elif inner[:1] in "([" and inner[-1:] in ")]":
        inner = inner[1:-1]
    inner = re.sub(r"\\right\s*$", "", inner)
    return split_top(inner), "seq"


def _rounded_elements_equal(g_text: str, value) -> bool:
    """Element by element: a gold decimal element takes the response's element when that
    rounds to it; then the whole is compared as usual (kind, brackets, order)."""
    found = _gold_items(g_text)
    gold_value, _ = answer_value(g_text)
    if found is None or gold_value is None:
        return False
    texts, kind = found
    if kind == "matrix":
        if not (isinstance(gold_value, sympy.MatrixBase) and isinstance(value, sympy.MatrixBase)):
            return False
        if gold_value.shape != value.shape or len(texts) != len(gold_value):
            return False
        g_items, p_items = list(gold_value), list(value)
    else:
        if not (isinstance(gold_value, Seq) and isinstance(value, Seq)) or len(gold_value.items) != len(value.items):
            return False
        if len(texts) != len(gold_value.items):
            return False
        g_items, p_items = list(gold_value.items), list(value.items)
    merged = [p if _rounds_to(p, t) else g for g, p, t in zip(g_items, p_items, texts)]
    if merged == g_items:
        return False  # no element was rounded: the usual comparison already said no
    if kind == "matrix":
        return values_equal(sympy.ImmutableMatrix(gold_value.shape[0], gold_value.shape[1], merged), value)
    return values_equal(Seq(tuple(merged), gold_value.kind, gold_value.left, gold_value.right), value)


def _comma_readings(text: str) -> list[str]:
    """Plain "1,22" is a decimal comma or the list 1, 22: try both readings."""
    if re.fullmatch(r"\s*[-+]?\d+,\d+\s*", text) and not re.fullmatch(r"\s*[-+]?[1-9]\d{0,2},\d{3}\s*", text):
        return [text, f"${text.strip()}$"]
    return [text]


def _equivalent_once(gold: str, pred: str) -> bool:
    try:
        g_value, _ = answer_value(gold)
        p_value, _ = answer_value(pred)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - never let an odd answer crash the reward
        return _fallback_equal(gold, pred)
    if g_value is None or p_value is None:
        return False
    try:
        if values_equal(g_value, p_value):
            return True
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a sympy failure means "not proved equal"
        return _fallback_equal(gold, pred)
    # Two parsed values that differ are different; only unparsed text gets the string check.
    if _has_text(g_value) or _has_text(p_value):
        return _fallback_equal(gold, pred)
    return False


def _has_text(value) -> bool:
    if isinstance(value, Text):
        return True
    if isinstance(value, Labeled):
        return _has_text(value.value)
    if isinstance(value, Seq):
        return any(_has_text(item) for item in value.items)
    return False


def extract_response_answer(response: str) -> str | None:
    """The final answer of a response for `math` mode (`answer_reading.read_answer`: its last
    committed answer). None when it states none."""
    reading = read_answer(response)
    if reading is None:
        return None
    return _joined(reading.parts) or None


def math_score(response: str, ground_truth: str) -> RewardResult:
    """Score a response in `math` mode: +1.0 when its last committed answer is equivalent to
    the gold (`committed_equal`)."""
    check_ground_truth(ground_truth)
    reading = read_answer(response)
    answer = _joined(reading.parts) if reading is not None else ""
    if not answer:
        return RewardResult(-1.0, False, "", "no_answer")
    ok = committed_equal(ground_truth, reading, response)
    return RewardResult(1.0 if ok else -1.0, ok, answer[:200], "ok" if ok else "wrong")


__all__ = [
    "answer_value",
    "committed_equal",
    "extract_response_answer",
    "gold_elements",
    "math_equivalent",
    "math_score",
]
