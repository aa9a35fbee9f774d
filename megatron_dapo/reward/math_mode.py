"""Mode `math`: sympy-based answer equivalence that accepts what strict matching misses.

Pipeline: extract the final answer (`extract.extract_final_answer`), clean presentation
LaTeX (`extract.clean_answer`), split top-level lists and "label = value" items
(`extract.split_top`, `extract.split_label`), parse each item (`latex.parse_latex`) and
compare (`equiv.values_equal`). Anything the parser refuses (unknown LaTeX) or that the
guards reject (huge powers, 10^5-digit numbers, deep nesting) falls back to exact
comparison of the cleaned strings, so it can still be right when identical and is never
evaluated. Multiple-choice golds ("C", "(D) Alina") compare the chosen letter.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .equiv import Labeled, values_equal
from .extract import clean_answer, extract_final_answer, split_label, split_top
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


def mcq_pred_letter(pred: str) -> str | None:
    """The option letter a response chose, or None."""
    text = re.sub(r"\\text\{\s*\(?([A-E])\)?\s*\}", r"\1", pred)
    for k, pattern in enumerate(_MCQ_PRED):
        matches = list(pattern.finditer(text))
        if matches:
            return (matches[-1] if k != 1 else matches[0]).group(1)
    return None


@lru_cache(maxsize=4096)
def parse_label(label: str):
    """Parse the left side of "label = value" (used when comparing against an equation)."""
    try:
        return parse_latex(clean_answer(label))
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001
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
        return items[0], parts
    return Seq(tuple(items), "list"), parts


def _fallback_equal(gold: str, pred: str) -> bool:
    """Exact string comparison of the cleaned final answers."""
    g_parts, _ = extract_final_answer(gold)
    p_parts, _ = extract_final_answer(pred)
    g = _string_key(",".join(clean_answer(x) for x in g_parts))
    p = _string_key(",".join(clean_answer(x) for x in p_parts))
    return bool(g) and g == p


def math_equivalent(gold: str, pred: str) -> bool:
    """Whether `pred` is mathematically equivalent to `gold` (both answers or short texts)."""
    check_ground_truth(gold)
    if not isinstance(pred, str) or not pred.strip():
        return False
    if gold.strip() == pred.strip():
        return True
    letter = mcq_gold_letter(gold)
    if letter is not None:
        return mcq_pred_letter(pred) == letter
    for g in _comma_readings(gold):
        for p in _comma_readings(pred):
            if _equivalent_once(g, p):
                return True
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


_ANSWER_LINE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)


def extract_response_answer(response: str) -> str | None:
    """The final answer of a response for `math` mode: the last "Answer:" line, else \\boxed{}.

    Returns None when the response states no answer.
    """
    lines = _ANSWER_LINE.findall(response.replace("**", ""))
    if lines:
        return lines[-1].strip()
    parts, source = extract_final_answer(response)
    if source in ("boxed", "phrase"):
        return ", ".join(parts)
    return None


def math_score(response: str, ground_truth: str) -> RewardResult:
    """Score a response in `math` mode: +1.0 when its final answer is equivalent to the gold."""
    check_ground_truth(ground_truth)
    answer = extract_response_answer(response)
    if answer is None or not answer.strip():
        return RewardResult(-1.0, False, "", "no_answer")
    ok = math_equivalent(ground_truth, answer)
    return RewardResult(1.0 if ok else -1.0, ok, answer[:200], "ok" if ok else "wrong")


__all__ = ["answer_value", "extract_response_answer", "math_equivalent", "math_score"]
