"""A small LaTeX answer parser for `math` mode: answer text -> sympy values.

Own recursive-descent parser (no antlr, no `eval`), covering what final answers use:
numbers (decimals kept exact as rationals), + - * / ^, implicit multiplication, \\frac (with
the \\frac12 shorthand), \\sqrt, \\pi, e, \\infty, factorial, functions (\\sin, \\log, ...),
subscripts, base-n literals (204_5), |x|, tuples, intervals, sets, \\cup, \\pm, relations
(=, <, \\le, ...), matrices, \\sum, and \\text{}.

Values produced: sympy expressions (matrices as ImmutableMatrix), `Seq` (tuples, bare lists,
sets, intervals), `Rel` (relation chains) and `Text` (words). Every size that could explode
(powers, factorials, literal lengths, nesting) is checked against `guards` first.

Modules: `latex_values` (Seq, Rel, Text, PM, ParseError), `latex_tokens` (tokenizer and
vocabulary), `sympy_build` (size-guarded numbers, powers, binomials, factorials),
`latex_structures` (tuples, intervals, sets, matrices, sums and products) and this one (the
grammar and `parse_latex`); the public names of all of them are importable from here.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sympy

from .guards import MAX_ITEMS, MAX_NESTING, TooComplex, check_parsable
from .latex_structures import _StructuresMixin, bigop_value, check_sum_cost, guarded_subs
from .latex_tokens import (
    _ASCII_FUNCS,
    _FUNCS,
    _FUNCTION_LETTERS,
    _GREEK,
    _IGNORED_CMDS,
    _INVERSES,
    _MUL_CMDS,
    _REL_CMDS,
    _REL_OPS,
    tokenize,
)
from .latex_values import PM, ParseError, Rel, Seq, Text
from .sympy_build import (
    _apply_sign,
    _div,
    _expr,
    _mul,
    _sym,
    _text_value,
    check_power_cost,
    make_binomial,
    make_factorial,
    make_number,
    make_pow,
)

__all__ = [
    "PM",
    "ParseError",
    "Rel",
    "Seq",
    "Text",
    "bigop_value",
    "check_power_cost",
    "check_sum_cost",
    "guarded_subs",
    "make_binomial",
    "make_factorial",
    "make_number",
    "make_pow",
    "parse_latex",
    "tokenize",
]


# --------------------------------------------------------------------------- parser
class _Parser(_StructuresMixin):
    """Recursive-descent parser over the token list."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.toks = tokens
        self.i = 0
        self.depth = 0
        self.in_abs = False  # inside |...|: a "|" closes instead of opening
        self.bound: dict[str, sympy.Symbol] = {}  # index letters of enclosing sums and products

    # -- helpers
    def peek(self, offset: int = 0) -> tuple[str, str]:
        j = self.i + offset
        return self.toks[j] if j < len(self.toks) else ("eof", "")

    def next(self) -> tuple[str, str]:
        tok = self.peek()
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        return self.peek()[1] in texts and self.peek()[0] != "eof"

    def expect(self, text: str) -> None:
        tok = self.next()
        if tok[1] != text:
            raise ParseError(f"expected {text!r}, got {tok[1]!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING * 3:
            raise TooComplex("expression nested too deeply")

    def push_back(self, kind: str, text: str) -> None:
        self.toks.insert(self.i, (kind, text))

    # -- grammar
    def parse(self):
        value = self.parse_list(stops=())
        if self.peek()[0] != "eof":
            raise ParseError(f"trailing {self.peek()[1]!r}")
        return value

    def parse_list(self, stops: tuple[str, ...]):
        """Comma/semicolon separated items (a bare list when more than one)."""
        items = []
        connectives = set()
        while True:
            if self.at(",", ";"):  # empty item ("19, 46, , 82")
                self.next()
                continue
            if self.peek()[0] == "eof" or self.at(*stops):
                break
            items.append(self.parse_rel())
            if len(items) > MAX_ITEMS:
                raise TooComplex("too many items")
            if self.at(",", ";", "\\lor", "\\land"):
                connectives.add(self.next()[1])
                continue
            break
        if not items:
            raise ParseError("empty")
        if len(items) == 1:
            return items[0]
        # "x < -1 \lor x > 2" (a union) / "x > 1 \land x < 3" (an intersection): a list that
        # remembers its connective in `left`; only "and" changes what the list means.
        if "\\land" in connectives and "\\lor" in connectives:
            raise ParseError("mixed and/or")
        return Seq(tuple(items), "list", "and" if "\\land" in connectives else "")

    def rel_op(self) -> str | None:
        kind, text = self.peek()
        if kind == "op" and text in _REL_OPS:
            return _REL_OPS[text]
        if kind == "cmd" and text[1:] in _REL_CMDS:
            return _REL_CMDS[text[1:]]
        return None

    def parse_rel(self):
        parts = [self.parse_union()]
        ops = []
        while (op := self.rel_op()) is not None:
            self.next()
            ops.append(op)
            parts.append(self.parse_union())
        return parts[0] if not ops else Rel(tuple(ops), tuple(parts))

    def parse_union(self):
        left = self.parse_ratio()
        while self.at("\\cup", "\\cap", "\\setminus"):
            op = self.next()[1]
            right = self.parse_ratio()
            left = ("setop", op, left, right)
        return left

    def parse_ratio(self):
        left = self.parse_expr()
        if self.at(":"):
            parts = [left]
            while self.at(":"):
                self.next()
                parts.append(self.parse_expr())
            return Seq(tuple(parts), "ratio")
        return left

    def parse_expr(self):
        self.enter()
        terms = []
        sign = None
        if self.at("+", "-", "\\pm", "\\mp"):
            sign = self.next()[1]
        term = self.parse_term()
        terms.append(_apply_sign(sign, term))
        while self.at("+", "-", "\\pm", "\\mp"):
            sign = self.next()[1]
            while self.at("+", "-"):  # "+-" / "--"
                extra = self.next()[1]
                sign = {("+", "-"): "-", ("-", "-"): "+", ("-", "+"): "-"}.get((sign, extra), sign)
            terms.append(_apply_sign(sign, self.parse_term()))
        self.depth -= 1
        if len(terms) == 1:
            return terms[0]
        for t in terms:
            if not isinstance(t, sympy.Basic):
                raise ParseError("sum of non-expressions")
        if any(isinstance(t, sympy.MatrixBase) for t in terms):
            total = terms[0]
            for t in terms[1:]:
                total = total + t
            return total
        return sympy.Add(*terms)

    def starts_atom(self) -> bool:
        kind, text = self.peek()
        if kind in ("num", "word"):
            return True
        if kind == "op":
            return text in ("(", "[", "{") or (text == "|" and not self.in_abs)
        if kind == "cmd":
            name = text[1:]
            if (
                name in _REL_CMDS
                or name in _MUL_CMDS
                or name
                in (
                    "cup",
                    "cap",
                    "setminus",
                    "pm",
                    "mp",
                    "div",
                    "end",
                    "right",
                    "}",
                    "rfloor",
                    "rceil",
                    "quad",
                    "lor",
                    "land",
                )
            ):
                return False
            return True
        return False

    def parse_term(self):
        mixed = self.peek()[0] == "num" and "." not in self.peek()[1] and self.peek(1)[1] == "\\frac"
        value = self.parse_unary()
        if mixed and self.at("\\frac") and value.is_Integer:
            # Mixed number 15\frac{39}{40} = 15 + 39/40 (only with integer numerator/denominator).
            save = self.i
            frac = self.parse_power()
            if frac.is_Rational and not frac.is_Integer and 0 < frac < 1:
                value = value + frac
            else:
                self.i = save
        while True:
            if self.at("*") or (self.peek()[0] == "cmd" and self.peek()[1][1:] in _MUL_CMDS):
                self.next()
                value = _mul(value, self.parse_unary())
            elif self.at("/", "\\div"):
                self.next()
                right = self.parse_unary()
                value = _div(value, right)
            elif self.starts_atom():
                value = _mul(value, self.parse_power())
            else:
                return value

    def parse_unary(self):
        if self.at("-"):
            self.next()
            return _apply_sign("-", self.parse_unary())
        if self.at("+"):
            self.next()
            return self.parse_unary()
        if self.at("\\pm"):
            self.next()
            return _apply_sign("\\pm", self.parse_unary())
        return self.parse_power()

    def parse_power(self):
        base = self.parse_postfix()
        if self.at("^"):
            self.next()
            exp = self.parse_script()
            base = make_pow(_expr(base), _expr(exp))
            while self.at("!"):
                self.next()
                base = make_factorial(base)
        return base

    def parse_script(self):
        """The argument of ^: a {group}, one digit, one letter, a command atom, or -x."""
        if self.at("{"):
            return self.parse_group()
        if self.at("-"):
            self.next()
            return _apply_sign("-", self.parse_script())
        kind, text = self.peek()
        if kind == "num":
            self.next()
            if len(text) > 1 and "." not in text:
                self.push_back("num", text[1:])
                text = text[0]
            return make_number(text)
        if kind == "word":
            self.next()
            if len(text) > 1:
                self.push_back("word", text[1:])
            return self.word_value(text[0])
        return self.parse_postfix()

    def parse_postfix(self):
        value = self.parse_atom()
        while True:
            if self.at("!"):
                self.next()
                value = make_factorial(_expr(value))
            elif self.at("'"):
                self.next()
                value = _sym(f"{value}'") if isinstance(value, sympy.Symbol) else value
            else:
                return value

    def raw_group(self) -> str:
        """Text of a {...} group (or one token) as a string, for subscripts and \\text."""
        if not self.at("{"):
            kind, text = self.next()
            if kind == "eof":
                raise ParseError("missing argument")
            return text
        self.next()
        depth = 1
        parts = []
        while True:
            kind, text = self.next()
            if kind == "eof":
                raise ParseError("unclosed {")
            if text == "{" and kind == "op":
                depth += 1
            elif text == "}" and kind == "op":
                depth -= 1
                if depth == 0:
                    break
            parts.append(text)
        return " ".join(parts)

    def subscript(self) -> str:
        self.expect("_")
        if self.at("{"):
            return re.sub(r"\s+", "", self.raw_group())
        kind, text = self.next()
        if kind == "word":
            if len(text) > 1:
                self.push_back("word", text[1:])
            return text[0]
        if kind in ("num", "cmd"):
            return text
        raise ParseError("bad subscript")

    def parse_group(self):
        self.expect("{")
        value = self.parse_list(stops=("}",))
        self.expect("}")
        return value

    def parse_arg(self):
        """A \\frac / \\sqrt argument: {group}, one digit, one letter or one command atom."""
        if self.at("{"):
            return self.parse_group()
        kind, text = self.peek()
        if kind == "num":
            self.next()
            if len(text) > 1:
                self.push_back("num", text[1:].lstrip(".") if text[1] == "." else text[1:])
                text = text[0]
            return make_number(text)
        if kind == "word":
            self.next()
            if len(text) > 1:
                self.push_back("word", text[1:])
            return self.word_value(text[0])
        if kind == "cmd" or text == "(":
            return self.parse_atom()
        raise ParseError("missing argument")

    def word_value(self, word: str):
        if word in self.bound:  # the index of an enclosing \sum / \prod
            return self.bound[word]
        if word == "e":
            return sympy.E
        if word == "i":
            return sympy.I
        if word == "pi":
            return sympy.pi
        if word in ("inf", "infty", "infinity", "oo"):
            return sympy.oo
        return _sym(word)

    def parse_word(self, word: str):
        """Letters: a function name, a long word (one symbol) or single-letter symbols."""
        if word in _FUNCS:
            return self.apply_function(_FUNCS[word])
        if word in _ASCII_FUNCS:  # sqrt(5), sqrt 5, cbrt(2): ASCII math
            return self.apply_function(_ASCII_FUNCS[word])
        if word in ("pi", "inf", "infty", "infinity", "oo"):
            return self.word_value(word)
        if len(word) >= 3:
            value = _sym(word)
        else:
            if len(word) == 2:
                self.push_back("word", word[1])
            letter = word[0]
            if self.at("_"):
                sub = self.subscript()
                return _sym(f"{letter}_{sub}")
            if letter in _FUNCTION_LETTERS and self.at("("):
                self.next()
                arg = self.parse_list(stops=(")",))
                self.expect(")")
                args = arg.items if isinstance(arg, Seq) else (arg,)
                return sympy.Function(letter)(*[_expr(a) for a in args])
            return self.word_value(letter)
        if self.at("_"):
            value = _sym(f"{word}_{self.subscript()}")
        return value

    def apply_function(self, fn):
        power = None
        if self.at("^"):
            self.next()
            power = _expr(self.parse_script())
        base = None
        if self.at("_"):
            self.next()
            base = _expr(self.parse_script())
        if self.at("("):
            arg = self.parse_atom()
        elif self.at("{"):
            arg = self.parse_group()
        else:
            arg = self.parse_power()
        arg = _expr(arg)
        if power == -1 and fn in _INVERSES:
            return _INVERSES[fn](arg)  # \\tan^{-1} x is arctan x, not 1 / tan x
        value = sympy.log(arg, base) if (base is not None and fn is sympy.log) else fn(arg)
        return make_pow(value, power) if power is not None else value

    def parse_atom(self):
        kind, text = self.peek()
        if kind == "eof":
            raise ParseError("unexpected end")
        if kind == "num":
            self.next()
            value = make_number(text)
            if self.at("_"):  # base-n literal such as 204_5
                sub = self.subscript()
                if sub.isdigit() and 2 <= int(sub) <= 36 and "." not in text:
                    try:
                        return sympy.Integer(int(text, int(sub)))
                    except ValueError:
                        pass
                return _sym(f"{text}_{sub}")
            return value
        if kind == "word":
            self.next()
            return self.parse_word(text)
        if kind == "op":
            if text in ("(", "["):
                return self.parse_brackets()
            if text == "{":
                return self.parse_group()
            if text == "|":
                self.next()
                saved, self.in_abs = self.in_abs, True
                inner = self.parse_expr()
                self.in_abs = saved
                self.expect("|")
                return sympy.Abs(_expr(inner))
            raise ParseError(f"unexpected {text!r}")
        if kind == "cmd":
            name = text[1:]
            if name == "{":
                return self.parse_brackets()
            self.next()
            if name in ("frac", "dfrac", "tfrac", "cfrac"):
                num = _expr(self.parse_arg())
                den = _expr(self.parse_arg())
                return _div(num, den)
            if name in ("binom", "dbinom", "tbinom", "choose"):
                n, k = _expr(self.parse_arg()), _expr(self.parse_arg())
                return make_binomial(n, k)
            if name == "sqrt":
                index = None
                if self.at("["):
                    self.next()
                    index = _expr(self.parse_expr())
                    self.expect("]")
                arg = _expr(self.parse_arg())
                return sympy.sqrt(arg) if index is None else make_pow(arg, 1 / index)
            if name == "pi":
                return sympy.pi
            if name == "infty":
                return sympy.oo
            if name in ("emptyset", "varnothing"):
                return Seq((), "set", "{", "}")
            if name == "text":
                return _text_value(self.raw_group())
            if name in (
                "overline",
                "bar",
                "boxed",
                "fbox",
                "mathbf",
                "mathrm",
                "mathit",
                "operatorname",
                "hat",
                "vec",
                "widehat",
                "tilde",
            ):
                group = self.parse_group() if self.at("{") else self.parse_atom()
                return group
            if name in _GREEK:
                if self.at("_"):
                    return _sym(f"{name}_{self.subscript()}")
                return _sym(name)
            if name in _FUNCS:
                return self.apply_function(_FUNCS[name])
            if name in ("lfloor", "lceil"):
                inner = _expr(self.parse_expr())
                closer = "\\rfloor" if name == "lfloor" else "\\rceil"
                self.expect(closer)
                return sympy.floor(inner) if name == "lfloor" else sympy.ceiling(inner)
            if name == "begin":
                env = self.raw_group().replace(" ", "").rstrip("*")
                if env in ("pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix", "smallmatrix", "array"):
                    return self.parse_matrix(env)
                raise ParseError(f"environment {env}")
            if name in ("sum", "prod"):
                return self.parse_bigop(name)
            if name in _IGNORED_CMDS:
                if self.starts_atom():
                    return self.parse_atom()
                return sympy.Integer(1)
            raise ParseError(f"unknown command {text}")
        raise ParseError(f"unexpected {text!r}")


def parse_latex(text: str):
    """Parse a cleaned answer string into a value (see module docstring).

    Raises ParseError when the text is not understood and TooComplex when it is too big.
    Values are immutable, so parses are cached (a response's candidates and readings parse
    the same gold many times).
    """
    check_parsable(text)
    return _parse_cached(text)


@lru_cache(maxsize=4096)
def _parse_cached(text: str):
    return _Parser(tokenize(text)).parse()
