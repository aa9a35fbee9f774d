"""Answer extraction and LaTeX clean-up for `math` mode (text level, no sympy).

`extract_final_answer(text)` finds the final answer of a response or gold string, in this
order: ``\\boxed{}`` (several boxes joined by "and"/","-like separators become a list),
an "Answer:" / "final answer is" / GSM8K "#### " phrase, the last math span(s) ``$...$`` / ``\\(...\\)`` /
``\\[...\\]``, and finally the last number of plain text. `clean_answer` then removes
presentation-only LaTeX (\\left, spacing, units in \\text{}, degrees, percent, thousands
separators, dollar signs) so that the parser sees only mathematics.
"""

from __future__ import annotations

import re

#: Only the tail of very long texts is searched (the final answer is at the end).
MAX_TEXT_CHARS = 20000

_KNOWN_CMDS = (
    "boxed|frac|dfrac|tfrac|cfrac|left|right|text|textbf|mathrm|sqrt|pi|cdot|times|infty|quad|"
    "qquad|in|cup|pm|mp|le|ge|leq|geq|neq|begin|end|overline|mathbf|approx|fbox|circ|sum|binom|"
    "big|bigg|Big|Bigg|sin|cos|tan|log|ln|dbinom"
)
_DOUBLE_ESCAPED = re.compile(r"\\\\(?=(?:" + _KNOWN_CMDS + r")(?![a-zA-Z]))")
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_PHRASE = re.compile(
    r"(?:final\s+answer\s*(?:is|:)|answer\s*(?:is|:)|^####)\s*", re.IGNORECASE | re.MULTILINE
)
_HOPE = re.compile(r"\s*I hope it is correct.*$", re.IGNORECASE | re.DOTALL)
_MATH_SPAN = re.compile(
    r"(?<!\\)\$\$((?:\\.|[^$\\])+?)\$\$"  # $$...$$ (may span lines)
    r"|\\\[((?:(?!\\\[).)+?)\\\]"  # \[...\] (no \[ inside: linear on "\[\[\[...")
    r"|\\\(((?:(?!\\\()[^\n])+?)\\\)"  # \(...\) on one line (no \( inside)
    r"|(?<!\\)\$((?:\\.|[^$\\\n])+?)\$",  # $...$ on one line, \$ escaped
    re.DOTALL,
)
_PLAIN_NUMBER = re.compile(
    r"(?<![A-Za-z0-9.,_^])[-+]?(?:[1-9]\d{0,2}(?:(?:,\d{3})+|(?: \d{3})+)(?:\.\d+)?(?![\d])"
    r"|\d+(?:[.,]\d+)?|\.\d+)(?:/\d+(?![\d]))?"
)
_WORDS = re.compile(r"[A-Za-z]+")
# Words after the number are separated by whitespace, so the match is linear (a word
# repeated inside "(?:[A-Za-z]{2,}\s*)+" could split 40 letters in exponentially many ways).
_UNIT_WORD = r"[A-Za-z]{2,}\.?(?:\^\{?\d\}?)?"
_NUMBER_WITH_UNIT = re.compile(
    r"([-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+))\s+(" + _UNIT_WORD + r"(?:\s+" + _UNIT_WORD + r")*)\s*"
)
_MATH_WORDS = {"pi", "sqrt", "ln", "log", "sin", "cos", "tan", "and", "or", "i", "e", "x", "mod", "pmod"}
_CONJ = {"and", "or"}


def _match_brace(text: str, start: int) -> int:
    """Index just past the brace group opening at text[start] == "{" (len(text) if unclosed)."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == "\\":
            continue
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or text[i - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def _joinable(separator: str) -> bool:
    """Whether the text between two answers joins them into one list ("and", ",", "\\quad")."""
    separator = re.sub(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*$", "", separator)
    sep = re.sub(r"\\(?:text|textbf|mbox|mathrm)\s*\{([^{}]*)\}", r" \1 ", separator)
    sep = re.sub(r"\\[a-zA-Z]+|\\.|[$()]", " ", sep)
    words = [w.lower() for w in _WORDS.findall(sep)]
    if not words:
        return len(separator) <= 40
    return len(words) <= 4 and words[-1] in _CONJ


def _join_last_group(spans: list[tuple[int, int, str]], text: str) -> list[str]:
    """From the last span backwards, keep the spans whose separators are joinable."""
    group = [spans[-1]]
    for prev in reversed(spans[:-1]):
        if _joinable(text[prev[1] : group[0][0]]):
            group.insert(0, prev)
        else:
            break
    return [s[2] for s in group]


def find_boxed(text: str) -> list[str] | None:
    """Contents of the last group of \\boxed{} answers, or None when there is none."""
    found = find_boxed_spans(text)
    return None if found is None else found[0]


def find_boxed_spans(text: str) -> tuple[list[str], int] | None:
    """(contents of the last group of \\boxed{} answers, end offset of the last box)."""
    # Outermost boxes only; scanning resumes after each box, so this stays linear.
    spans = []
    pos = 0
    while (m := _BOX_RE.search(text, pos)) is not None:
        end = _match_brace(text, m.end() - 1)
        inner_end = end - 1 if text[end - 1 : end] == "}" else end
        spans.append((m.start(), end, text[m.end() : inner_end]))
        pos = max(end, m.end())
    if not spans:
        return None
    outer = spans
    return _join_last_group(outer, text), outer[-1][1]


def find_math_spans(text: str) -> list[str] | None:
    """Contents of the last group of math spans ($...$, \\(...\\), \\[...\\], $$...$$)."""
    spans = [
        (m.start(), m.end(), next(g for g in m.groups() if g is not None))
        for m in _MATH_SPAN.finditer(text)
    ]
    spans = [s for s in spans if s[2].strip()]
    if not spans:
        return None
    return _join_last_group(spans, text)


def find_plain_number(text: str) -> str | None:
    """The last number of plain text, thousands/decimal separators normalised."""
    matches = list(_PLAIN_NUMBER.finditer(text))
    if not matches:
        return None
    return normalize_plain_number(matches[-1].group())


def normalize_plain_number(num: str) -> str:
    """ "1,000.99" -> "1000.99", "1 000" -> "1000", "1,22" / "0,111" (decimal comma) -> "1.22"."""
    if re.fullmatch(r"[-+]?[1-9]\d{0,2}(?:(?:,\d{3})+|(?: \d{3})+)(?:\.\d+)?(?:/\d+)?", num):
        return num.replace(",", "").replace(" ", "")
    return num.replace(",", ".")


def _answer_phrase(text: str, after: int = 0, final_only: bool = False) -> str | None:
    """Text after the last "final answer is" / "answer:" phrase (starting at or after `after`)."""
    matches = [m for m in _ANSWER_PHRASE.finditer(text) if m.start() >= after]
    if final_only:
        matches = [m for m in matches if m.group().lower().startswith(("final", "####"))]
    # "... so our answer is correct." states no answer: skip phrases without math or digits.
    matches = [m for m in matches if re.match(r"\s*(?:[\\$\d(\[{-]|\(?[A-E]\b|[^\n.]{0,80}?[\d$\\])", text[m.end() :])]
    if not matches:
        return None
    rest = text[matches[-1].end() :]
    rest = _HOPE.sub("", rest)
    lead = _MATH_SPAN.match(rest.lstrip(' "'))
    if lead:  # "The final answer is $x$. More text" -> "$x$"
        return lead.group()
    line = rest.split("\n")[0]
    masked = _MATH_SPAN.sub(lambda m: "#" * len(m.group()), line)
    end = re.search(r"\.\s+[A-Z]", masked)
    if end:
        line = line[: end.start()]
    return line.strip() or None


# JSON strings written without escaping the backslash turn "\\frac" into a form feed and
# "\\beta" / "\\binom" into a backspace; those characters never belong to an answer. (A tab
# is left alone: "\\t" + "ext" is ambiguous with a real tab before "ext".)
_CONTROL_ESCAPES = {"\x0c": "\\f", "\x08": "\\b", "\x07": "\\a", "\x0b": "\\v"}


def _restore_control_escapes(text: str) -> str:
    if any(ch in text for ch in _CONTROL_ESCAPES):
        for ch, escape in _CONTROL_ESCAPES.items():
            text = re.sub(re.escape(ch) + r"(?=[a-zA-Z])", lambda _m, e=escape: e, text)
    return text


def preprocess(text: str) -> str:
    """Drop chat markup and thinking, undo double escaping."""
    if "</think>" in text:
        after = text.rsplit("</think>", 1)[1]
        if after.strip():
            text = after
    text = text.split("<|im_start|>")[0] if text.find("<|im_start|>") > 0 else text
    text = re.sub(r"<\|[a-z_]+\|>|<think>", " ", text)
    if len(text) > MAX_TEXT_CHARS:
        text = text[-MAX_TEXT_CHARS:]
    text = _DOUBLE_ESCAPED.sub(r"\\", text)
    text = _restore_control_escapes(text)
    # Literal "\n" escapes (double-encoded JSON); "\neq", "\nu", "\not" ... stay commands.
    text = re.sub(r"\\n(?![a-z])", "\n", text)
    return text


def _after_last_is(phrase: str) -> str:
    """ "The largest $n$ is 34" -> "34" (an " is " outside math spans)."""
    masked = _MATH_SPAN.sub(lambda m: "#" * len(m.group()), phrase)
    k = masked.rfind(" is ")
    return phrase[k + 4 :] if k >= 0 and phrase[k + 4 :].strip() else phrase


def _phrase_answer(phrase: str) -> tuple[list[str], str]:
    phrase = _after_last_is(phrase)
    spans = find_math_spans(phrase)
    if spans:
        return spans, "math"
    phrase = phrase.strip().strip('"').rstrip(".").strip()
    if " is " in phrase:
        phrase = phrase.rsplit(" is ", 1)[1].strip().rstrip(".")
    if re.fullmatch(r"[-+]?[\d.,/ ]+", phrase):
        return [normalize_plain_number(phrase.replace(" ", "") if "," in phrase else phrase)], "text"
    if re.search(r"[\\^_{}=]", phrase) or len(phrase.split()) <= 2:
        return [phrase], "math"
    num = find_plain_number(phrase)
    return ([num], "text") if num else ([phrase], "text")


def extract_final_answer(text: str) -> tuple[list[str], str]:
    """Return (answer parts, source) where source is "boxed", "phrase", "math", "text" or "raw".

    Several parts mean several answers joined by "and"/","-like separators (a list).
    """
    text = preprocess(text)
    boxed = find_boxed_spans(text)
    if boxed is not None:
        # A "final answer is" stated after the last box wins (the box was an intermediate step).
        later = _answer_phrase(text, after=boxed[1], final_only=True)
        if later is None:
            return boxed[0], "boxed"
    phrase = _answer_phrase(text)
    if phrase is not None:
        parts, _ = _phrase_answer(phrase)
        return parts, "phrase"
    spans = find_math_spans(text)
    if spans:
        tail = text[text.rfind(spans[-1]) + len(spans[-1]) :]
        if not (len(tail) > 30 and find_plain_number(tail)):
            return spans, "math"
        return [find_plain_number(tail)], "text"
    stripped = text.strip()
    if len(stripped) <= 300 and has_colon_labels(stripped):
        return [stripped], "raw"  # "Smallest: 2, Largest: 9"
    bare = stripped.strip("$€ ").rstrip(".")
    if _PLAIN_NUMBER.fullmatch(bare):
        return [normalize_plain_number(bare)], "text"
    unit = _NUMBER_WITH_UNIT.fullmatch(bare)
    if unit and not (set(w.lower() for w in _WORDS.findall(unit.group(2))) & _MATH_WORDS):
        return [normalize_plain_number(unit.group(1))], "text"  # "540 degrees", "20 cm^2"
    if len(stripped) <= 40 and not re.search(r"[A-Za-z]{2,}\s*[\s:'.]\s*[A-Za-z0-9]", stripped):
        return [stripped], "raw"
    # Prose without LaTeX ("... which is 1,000.99m²"): its last number.
    if "\\" not in stripped and re.search(r"[A-Za-z]{2,}", stripped):
        num = find_plain_number(stripped)
        if num is not None:
            return [num], "text"
    return [stripped], "raw"


# --------------------------------------------------------------------------- clean-up
_UNIT_TEXT = re.compile(
    r"(?<=[\d}).\s])\s*\\(?:text|mbox|textnormal|textrm|mathrm)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\d\}?)?"
)
_THOUSANDS_WHOLE = re.compile(r"\s*([^=]*=\s*)?([-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?)\s*")


_UNICODE = (
    ("−", "-"), ("≤", "\\le "), ("≥", "\\ge "), ("≦", "\\le "), ("≧", "\\ge "), ("⩽", "\\le "), ("⩾", "\\ge "),
    ("＜", "<"), ("＞", ">"), ("＝", "="), ("≠", "\\ne "), ("×", "\\times "), ("·", "\\cdot "), ("÷", "\\div "),
    ("π", "\\pi "), ("∞", "\\infty "), ("√", "\\sqrt "), ("∪", "\\cup "), ("∩", "\\cap "), ("∈", "\\in "),
    ("∴", "\\therefore "), ("（", "("), ("）", ")"), ("，", ","), ("：", ":"), ("′", "'"), ("″", "''"),
    ("€", ""), ("²", "^2"), ("³", "^3"),
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
    s = re.sub(r"\s+", " ", text).replace("**", "")
    s = _DOUBLE_ESCAPED.sub(r"\\", s)
    for a, b in _UNICODE:
        s = s.replace(a, b)
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
    s = re.sub(r"\\(?:mbox|textnormal|textrm|textit|textup|textsf|textbf|mathrm|mathit|mathbf|mathsf|operatorname)(?![a-zA-Z])", r"\\text", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree", "", s)
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
    if not t or re.search(r"\d|[+\-*/^]", t):
        return False
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
    if m and re.search(r"[A-Za-z]{3,}", m.group(1)) and not re.search(r"(?<![A-Za-z])(?:frac|sqrt|pi|infty)", m.group(1)):
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
        depth += chunk.count("(") + chunk.count("[") + chunk.count("{") - chunk.count(")") - chunk.count("]") - chunk.count("}")
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
    return None, item, True
