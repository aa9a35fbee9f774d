"""Clean-up and splitting of an extracted answer for `math` mode (text level, no sympy).

`clean_answer` removes presentation-only LaTeX (\\left, spacing, units in \\text{}, degrees,
percent, thousands separators, dollar signs) so that the parser sees only mathematics;
`split_top` splits a cleaned answer into its top-level items and `split_label` an item
"label = value" into its label and value (worded labels: `colon_label`, `has_colon_labels`).
The answer itself is located by `answer_reading.read_answer`.
"""

from __future__ import annotations

import re

_KNOWN_CMDS = (
    "boxed|frac|dfrac|tfrac|cfrac|left|right|text|textbf|mathrm|sqrt|pi|cdot|times|infty|quad|"
    "qquad|in|cup|pm|mp|le|ge|leq|geq|neq|begin|end|overline|mathbf|approx|fbox|circ|sum|binom|"
    "big|bigg|Big|Bigg|sin|cos|tan|log|ln|dbinom"
)
_DOUBLE_ESCAPED = re.compile(r"\\\\(?=(?:" + _KNOWN_CMDS + r")(?![a-zA-Z]))")


_UNIT_TEXT = re.compile(
    r"(?<=[\d}).\s])\s*\\(?:text|mbox|textnormal|textrm|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\d\}?)?"
)
_THOUSANDS_WHOLE = re.compile(r"\s*([^=]*=\s*)?([-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?)\s*")


_UNICODE = (
    ("−", "-"),
    ("≤", "\\le "),
    ("≥", "\\ge "),
    ("≦", "\\le "),
    ("≧", "\\ge "),
    ("⩽", "\\le "),
    ("⩾", "\\ge "),
    ("＜", "<"),
    ("＞", ">"),
    ("＝", "="),
    ("≠", "\\ne "),
    ("×", "\\times "),
    ("·", "\\cdot "),
    ("÷", "\\div "),
    ("π", "\\pi "),
    ("∞", "\\infty "),
    ("√", "\\sqrt "),
    ("∪", "\\cup "),
    ("∩", "\\cap "),
    ("∈", "\\in "),
    ("∴", "\\therefore "),
    ("（", "("),
    ("）", ")"),
    ("，", ","),
    ("：", ":"),
    ("′", "'"),
    ("″", "''"),
    ("€", ""),
    ("²", "^2"),
    ("³", "^3"),
)
_NUM = r"\d+(?:\.\d+)?"
_DEG = r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\circ|\\degree)"
_MIN = r"(?:'|\^\s*\{\s*\\prime\s*\}|\^\s*\\prime|\\prime)"
_SEC = r"(?:''|\^\s*\{\s*\\prime\s*\\prime\s*\}|\\prime\s*\\prime|\"|\\dprime)"
# 45^\circ 30' (15'') -> degrees as a number: 45 + 30/60 (+ 15/3600).
_DEGREES_MINUTES = re.compile(rf"(?<![\d.])({_NUM})\s*{_DEG}\s*({_NUM})\s*(?!{_SEC}){_MIN}(?:\s*({_NUM})\s*{_SEC})?")
_ORDINAL = re.compile(
    r"(?<![\d.])(\d+)\s*(?:\^\s*\{\s*(?:\\text\s*\{\s*)?(?:st|nd|rd|th)\s*\}?\s*\}|\^\s*(?:st|nd|rd|th)\b|(?:st|nd|rd|th)\b)"
)
# Only quantifiers: a condition ("x \text{ if } x > 0, ...") is part of a piecewise value.
_QUALIFIER = re.compile(r"(?<=\S)\s*,?\s*\\text\s*\{\s*(?:for\s+(?:all|any|every|each|some)|where)\b.*$")
_INEQUALITY = re.compile(r"[<>]|\\(?:le|ge|leq|geq|lt|gt|leqslant|geqslant)(?![a-zA-Z])")
# {x | 0 < x < 2}, {x \in R : x > 1}: the set of x satisfying a condition is that condition.
_SET_BUILDER = re.compile(
    r"\\\{\s*[A-Za-z]\s*(?:\\in\s*\\mathbb\s*\{?\s*R\s*\}?\s*)?(?:\\mid|\||:)\s*((?:(?!\\[{}]).)+?)\s*\\\}"
)
# "4 2/9" (a whole number, one space, a proper fraction) is the mixed number 4 + 2/9.
_MIXED_NUMBER = re.compile(r"(?<![\d.}/^_])(\d+) (\d+)/(\d+)(?![\d.])")


def _join_thousands(m: re.Match) -> str:
    """ "9\\,901" -> "9901": digits in groups of three after a thin space or a space."""
    return m.group(1) + re.sub(r"\D", "", m.group(2))


def _degrees_value(m: re.Match) -> str:
    value = f"({m.group(1)}+{m.group(2)}/60"
    return value + (f"+{m.group(3)}/3600)" if m.group(3) else ")")


def _mixed_value(m: re.Match) -> str:
    whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
    return f"({whole}+{num}/{den})" if 0 < num < den else m.group()


def clean_answer(text: str) -> str:
    """Remove presentation-only LaTeX so that the parser sees only the mathematics."""
    # One space for any run of whitespace: every "\s*" below then scans at most one
    # character, so no pattern turns quadratic on long runs of spaces.
    s = re.sub(r"[\s\u00a0\u2009\u202f]+", " ", text)
    s = re.sub(r"(?<=[\w)\]}])\s?\*\*\s?(?=[\w(\[{+-])", "^", s).replace("**", "")  # ASCII x**2; markdown bold
    s = _DOUBLE_ESCAPED.sub(r"\\", s)
    s = re.sub(r"√\s*(\d+(?:\.\d+)?|[A-Za-z])", r"\\sqrt{\1}", s)  # √51 is the root of 51 (LaTeX's \sqrt 51 is not)
    for a, b in _UNICODE:
        s = s.replace(a, b)
    # Thousands separated by a thin space or a space: 9\,901, 9\;901, 1 000 000 (whole numbers).
    s = re.sub(r"(?<![\d.])(\d{1,3})((?:(?:\\[,;: !]|\\thinspace|~| )\d{3})+)(?![\d])", _join_thousands, s)
    s = re.sub(r"\b(?:either|maybe|perhaps|possibly|probably)\s+", "", s)
    s = re.sub(r"\s*\(\s*(?:or|and)\s+([^()]*)\)", r", \1", s)  # "5 (or 6)": a second value
    s = _DEGREES_MINUTES.sub(_degrees_value, s)  # before degree signs are dropped
    s = re.sub(r"\\(?:left|right)\s*\.", " ", s)
    s = re.sub(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|big|Big|bigg|Bigg)(?![a-zA-Z])", "", s)
    s = re.sub(r",\s*\\!\s*(?=\d)", ",", s)
    s = re.sub(r"\\!", "", s)
    s = re.sub(r"(\d)\s*\{\s*,\s*\}\s*(\d)", r"\1\2", s)
    s = re.sub(r"\\q?quad", " ", s)
    s = re.sub(r"(?<!\\)\\[,;: ]", " ", s)
    s = s.replace("~", " ")
    s = re.sub(r"\\(?:displaystyle|textstyle|scriptstyle)", "", s)
    s = re.sub(r"\\[dtc]frac", r"\\frac", s)
    s = re.sub(
        r"\\(?:mbox|textnormal|textrm|textit|textup|textsf|textbf|mathrm|mathit|mathbf|mathsf|operatorname)(?![a-zA-Z])",
        r"\\text",
        s,
    )
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree|°|º", "", s)
    s = re.sub(r"\\(?:therefore|because)(?![a-zA-Z])", " ", s).strip()
    s = re.sub(r"\\text\s*\{\s*(sin|cos|tan|cot|sec|csc|log|ln|exp|arcsin|arccos|arctan)\s*\}", r"\\\1 ", s)
    # A trailing qualifier ("... \text{ for all } x \in Z", "\text{where } k \in Z") is no part of the value.
    s = _QUALIFIER.sub("", s).strip() or s
    s = re.sub(r"\\text\s*\{\s*([-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+))\s*\}", r"\1", s)  # \text{13}
    s = _ORDINAL.sub(r"\1", s)  # 7^{th}, 21st
    if _INEQUALITY.search(s):
        # "x < -1 or x > 2" is a union, "x > 1 and x < 3" an intersection: keep the connective.
        s = re.sub(r"\\text\s*\{\s*or\s*\}|\bor\b|\\lor(?![a-zA-Z])|\\vee(?![a-zA-Z])", r" \\lor ", s)
        s = re.sub(r"\\text\s*\{\s*and\s*\}|\band\b|\\land(?![a-zA-Z])|\\wedge(?![a-zA-Z])", r" \\land ", s)
        s = _SET_BUILDER.sub(r"\1", s)
    s = re.sub(r"\\text\s*\{\s*(?:and|or)\s*\}", ",", s)
    s = re.sub(r"\\%|%|\\text\s*\{\s*\\?%\s*\}", "", s)
    s = re.sub(r"\s*\b(?:percentage|percent|pct)\b", "", s)
    s = re.sub(r"\\\$|\$", "", s)
    s = re.sub(r"\\text\s*\{\s*\(?\s*([A-Za-z])\s*\)?\s*\}", r"\\text{\1}", s)
    s = re.sub(r"\b(?:and|or)\b", ",", s)
    s = re.sub(r"(?<=[\d)}])or(?=[A-Za-z(\\])", ",", s)
    if re.search(r"[\d}).]\s*\\text", s):
        s = _UNIT_TEXT.sub("", s)
    s = re.sub(r"\s*,(\s*,)+", ",", s).strip().strip(",").strip()
    s = s.rstrip(".").strip()
    s = _MIXED_NUMBER.sub(_mixed_value, s)
    m = _THOUSANDS_WHOLE.fullmatch(s)
    if m:
        s = (m.group(1) or "") + m.group(2).replace(",", "")
    return s


def split_top(text: str, seps: str = ",;") -> list[str]:
    """Split on separators that are not inside (), [], {} (\\{ \\} count as brackets)."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            if text[i + 1] in "{}":
                depth += 1 if text[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch in seps and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts


_LABEL_OK = re.compile(r"[A-Za-z\\(){}|:,\s\[\]']+")


def is_label(text: str) -> bool:
    """Whether the left side of "lhs = value" only names the value ("x", "f(x)", "(p,q)", "|AB|")."""
    t = re.sub(r"_\s*\{[^{}]*\}|_\s*\w", "", text).strip()
    if not t or re.search(r"\d|[+\-*/^]", t) or re.search(r"\\(?:pi|infty|sqrt)(?![a-zA-Z])", t):
        return False  # "\pi \approx 3.14": a value, not a name
    if "\\frac" in t:
        t = t.replace("\\frac", "")
    return bool(_LABEL_OK.fullmatch(t)) and bool(re.search(r"[A-Za-z]", t))


_REL_SPLIT = re.compile(r"\\approx|(?<![<>!=])=(?!=)|\\in(?![a-zA-Z])")


# "Smallest: 2", "Sequence 1: -2", "\text{Maximum}: 9": a worded label before a colon (a word of
# three letters or more, so that the ratio "a:b" is no label).
_COLON_LABEL = re.compile(r"\s*((?:\\text\s*\{)?[A-Za-z][A-Za-z0-9 ]*[A-Za-z0-9]\}?)\s*:\s*(\S.*)")


def colon_label(item: str) -> tuple[str, str] | None:
    """(label, value) of "Smallest: 2", else None."""
    m = _COLON_LABEL.fullmatch(item)
    if (
        m
        and re.search(r"[A-Za-z]{3,}", m.group(1))
        and not re.search(r"(?<![A-Za-z])(?:frac|sqrt|pi|infty)", m.group(1))
    ):
        return m.group(1), m.group(2)
    return None


def has_colon_labels(text: str) -> bool:
    """Whether a text is a list of worded labels with values ("Min: 1, Max: 5") and nothing else."""
    found = False
    for part in split_top(re.sub(r"\band\b", ",", text)):
        labelled = colon_label(part)
        value = labelled[1] if labelled is not None else part
        found = found or labelled is not None
        if not re.fullmatch(r"[-+\s\w.,/^*(){}\[\]\\=<>']*", value) or re.search(r"(?<![\\A-Za-z])[A-Za-z]{2,}", value):
            return False  # prose or stray symbols outside the labels
    return found


def split_label(item: str) -> tuple[str | None, str, bool]:
    """Split "label = value" chains: returns (label or None, value text, is_equation).

    "x = 5+5+1 = 7 = 11" -> (None, "11", False) (a computation chain: its last value);
    "y = 2x+1" -> ("y", "2x+1", False); "2x+4y-3=0" -> (None, item, True) (an equation);
    "x \\in [1, 2]" -> ("x", "[1, 2]", False); "1/3 \\approx 0.33" -> (None, "1/3", False).
    """
    worded = colon_label(item)
    if worded is not None:
        return worded[0].strip(), worded[1].strip(), False
    depth = pos = 0
    cuts = []
    for m in _REL_SPLIT.finditer(item):
        chunk = item[pos : m.start()]  # bracket depth kept incrementally: linear in len(item)
        depth += (
            chunk.count("(")
            + chunk.count("[")
            + chunk.count("{")
            - chunk.count(")")
            - chunk.count("]")
            - chunk.count("}")
        )
        pos = m.start()
        if depth == 0:
            cuts.append(m)
    if not cuts:
        return None, item, False
    parts, ops, start = [], [], 0
    for m in cuts:
        parts.append(item[start : m.start()])
        ops.append(m.group())
        start = m.end()
    parts.append(item[start:])
    # \approx: keep the exact value before it unless that is only a name.
    for k, op in enumerate(ops):
        if op == "\\approx":
            if k == 0 and is_label(parts[0]):
                return parts[0].strip(), parts[1].strip(), False
            parts, ops = parts[: k + 1], ops[:k]
            break
    if not ops:
        return None, parts[0].strip(), False
    if any(op.startswith("\\in") for op in ops):
        k = ops.index(next(op for op in ops if op.startswith("\\in")))
        return "".join(parts[: k + 1]).strip(), parts[-1].strip() if k == len(ops) - 1 else item, False
    if len(parts) >= 3:
        return None, parts[-1].strip(), False
    lhs, rhs = parts[0].strip(), parts[1].strip()
    if not lhs or not rhs:
        return None, lhs or rhs, False
    if is_label(lhs):
        return lhs, rhs, False
    if is_computation(lhs):
        return None, rhs, False  # "17 \\bmod 5 = 2", "\\det A = 3": the value is the answer
    return None, item, True


_OPERATOR_HEAD = re.compile(
    r"\s*\\(?:sum|prod|int|iint|oint|lim|det|binom|dbinom|tbinom|gcd|lcm|max|min|operatorname)(?![a-zA-Z])"
)


def is_computation(text: str) -> bool:
    """Whether the left side of "lhs = value" is a calculation rather than an unknown: a big
    operator, a determinant, a limit ... ("\\sum_{i=1}^n i", "\\det(A)"), or numbers and
    operators with no free letter ("17 \\bmod 5", "3^2 + 4^2", "\\frac{1}{2} \\cdot 6")."""
    if _OPERATOR_HEAD.match(text):
        return True
    if not re.search(r"[-+*/^!]|\\[a-zA-Z]+", text):
        return False  # "7 = 11a + c": a number alone is a side of an equation, no calculation
    bare = re.sub(r"[_^]\s*(?:\{[^{}]*\}|\\?\w)", " ", text)
    bare = re.sub(r"\\[a-zA-Z]+", " ", bare)
    return bool(re.search(r"\d", bare)) and not re.search(r"[A-Za-z]", bare)
