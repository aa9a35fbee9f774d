"""Locating the final answer of a response for `math` mode (text level, no sympy).

`read_answer(text)` finds the final answer of a response, a solution or a bare answer by a
documented order of readings (the comment above `read_answer`, docs/verifier.md): the last
final statement (a group of ``\\boxed{}``, an "Answer:" line, a "final answer is"
sentence), else an answer sentence, else a concluding "therefore ... =" sentence, and for
bare answers and solutions the last math spans, the whole short text, or a lone last number.
A span is read whole (`read_span`), LaTeX or ASCII, never just its last number. It also
returns the other answers a response commits to, for the hedge rule. The string found is
then cleaned by `answer_cleanup.clean_answer`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .answer_cleanup import _DOUBLE_ESCAPED, has_colon_labels

#: Only the tail of very long texts is searched (the final answer is at the end).
MAX_TEXT_CHARS = 20000

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HOPE = re.compile(r"\s*I hope it is correct.*$", re.IGNORECASE | re.DOTALL)
#: Closing remarks after the answer ("I hope this helps.", "Let me know if you need anything
#: else!", "This completes the solution."): not part of the final sentence.
_SIGN_OFF = re.compile(
    r"(?:\s*(?:I\s+hope\s+(?:this|that|it)\s+helps|hope\s+this\s+helps|let\s+me\s+know\s+if\s+[^.!?\n]{0,60}|"
    r"this\s+completes\s+the\s+(?:solution|proof)|feel\s+free\s+to\s+ask[^.!?\n]{0,60})[.!]*)+\s*$",
    re.IGNORECASE,
)
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
    spans = [(m.start(), m.end(), next(g for g in m.groups() if g is not None)) for m in _MATH_SPAN.finditer(text)]
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


# --------------------------------------------------------------------------- readings
# The final answer of a text is found by the first of these readings that gives one
# (docs/verifier.md, "Extraction order"):
#   1-3. the last final statement, whichever comes last in the text:
#        boxed:    the last group of \boxed{} (boxes joined by "and" / "," form one list);
#        answer:   the last "Answer:" line (markdown bold ignored), up to the line's end;
#        sentence: the last "the final answer is ..." sentence, up to the sentence's end;
#        (a statement after the last box supersedes the boxes: they were steps);
#   3'.  an answer sentence ("the answer is", "the answers are", "####"), the last one;
#   4.   conclusion: the last "therefore / thus / hence / so ... (is | = | are) ..." sentence
#        in the last 300 characters;
# and, for a bare answer or a solution text (not for a response scored by compute_score):
#   5. math:       the last group of math spans $...$ / \(...\) / \[...\];
#   6. raw:        a short text as a whole ("15x - 80", "3 or 4", "Evelyn");
#   7. number:     the last number of prose, only where it stands alone (not inside
#                  "2*pi + 18").
# A span (3, 4, the "Answer:" line) is read whole (`read_span`): its math, LaTeX or ASCII,
# up to the end, never just its last number. Committed answers besides the one found (other
# boxes when a box is the answer; an answer sentence after it) go to `Reading.others`.

# (Each pattern is linear: no two adjacent repeats can share a run of spaces.)
_ANSWER_LINE = re.compile(r"answer(?:\s*(?:\*\*|__|\}))?\s*:[ \t]*(?:\*\*|__|\})?[ \t]*", re.IGNORECASE)
_ANSWER_SENTENCE = re.compile(
    r"\b(?:answers?|final\s+result)(?:\s+to\s+(?:this|the)\s+(?:problem|question))?\s+"
    r"(?:is|are|was|would\s+be|will\s+be|should\s+be|equals|=)\s*:?[ \t]*|^####[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
_FINAL_SENTENCE = re.compile(r"\bfinal\s+answer\s+(?:is|would\s+be|will\s+be|=)\s*:?[ \t]*", re.IGNORECASE)
#: "Answer $9$", "**Final answer** 12", "ANSWER 5": an answer line without a colon, at the start
#: of a line and followed directly by the answer (math, a number, a bracket)
_ANSWER_BARE = re.compile(
    r"^[ \t>#*_]*(?:\\textbf\{)?(?:final\s+)?answer(?:\s*(?:\*\*|__|\}))?[ \t]+(?=[$\\\d(\[{+-])",
    re.IGNORECASE | re.MULTILINE,
)
#: "the result is 3", "the value of the sum is $5$", "the solution to the system is $(7, 6)$"
_RESULT_SENTENCE = re.compile(
    r"\b(?:result|value|solution)s?(?:\s+(?:of|to|for)\s+(?:\$[^$\n]{1,40}\$|[^.$=\n]){1,60}?)?\s+"
    r"(?:is|are|equals|=)\s*:?[ \t]*",
    re.IGNORECASE,
)
#: A text that speaks of its answer ("the answer might be", "our answer is correct"): when none of
#: the readings above found an answer in it, it has none.
_MENTIONS_ANSWER = re.compile(r"\banswers?\b", re.IGNORECASE)
#: A final sentence that sets up or restates instead of concluding ("we need $x > 0$",
#: "suppose $n = 5$", "recall that $a + b = 10$"): its formula is no answer.
_CONDITION = re.compile(
    r"\b(?:if|suppose|assume|assuming|let(?!')|given|since|need|needs|want|to\s+find|such\s+that|where|"
    r"whether|recall|consider|check|verify|must|should|try|compute|calculate|determine|solve|substitut\w*)\b|\?",
    re.IGNORECASE,
)
_CONCLUSION = re.compile(
    r"(?:^[ \t]*|[.!?:][ \t]+)(?:therefore|thus|hence|so|consequently|in\s+conclusion|finally|overall|in\s+total|altogether)\b[ \t]*,?",
    re.IGNORECASE | re.MULTILINE,
)
#: The end of a sentence: a newline, or ". ! ?" before a space or the end (a decimal point
#: is followed by a digit, so "3.5" and ".0000672" do not end one; "5!" is a factorial and
#: "\\!" a LaTeX space).
_SENTENCE_END = re.compile(r"(?<!\\)(?:[.?]|(?<![\d)}])!)(?=\s|$)|\n")
_SENTENCE_WINDOW = 600
MAX_NESTING_SCAN = 40
_CONCLUSION_WINDOW = 300
#: Words that judge an answer instead of giving one ("so our answer is correct").
_JUDGMENT = re.compile(
    r"(?:not|correct|incorrect|right|wrong|valid|invalid|reasonable|consistent|confirmed|verified|indeed|"
    r"clear|obvious|as\s+follows|below|above|the\s+following|the\s+same|same|unique|undefined|unknown)\b",
    re.IGNORECASE,
)
_FILLER = re.compile(
    r"(?:(?:that|then|therefore|thus|hence|simply|just|exactly|precisely|indeed|clearly|finally|"
    r"equal\s+to|equals|given\s+by|the\s+value|is|are|:|=)(?![A-Za-z0-9])[ \t,]*)+",
    re.IGNORECASE,
)
#: Letters that are mathematics in ASCII answers ("sqrt(5)", "2*pi", "5*i", "ln 2").
_ASCII_MATH_WORDS = re.compile(
    r"arcsin|arccos|arctan|sinh|cosh|tanh|sqrt|cbrt|infinity|infty|inf|sin|cos|tan|cot|sec|csc|"
    r"log|ln|exp|pi|abs|mod|gcd|lcm|max|min",
    re.IGNORECASE,
)
_GLUE = {"or", "and", "either", "&", "both", "maybe", "perhaps", "possibly", "probably"}
_AMBIGUOUS = {"a", "an", "the", "I"}
_UNIT_MARKS = {"percent": "%", "%": "%", "degrees": "°", "degree": "°"}
#: How a sentence continues after its answer ("12, which is ...", "3 because ..."): a
#: connective word after a comma.
_VERBS = {
    "is",
    "are",
    "was",
    "equals",
    "equal",
    "be",
    "=",
    "gives",
    "yields",
    "becomes",
    "it's",
    "that's",
    "it’s",
    "that’s",
}


_BOLD = re.compile(r"(?<![\w)\]}])\*\*|\*\*(?![\w(\[{+-])")


_QUOTES = re.compile(r'^(?:\\?["“”])+|(?:\\?["“”])+$')


def strip_bold(text: str) -> str:
    """Markdown bold markers removed ("**Answer:** 5"); an ASCII power "x**2" is kept."""
    return _BOLD.sub("", text) if "**" in text else text


def _mask_math(text: str) -> str:
    return _MATH_SPAN.sub(lambda m: "#" * len(m.group()), text)


def sentence_after(text: str, pos: int) -> tuple[str, int]:
    """(the sentence that starts at text[pos], its end offset); math spans are never cut."""
    window = text[pos : pos + _SENTENCE_WINDOW]
    lead = len(window) - len(window.lstrip())
    window = window[lead:]  # "The answer is\n$$5$$": the answer may start on the next line
    m = _SENTENCE_END.search(_mask_math(window))
    end = m.start() if m else len(window)
    return window[:end], pos + lead + end


def _token_kind(token: str) -> str:
    """ "math", "glue" (or / and / punctuation), "ambiguous" (a / the / I) or "word"."""
    if "\x00" in token:
        return "math"
    bare = token.strip(",;:!?\"'*").rstrip(".")
    if not bare.strip("()[]"):
        return "math" if re.search(r"[()\[\]]", bare) else "glue"
    if bare.strip("()").lower() in _GLUE:
        return "glue"
    if bare in _AMBIGUOUS:
        return "ambiguous"
    if re.fullmatch(r"\d+(?:st|nd|rd|th)", bare):
        return "math"  # an ordinal, "15th"
    core = re.sub(r"\\(?:text|textbf|textit|mbox|mathrm|operatorname)\s*\{([^{}]*)\}", r" \1 ", bare)
    has_command = bool(re.search(r"\\[a-zA-Z]+", core))
    core = _ASCII_MATH_WORDS.sub("", re.sub(r"\\[a-zA-Z]+", "", core))
    if re.search(r"[A-Za-z]{2,}", core):
        return "word"
    if has_command or re.search(r"[0-9A-Za-z+\-*/^=<>()\[\]{}|√π∞²³°%!_.≤≥−·×]", core):
        return "math"
    return "glue"


def _runs(kinds: list[str]) -> list[tuple[int, int]]:
    """Maximal runs of math tokens, glue allowed between two math tokens."""
    runs, start, last = [], None, None
    for k, kind in enumerate(kinds):
        if kind == "math":
            if start is None:
                start = k
            last = k
        elif kind == "glue" and start is not None:
            continue
        else:
            if start is not None:
                runs.append((start, last + 1))
            start = last = None
    if start is not None:
        runs.append((start, last + 1))
    return runs


def _split_tokens(s: str) -> list[str]:
    """Whitespace-separated tokens; whitespace inside {...} does not split ("\\text{ cm}")."""
    tokens, depth, start = [], 0, None
    for i, ch in enumerate(s):
        if ch == "{" and (i == 0 or s[i - 1] != "\\"):
            depth += 1
        elif ch == "}" and (i == 0 or s[i - 1] != "\\") and depth > 0:
            depth -= 1
        if ch.isspace() and depth == 0:
            if start is not None:
                tokens.append(s[start:i])
                start = None
        elif start is None:
            start = i
    if start is not None:
        tokens.append(s[start:])
    return tokens


def _outside_latex(s: str) -> str:
    """The text outside LaTeX groups and commands ("\\frac{270}7\\text{ degrees}" -> " 7 ")."""
    prev = None
    for _ in range(MAX_NESTING_SCAN):
        if prev == s:
            break
        prev, s = s, re.sub(r"\{[^{}]*\}", " ", s)
    return re.sub(r"\\[a-zA-Z]+|\\.", " ", s)


_GLUED_UNIT = re.compile(
    r"([-+]?(?:\d[\d,]*\.\d+|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+))\s*(?:km|cm|mm|m|kg|mg|g|mL|ml|L|ft|in|s|h)(?:\^?[23]|[²³])?"
)
_ATOM = re.compile("\x00(\\d+)\x00")


def _plain_span(s: str, atoms: list[str]) -> list[str] | None:
    """A span whose math spans are held as atoms: all of it when it is all mathematics (LaTeX
    or ASCII), a short text as a text answer, else the first math run of the prose (after its
    last "is" / "are" / "=" that a run follows), never a number taken out of an expression."""

    def restore(text: str) -> str:
        return _ATOM.sub(lambda m: atoms[int(m.group(1))].strip(), text)

    outside = [_token_kind(t) for t in _split_tokens(_outside_latex(s))[:80]]
    if "word" not in outside and ("math" in outside or "ambiguous" in outside or "\\" in s):
        text = restore(s).strip(" ,;:")
        return [text] if text else None
    tokens = _split_tokens(s)[:80]
    kinds = [_token_kind(t) for t in tokens]
    if "math" not in kinds:  # a worded answer ("Evelyn", "the Cougars"), a remark in brackets dropped
        s = re.sub(r"(?<=\S)\s*\((?=[^()]*[A-Za-z]{2})[^()]*\)$", "", s).strip()
        return [s] if s and len(s.split()) <= 4 else None
    runs = _runs(kinds)
    verbs = [k for k, t in enumerate(tokens) if t.lower().strip(",:") in _VERBS]
    if verbs:  # "the number of ways is 12", "the value of x is 5"
        later = [r for r in runs if r[0] > verbs[-1]]
        if later:
            runs = later
    if len(runs) > 1 and runs[0][1] - runs[0][0] == 1:
        first = restore(tokens[runs[0][0]])
        if re.fullmatch(r"\(?[A-Za-z]\)?[,.]?", first) and not re.fullmatch(r"\(?[A-E]\)?[,.]?", first):
            runs = runs[1:]  # "the value of x is 5": a variable named before its value
    start, end = runs[0]
    run = tokens[start:end]
    mark = tokens[end].lower().strip(",.;:") if end < len(tokens) else ""
    text = restore(" ".join(run)).strip(" ,;:")
    text = re.sub(r"^=\s*", "", text).rstrip(".")
    glued = _GLUED_UNIT.fullmatch(text)  # "1,000.99m²": a number with its unit in prose
    if glued:
        text = glued.group(1)
    if re.fullmatch(r"[-+]?\d[\d,]*(?:\.\d+)?", text):
        text = normalize_plain_number(text)  # "1,000.99", a decimal comma "2,74"
    if mark in _UNIT_MARKS:
        text += _UNIT_MARKS[mark]
    return [text] if text else None


def read_span(span: str) -> list[str] | None:
    """The answer a span states, whole: its mathematics (math spans, LaTeX or ASCII) up to the
    end, else a short worded answer. None when it states none."""
    s = _QUOTES.sub("", strip_bold(span).strip()).strip()
    s = _HOPE.sub("", s)
    m = _FILLER.match(s)
    if m:
        s = s[m.end() :]
    s = s.strip().rstrip(" ,;:?").strip()
    if s.endswith("!") and not re.search(r"(?:[\d)}]|(?<![A-Za-z])[A-Za-z])!$", s):  # "5!", "n!": factorials
        s = s[:-1].rstrip()
    if s.endswith(".") and not s.endswith("\\."):
        s = s[:-1].rstrip()
    if not s or "\x00" in s:
        return None
    atoms: list[str] = []

    def hold(m: re.Match) -> str:
        atoms.append(next(g for g in m.groups() if g is not None))
        return f"\x00{len(atoms) - 1}\x00"

    return _plain_span(_MATH_SPAN.sub(hold, s), atoms)


def _after_last_is(phrase: str) -> str:
    """ "The largest $n$ is 34" -> "34" (an " is " outside math spans)."""
    masked = _mask_math(phrase)
    k = masked.rfind(" is ")
    return phrase[k + 4 :] if k >= 0 and phrase[k + 4 :].strip() else phrase


def _states_answer(sentence: str) -> list[str] | None:
    """The answer of a sentence after its trigger, or None when it judges instead ("... is
    correct", "... is not 5") or states nothing."""
    s = _QUOTES.sub("", strip_bold(sentence).strip()).strip()
    m = _FILLER.match(s)
    if _JUDGMENT.match(s[m.end() :] if m else s):
        return None
    return read_span(s)


@dataclass
class Reading:
    """What a text answers: `parts` (several: a list), the reading that found it, and the other
    answers it commits to (other boxes, an "Answer:" line, a later answer sentence), which a
    hedge check compares too."""

    parts: list[str]
    source: str
    others: list[list[str]] = field(default_factory=list)
    end: int = 0
    #: the sentence or line the answer was read from (a box: its contents)
    statement: str = ""


def _offered_together(separator: str) -> bool:
    """Two boxes in one sentence, at most three words apart."""
    return not _SENTENCE_END.search(separator) and len(_WORDS.findall(separator)) <= 3


def box_groups(text: str) -> list[tuple[int, int, list[str]]]:
    """Every group of \\boxed{} answers as (start, end, contents); adjacent boxes joined by
    "and" / "," -like separators form one group."""
    spans = []
    pos = 0
    while (m := _BOX_RE.search(text, pos)) is not None:
        end = _match_brace(text, m.end() - 1)
        inner_end = end - 1 if text[end - 1 : end] == "}" else end
        spans.append((m.start(), end, text[m.end() : inner_end]))
        pos = max(end, m.end())
    groups: list[tuple[int, int, list[str]]] = []
    for span in spans:
        if groups and _joinable(text[groups[-1][1] : span[0]]):
            start, _, parts = groups[-1]
            groups[-1] = (start, span[1], parts + [span[2]])
        else:
            groups.append((span[0], span[1], [span[2]]))
    groups = [g for g in groups if any(p.strip() for p in g[2])]
    # Boxes a few words apart in one sentence are offered together ("\\boxed{3} and later
    # \\boxed{4}"): one group.
    while len(groups) > 1 and _offered_together(text[groups[-2][1] : groups[-1][0]]):
        (start, _, first), (_, end, last) = groups[-2], groups[-1]
        groups[-2:] = [(start, end, first + last)]
    return groups


def _answer_line(text: str) -> tuple[list[str], int, str] | None:
    """The last "Answer:" line (or "Answer $9$" without the colon, at a line's start) that
    states an answer: (its answer, its start offset)."""
    matches = sorted(
        list(_ANSWER_LINE.finditer(text))[-20:] + list(_ANSWER_BARE.finditer(text))[-20:], key=lambda m: m.start()
    )
    for m in reversed(matches):
        line = text[m.end() : m.end() + _SENTENCE_WINDOW].split("\n", 1)[0]
        if not line.strip() or line.count("$$") % 2 or ("\\[" in line and "\\]" not in line):  # "Answer:\n$$5$$"
            line = sentence_after(text, m.end())[0]
        inner = _ANSWER_SENTENCE.search(line)
        if inner:  # "Answer: The final answer is $5$."
            line = sentence_after(line, inner.end())[0]
        parts = _states_answer(line)
        if parts:
            return parts, m.start(), line
    return None


def _answer_sentence(
    text: str, pattern: re.Pattern = _ANSWER_SENTENCE, after: int = 0
) -> tuple[list[str], int, str] | None:
    """The last answer sentence that states an answer: (its answer, its start offset, the
    sentence after the trigger)."""
    matches = [m for m in pattern.finditer(text) if m.start() >= after][-20:]
    for m in reversed(matches):
        sentence, _ = sentence_after(text, m.end())
        parts = _states_answer(sentence)
        if parts:
            return parts, m.start(), sentence
    return None


def _conclusion(text: str) -> tuple[list[str], int, str] | None:
    """The last "therefore ... = x" sentence near the end of the text, when it has math."""
    start = max(0, len(text.rstrip()) - _CONCLUSION_WINDOW)
    found = _answer_sentence(text, _CONCLUSION, after=start)
    if found is None:
        return None
    parts, _, sentence = found
    sentence = _mask_math(sentence)
    if not re.search(r"=|\b(?:is|are|was|equals|gives|get|obtain)\b", sentence) and not re.search(
        r"=", " ".join(parts)
    ):
        return None  # "so we need to find $x$ such that": states no value
    if not re.search(r"[\d\\^=+*/]|(?<![A-Za-z])[A-Za-z](?![A-Za-z])", " ".join(parts)):
        return None  # a conclusion in words only ("so we are done"): no answer
    return found


_CLOSING = re.compile(r"[\s.!]*$")
_CLAUSE_END = re.compile(r"[.;!?:](?=\s)|\n")


def _final_clause(body: str) -> int:
    """Where the final clause of a text starts (after the last ". ", ";", ":", "?" or line
    break outside math, at most a sentence window back)."""
    masked = _mask_math(body)
    ends = [m.end() for m in _CLAUSE_END.finditer(masked) if m.end() < len(masked.rstrip(" .!\n"))]
    return max(ends[-1] if ends else 0, len(body) - _SENTENCE_WINDOW)


def _final_formula(text: str) -> tuple[list[str], int, str] | None:
    """The answer that closes a long text with no answer marker, when it ends a sentence:

    1. its last math span(s) followed only by the text's final punctuation ("We find that
       $x \\lt 3$.", "... the system is $(7, 6)$.");
    2. else its final sentence's value after its last "is" / "are" / "=" ("... the probability
       that Alice wins is 2/3.");
    3. else a lone last number of the final sentence ("... increases by 100%.").

    Not when that clause sets up or restates instead of concluding (`_CONDITION`: "we need
    $x > 0$.", "suppose $n = 5$.", "is it $5$?"), nor when the text stops mid-sentence (a
    truncated response: its last number is no answer)."""
    body = _SIGN_OFF.sub("", _HOPE.sub("", text)).rstrip()
    if not re.search(r"[.!]$|\$$|\\\]$", body):
        return None  # cut off mid-sentence
    start = _final_clause(body)
    clause = body[start:]
    if _CONDITION.search(_mask_math(clause)):
        return None
    spans = list(_MATH_SPAN.finditer(body))
    if spans and spans[-1].start() >= start and _CLOSING.fullmatch(body[spans[-1].end() :]):
        found = find_math_spans(body[start:])
        if found:
            return found, start, clause
    if spans and spans[-1].end() > start:  # prose after the clause's last formula: read the prose
        start = spans[-1].end()
        clause = body[start:]
    verb = list(re.finditer(r"\s(?:is|are|was|equals|=)\s", clause))
    if verb:
        parts = read_span(clause[verb[-1].end() :])
        if parts:
            return parts, start, clause
    tail = clause.rstrip(" .!")[-80:]
    last = re.search(r"(?:\d|\.\d)[\d,.]*(\s*(?:%|\\%|percent))?$", tail)
    num = lone_number(tail[: last.start() + len(last.group()) - len(last.group(1) or "")]) if last else None
    if num is not None:
        return [num + ("%" if last.group(1) else "")], start, clause  # type: ignore[union-attr]
    return None


def lone_number(text: str) -> str | None:
    """The last number of prose when it stands alone: not an operand ("2*pi + 18", "2*pi+18",
    "15x" give none), so a last-number reading never cuts a number out of an expression."""
    matches = list(_PLAIN_NUMBER.finditer(text))
    if not matches:
        return None
    last = matches[-1]
    before = text[: last.start()].rstrip()[-1:]
    after = text[last.end() :]
    if before and before in "+-*/^×·_<>\\":
        return None
    if last.group()[0] in "+-" and before and (before.isalnum() or before in ")}]"):
        return None  # "2*pi+18": the sign is an operator
    if after[:1].isalpha() or (after[:1] and after[:1] in "^_(") or after.lstrip()[:1] in tuple("+-*/^×·=<>"):
        return None
    return normalize_plain_number(last.group())


#: Texts up to this long may be a bare answer or a short solution: they also get the readings
#: of the whole text (its math, the text itself, a lone number).
SHORT_TEXT = 300


def read_answer(text: str) -> Reading | None:
    """The final answer of `text` by the documented order of readings (module comment above).

    One reading for every text: a whole response (`compute_score`) and a bare answer
    (`is_equivalent`, the gold) go through the same steps. None means "no answer".
    """
    text = preprocess(text)
    boxes = box_groups(text)
    # The last committed statement (a box group, an "Answer:" line, a "final answer is" or
    # "the answer is" sentence), whichever comes last: earlier ones were superseded.
    statements = []
    if boxes:
        statements.append((boxes[-1][0], "boxed", boxes[-1][2], ", ".join(boxes[-1][2])))
    line = _answer_line(text)
    if line is not None:
        statements.append((line[1], "answer", line[0], line[2]))
    for pattern in (_FINAL_SENTENCE, _ANSWER_SENTENCE):
        found = _answer_sentence(text, pattern)
        if found is not None and not any(_BOX_RE.search(p) for p in found[0]):
            statements.append((found[1], "sentence", found[0], found[2]))
    if statements:
        pos, source, parts, said = max(statements, key=lambda st: st[0])
        # Earlier box groups: a list or set gold may be answered over several boxes.
        others = [g[2] for g in boxes[:-1]] if source == "boxed" else []
        return Reading(parts, source, others, pos, said)
    for source, found in (("result", _answer_sentence(text, _RESULT_SENTENCE)), ("conclusion", _conclusion(text))):
        if found is not None:
            return Reading(found[0], source, statement=found[2])
    if _MENTIONS_ANSWER.search(text):
        return None  # it speaks of its answer without stating one ("the answer is not 5")
    stripped = text.strip()
    stripped = _SIGN_OFF.sub("", stripped).rstrip()
    if len(stripped) > SHORT_TEXT:
        found = _final_formula(stripped)
        return None if found is None else Reading(found[0], "formula", statement=found[2])
    prose = _outside_latex(_mask_math(stripped[_final_clause(stripped) :]))
    if _CONDITION.search(prose):
        return None  # a short sentence that sets up ("so we need to find $x$ such that")
    return _short_text(stripped)


def _short_text(stripped: str) -> Reading | None:
    """Readings of a short text (a bare answer or a short solution) with no answer marker."""
    text = stripped
    spans = find_math_spans(text)
    if spans:
        tail = text[text.rfind(spans[-1]) + len(spans[-1]) :]
        if len(tail) > 30 and (num := lone_number(tail)) is not None:
            return Reading([num], "number")
        return Reading(spans, "math")
    if has_colon_labels(stripped):
        return Reading([stripped], "raw")  # "Smallest: 2, Largest: 9"
    bare = stripped.strip("$€ ").rstrip(".")
    if re.fullmatch(r"\[[^\[\],;]+\]", bare):
        bare = bare[1:-1].strip()  # "[5]": one value in brackets (an interval has two)
    if _PLAIN_NUMBER.fullmatch(bare):
        return Reading([normalize_plain_number(bare)], "raw")
    unit = _NUMBER_WITH_UNIT.fullmatch(bare)
    if unit and not (set(w.lower() for w in _WORDS.findall(unit.group(2))) & _MATH_WORDS):
        return Reading([normalize_plain_number(unit.group(1))], "raw")  # "540 degrees", "20 cm^2"
    if len(stripped) <= 40 and not re.search(r"[A-Za-z]{2,}\s*[\s:'.]\s*[A-Za-z0-9]", stripped):
        return Reading([stripped], "raw")  # a short answer as a whole ("Maximum = 2, Minimum = 1")
    if "\n" not in stripped and len(stripped) <= 300:
        parts = read_span(stripped)
        if parts:
            return Reading(parts, "raw")
    if "\\" not in stripped and re.search(r"[A-Za-z]{2,}", stripped):
        num = lone_number(stripped)
        if num is not None:
            return Reading([num], "number")
    if not stripped or (re.search(r"[A-Za-z]{2,}\s+[A-Za-z]{2,}", stripped) and "\\" not in stripped):
        return None  # prose that states no answer ("I could not solve it.")
    return Reading([stripped], "raw")


def extract_final_answer(text: str) -> tuple[list[str], str]:
    """Return (answer parts, source): `read_answer` for a bare answer or a solution text.

    Several parts mean several answers joined by "and"/","-like separators (a list).
    """
    reading = read_answer(text)
    return (reading.parts, reading.source) if reading is not None else ([], "none")
