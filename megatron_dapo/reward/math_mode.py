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


def mcq_pred_letter(pred: str) -> str | None:
    """The option letter a response chose, or None (also when it lists several options).

    A response whose chosen letter stands in a list of different letters ("C, B, D, E, A",
    "A or C") chose none of them: taking the first or last would reward naming every option.
    A letter named elsewhere in prose ("D, it can't be A or B") does not count against it.
    """
    text = re.sub(r"\\text\{\s*\(?([A-E])\)?\s*\}", r"\1", pred)
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
    """Whether `pred` is mathematically equivalent to `gold` (both answers or short texts).

    When `pred` commits to several answers (two boxes that differ, a box and a different
    "Answer:" line), every one must match: see `committed_equal`.
    """
    check_ground_truth(gold)
    if not isinstance(pred, str) or not pred.strip():
        return False
    if gold.strip() == pred.strip():
        return True
    reading = read_answer(pred)
    if reading.others:
        return committed_equal(gold, reading)
    return _answer_equal(gold, pred)


def _answer_equal(gold: str, pred: str) -> bool:
    """One answer against the gold (no hedge check)."""
    if gold.strip() == pred.strip():
        return True
    letter = mcq_gold_letter(gold)
    if letter is not None:
        return mcq_pred_letter(pred) == letter
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


def committed_equal(gold: str, reading: Reading) -> bool:
    """The hedge rule: a response that commits to several answers is right only when all of them
    are (`reading.parts` and each of `reading.others`: other boxes, the "Answer:" line, a later
    answer sentence). "\\boxed{3} ... \\boxed{4}" is wrong for a gold of 3 and for 4.

    A gold that is a list or set is matched element-wise: each other answer may also be one
    of its elements, and answers spread over several boxes are compared as their union
    ("\\boxed{3} ... \\boxed{5}" against "3, 5"). One answer that is itself a list of
    values ("3 or 4", "-3/4, 5/4, or 1/4") is compared as a list, so it is wrong against a
    single value (`equiv._collection_equal`).
    """
    primary = _joined(reading.parts)
    others = [_joined(o) for o in reading.others if _joined(o)]
    if not primary:
        return False
    if _answer_equal(gold, primary):
        if all(o == primary or _answer_equal(gold, o) for o in others):
            return True
        elements = gold_elements(gold)
        return elements is not None and all(
            o == primary or _answer_equal(gold, o) or _element_of(elements, o) for o in others
        )
    if others and gold_elements(gold) is not None:
        return _answer_equal(gold, _joined([primary] + others))
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
_ROUNDED = re.compile(r"[-+]?\d+\.(\d{2,3})")


def _rounded_gold_equal(gold: str, pred: str) -> bool:
    """A gold given to 2-3 decimals (0.43) against an exact response that rounds to it (3/7).

    One-sided: the gold must be a bare decimal and the response an exact value written
    without a decimal point (a fraction, a radical, pi ...); a decimal response is compared
    exactly, so 0.425 is not 0.43.
    """
    g_parts, _ = extract_final_answer(gold)
    if len(g_parts) != 1:
        return False
    g_text = clean_answer(g_parts[0])
    m = _ROUNDED.fullmatch(g_text)
    if m is None:
        return False
    # 6.67% against 1/15: the response, in percent, rounds to the gold's digits.
    scale = 100 if _PERCENT.search(g_parts[0]) and not _PERCENT.search(pred) else 1
    p_parts, _ = extract_final_answer(pred)
    p_text = clean_answer(",".join(p_parts))
    if "." in p_text or not p_text:
        return False
    try:
        value, _ = answer_value(pred)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
        return False
    if isinstance(value, Labeled):
        value = value.value
    value = ratio_value(value) if ratio_value(value) is not None else value  # 20:3 is 20/3
    if isinstance(value, sympy.Expr):
        value = value * scale
    if not (isinstance(value, sympy.Expr) and value.is_number and not value.free_symbols) or value.is_Integer:
        return False
    decimals = len(m.group(1))
    try:
        approx = sympy.N(value, 30)
        if not approx.is_real:
            return False
        target = sympy.Rational(g_text)
        return bool(abs(approx - target) <= sympy.Rational(5, 10 ** (decimals + 1)))
    except Exception:  # noqa: BLE001
        return False


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
    """The final answer of a response for `math` mode (`answer_reading.read_answer`: the last box,
    "Answer:" line, answer sentence or concluding sentence). None when it states none."""
    reading = read_answer(response, response=True)
    if reading is None:
        return None
    return _joined(reading.parts) or None


def math_score(response: str, ground_truth: str) -> RewardResult:
    """Score a response in `math` mode: +1.0 when its final answer is equivalent to the gold
    and every other answer it commits to is too (`committed_equal`)."""
    check_ground_truth(ground_truth)
    reading = read_answer(response, response=True)
    answer = _joined(reading.parts) if reading is not None else ""
    if not answer:
        return RewardResult(-1.0, False, "", "no_answer")
    ok = committed_equal(ground_truth, reading)
    return RewardResult(1.0 if ok else -1.0, ok, answer[:200], "ok" if ok else "wrong")


__all__ = [
    "answer_value",
    "committed_equal",
    "extract_response_answer",
    "gold_elements",
    "math_equivalent",
    "math_score",
]
