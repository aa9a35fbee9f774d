"""Mode `dapo`: the official DAPO-Math answer check, re-implemented from its documented behaviour.

Behaviour (the official checker's, as its recipe documents it; docs/reward.md, mode `dapo`):

1. Only the last 300 characters of the response are looked at.
2. The prediction is the last case-insensitive match of ``Answer\\s*:\\s*([^\\n]+)``;
   "[INVALID]" when there is none.
3. Prediction and ground truth are both normalised Minerva-style (`minerva_normalize`).
4. The two strings are compared exactly: +1.0 when equal, -1.0 otherwise.

Known quirks we keep on purpose (parity): "Answer: 540." is wrong (the period stays);
"The answer is 540" is invalid (no "Answer:"); "Answer: x = 540" and "540 degrees" are
right; "-1,000" keeps its comma (only all-digit strings lose commas).

The tokenizer's end-of-sequence text is removed first (the official reward manager
decodes without special tokens, so it never reaches the check).
"""

from __future__ import annotations

import re

from .result import RewardResult, check_ground_truth

#: Characters of the response the official check looks at.
TAIL_CHARS = 300
#: Prediction when the response has no "Answer:" line.
INVALID = "[INVALID]"
#: End-of-sequence texts always removed before checking.
DEFAULT_EOS_TEXTS = ("<|im_end|>", "<|endoftext|>")

_ANSWER_RE = re.compile(r"Answer\s*:\s*([^\n]+)", re.IGNORECASE)

# Minerva normalisation tables (Lewkowycz et al. 2022, appendix), applied in order.
_SUBSTITUTIONS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
_REMOVED = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)
_UNWRAP_LAZY = tuple(re.compile(re.escape(cmd) + r"\{([^}\n]*)\}") for cmd in ("\\text", "\\textbf", "\\overline"))
_BOXED_GREEDY = re.compile(r"\\boxed\{(.*)\}")
_FRAC_SHORT = re.compile(r"(frac)([^{])(.)")
_SQRT_SHORT = re.compile(r"(sqrt)([^{])")


def _keep_math_span(text: str) -> str:
    """Per line: when a line holds two or more `$`, keep "$" + the text between the first two + "$".

    Equivalent to Minerva's ``re.sub(r"(.*?)(\\$)(.*?)(\\$)(.*)", "$\\3$", s)`` (whose `.` stops
    at newlines), but linear-time: the regex form is quadratic on adversarial strings.
    """
    lines = text.split("\n")
    for i, line in enumerate(lines):
        first = line.find("$")
        if first < 0:
            continue
        second = line.find("$", first + 1)
        if second < 0:
            continue
        lines[i] = "$" + line[first + 1 : second] + "$"
    return "\n".join(lines)


def minerva_normalize(answer: str) -> str:
    """Normalise a final answer the way the Minerva / DAPO-Math checker does."""
    answer = answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expr in _REMOVED:
        answer = answer.replace(expr, "")
    answer = _keep_math_span(answer)
    for pattern in _UNWRAP_LAZY:
        answer = pattern.sub(r"\1", answer)
    answer = _BOXED_GREEDY.sub(r"\1", answer)
    # Shorthand TeX: \fracab -> \frac{a}{b}, \sqrta -> \sqrt{a}.
    answer = _FRAC_SHORT.sub(r"frac{\2}{\3}", answer)
    answer = _SQRT_SHORT.sub(r"sqrt{\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def strip_eos(response: str, eos_text: str | None = None) -> str:
    """Remove end-of-sequence texts (`<|im_end|>`, `<|endoftext|>`, and `eos_text` if given)."""
    texts = list(DEFAULT_EOS_TEXTS)
    if eos_text:
        texts.append(eos_text)
    for text in texts:
        response = response.replace(text, "")
    return response


def extract_answer_line(response: str) -> str:
    """The official prediction: the last "Answer: ..." line of the last 300 characters."""
    matches = _ANSWER_RE.findall(response[-TAIL_CHARS:])
    return matches[-1] if matches else INVALID


def dapo_score(response: str, ground_truth: str, eos_text: str | None = None) -> RewardResult:
    """Score a response with the official DAPO-Math rule (+1.0 equal, -1.0 otherwise)."""
    check_ground_truth(ground_truth)
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    raw = extract_answer_line(strip_eos(response, eos_text))
    pred = minerva_normalize(raw)
    ok = pred == minerva_normalize(ground_truth)
    # The official check compares "[INVALID]" with the gold like any prediction; it never
    # matches a real answer, and such an item is reported as "no_answer", not "wrong".
    reason = "ok" if ok else ("no_answer" if raw == INVALID else "wrong")
    return RewardResult(1.0 if ok else -1.0, ok, pred, reason)


def dapo_equivalent(gold: str, pred: str) -> bool:
    """`is_equivalent` in `dapo` mode: Minerva-normalised exact string equality of bare answers."""
    return minerva_normalize(pred) == minerva_normalize(gold)
