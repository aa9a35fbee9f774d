"""A small LaTeX answer parser for `math` mode: answer text -> sympy values.

Own recursive-descent parser (no antlr, no `eval`), covering what final answers use:
numbers (decimals kept exact as rationals), + - * / ^, implicit multiplication, \\frac (with
the \\frac12 shorthand), \\sqrt, \\pi, e, \\infty, factorial, functions (\\sin, \\log, ...),
subscripts, base-n literals (204_5), |x|, tuples, intervals, sets, \\cup, \\pm, relations
(=, <, \\le, ...), matrices, \\sum, and \\text{}.

Values produced: sympy expressions (matrices as ImmutableMatrix), `Seq` (tuples, bare lists,
sets, intervals), `Rel` (relation chains) and `Text` (words). Every size that could explode
(powers, factorials, literal lengths, nesting) is checked against `guards` first.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import sympy

from .guards import (
    MAX_BIGOP_DIGITS,
    MAX_BIGOP_TERM_OPS,
    MAX_BIGOP_TERMS,
    MAX_BINOM_ARG,
    MAX_FACTORIAL,
    MAX_ITEMS,
    MAX_NESTING,
    MAX_NUMBER_DIGITS,
    MAX_OTHER_EXPONENT,
    MAX_POWER_DIGITS,
    MAX_SUM_TERMS,
    MAX_SYMBOL_EXPONENT,
    MAX_SYMBOLIC_EXPONENT,
    TooComplex,
    check_parsable,
)

#: The ± marker: a ± b parses as a + PM*b and expands to the two values later.
PM = sympy.Symbol("__pm__")


class ParseError(Exception):
    """The text is not an answer this parser understands."""


@dataclass(frozen=True)
class Seq:
    """An ordered collection: kind is "tuple" ( ), "bracket" [ ], "interval" (mixed), "set" \\{ \\} or "list" (bare)."""

    items: tuple
    kind: str
    left: str = ""
    right: str = ""


@dataclass(frozen=True)
class Rel:
    """A relation chain parts[0] ops[0] parts[1] ...; ops are "=", "<", "<=", ">", ">=", "!=", "~", "in"."""

    ops: tuple
    parts: tuple


@dataclass(frozen=True)
class Text:
    """A textual answer (words), compared as a normalised string."""

    text: str


# --------------------------------------------------------------------------- tokens
_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>\d+(?:\.\d+)?|\.\d+)
  | (?P<rowsep>\\\\)
  | (?P<cmd>\\[a-zA-Z]+|\\[{}|%$#&_])
  | (?P<word>[a-zA-Z]+)
  | (?P<op><=|>=|!=|=<|=>|[-+*/^_()\[\]{},;:=<>!|&'])
    """,
    re.VERBOSE,
)

_FUNCS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "sec": sympy.sec, "csc": sympy.csc,
    "cot": sympy.cot, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "sinh": sympy.sinh, "cosh": sympy.cosh, "tanh": sympy.tanh, "exp": sympy.exp,
    "ln": sympy.log, "log": sympy.log, "lg": lambda x: sympy.log(x, 10),
}
_ASCII_FUNCS = {"sqrt": sympy.sqrt, "cbrt": lambda x: make_pow(x, sympy.Rational(1, 3)), "abs": sympy.Abs}
_INVERSES = {sympy.sin: sympy.asin, sympy.cos: sympy.acos, sympy.tan: sympy.atan, sympy.cot: sympy.acot,
             sympy.sinh: sympy.asinh, sympy.cosh: sympy.acosh, sympy.tanh: sympy.atanh}
_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon", "phi",
    "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Sigma",
    "Phi", "Psi", "Omega",
}
_REL_CMDS = {
    "le": "<=", "leq": "<=", "leqslant": "<=", "ge": ">=", "geq": ">=", "geqslant": ">=",
    "lt": "<", "gt": ">", "ne": "!=", "neq": "!=", "approx": "~", "in": "in", "eq": "=",
}
_REL_OPS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "=<": "<=", "=>": ">=", "!=": "!="}
_MUL_CMDS = {"cdot", "times", "ast"}
_IGNORED_CMDS = {"displaystyle", "textstyle", "limits", "nolimits", "circ", "degree", "angle", "mathstrut"}
_FUNCTION_LETTERS = {"f", "g", "h"}
_SYMBOL_CACHE: dict[str, sympy.Symbol] = {}


def _sym(name: str) -> sympy.Symbol:
    sym = _SYMBOL_CACHE.get(name)
    if sym is None:
        sym = _SYMBOL_CACHE[name] = sympy.Symbol(name)
    return sym


def tokenize(text: str) -> list[tuple[str, str]]:
    """Split LaTeX into (kind, text) tokens; ParseError on a character we do not know."""
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if not m:
            raise ParseError(f"unexpected character {text[pos]!r}")
        kind = m.lastgroup
        if kind != "ws":
            tokens.append((kind, m.group()))
        pos = m.end()
    return tokens


# --------------------------------------------------------------------------- numbers
def make_number(text: str) -> sympy.Expr:
    """Exact number from a decimal literal ("1000.0" -> 1000, "0.5" -> 1/2)."""
    if len(text) > MAX_NUMBER_DIGITS:
        raise TooComplex("number literal too long")
    if "." in text:
        whole, frac = text.split(".")
        return sympy.Rational(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
    return sympy.Integer(int(text))


def _digits_estimate(value: sympy.Expr) -> float:
    """Rough decimal size of a rational (numerator/denominator digits)."""
    p, q = sympy.fraction(value)
    return max(abs(int(p)).bit_length(), abs(int(q)).bit_length()) * 0.30103 + 1


def check_power_cost(base: sympy.Expr, n: int) -> None:
    """Raise TooComplex when ``base**e`` with ``|numerator of e| = n`` would be costly.

    sympy rewrites ``((x-1)^2)^n`` as ``(x-1)^(2n)`` and ``(2x)^n`` as ``2^n x^n``, and the
    checks later expand sums and evaluate at rational points, so each factor of the base is
    checked with the exponent it will really carry: a rational's digits times n, a symbol's
    total exponent, a sum's expansion degree.
    """
    for factor in sympy.Mul.make_args(base):
        if factor.is_Rational:
            if factor not in (0, 1, -1) and _digits_estimate(factor) * n > MAX_POWER_DIGITS:
                raise TooComplex("power too large")
        elif factor.is_Symbol:
            if n > MAX_SYMBOL_EXPONENT:
                raise TooComplex("symbolic power too large")
        elif factor.is_Pow and factor.exp.is_Rational:
            check_power_cost(factor.base, n * abs(int(factor.exp.p)))
        elif factor.is_Add:
            if n > MAX_SYMBOLIC_EXPONENT:
                raise TooComplex("power of a sum too large")
        elif n > MAX_OTHER_EXPONENT:
            raise TooComplex("power too large")


def make_pow(base, exp):
    """base**exp with size guards (refuses 9^(9^(9^9)), ((x-1)^2)^(10^8) and friends)."""
    if not isinstance(base, sympy.Basic) or not isinstance(exp, sympy.Basic):
        raise ParseError("power of a non-expression")
    if isinstance(base, sympy.MatrixBase):
        if exp.is_Integer and 0 <= int(exp) <= 16:
            return base ** int(exp)
        raise ParseError("matrix power")
    if exp.is_number and not exp.free_symbols:
        if exp.is_Rational:
            if abs(exp.p) > 10**6 and base.is_number and base not in (sympy.Integer(1), sympy.Integer(0), sympy.Integer(-1)):
                raise TooComplex("exponent too large")
            if abs(exp.p) > 1 and base not in (sympy.Integer(1), sympy.Integer(0), sympy.Integer(-1)):
                check_power_cost(base, abs(int(exp.p)))
        else:
            approx = sympy.N(exp, 15)
            if approx.is_real and abs(approx) > 10**6:
                raise TooComplex("exponent too large")
    elif exp.free_symbols and any(a.is_number and a.is_Rational and abs(a) > 10**6 for a in exp.atoms(sympy.Rational)):
        raise TooComplex("exponent too large")
    return sympy.Pow(base, exp)


def make_binomial(n, k):
    """binomial(n, k) with size guards (a huge value, or a huge argument beside a symbol)."""
    numbers = [a for a in (n, k) if a.is_number]
    if any(not a.is_finite for a in numbers):
        raise ParseError("binomial of infinity")
    if n.is_Integer and k.is_Integer:
        small = min(int(k), int(n) - int(k))
        if int(n) > MAX_BINOM_ARG and small > 0:
            # log10 C(n, k) <= k log10(e n / k)
            if small * (math.log10(int(n)) - math.log10(small) + 0.44) > MAX_POWER_DIGITS:
                raise TooComplex("binomial too large")
        return sympy.binomial(n, k)
    for a in (n, k):
        if any(abs(r) > MAX_BINOM_ARG for r in a.atoms(sympy.Rational)):
            raise TooComplex("binomial argument too large")
    return sympy.binomial(n, k)


def make_factorial(value):
    if value.is_Integer:
        if int(value) > MAX_FACTORIAL:
            raise TooComplex("factorial too large")
        if int(value) < 0:
            raise ParseError("negative factorial")
    elif value.is_number:
        raise ParseError("factorial of a non-integer")
    return sympy.factorial(value)


# --------------------------------------------------------------------------- parser
class _Parser:
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
            if name in _REL_CMDS or name in _MUL_CMDS or name in ("cup", "cap", "setminus", "pm", "mp", "div", "end", "right", "}", "rfloor", "rceil", "quad", "lor", "land"):
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

    def parse_brackets(self):
        left = self.next()[1]
        closers = (")", "]") if left in ("(", "[") else ("\\}",)
        value = self.parse_list(stops=closers)
        right = self.next()[1]
        if right not in closers:
            raise ParseError(f"unclosed {left}")
        if left == "\\{":
            items = value.items if isinstance(value, Seq) and value.kind == "list" else (value,)
            return Seq(tuple(items), "set", "{", "}")
        if isinstance(value, Seq) and value.kind == "list":
            kind = "tuple" if (left, right) == ("(", ")") else "bracket" if (left, right) == ("[", "]") else "interval"
            return Seq(value.items, kind, left, right)
        if (left, right) in (("(", ")"), ("[", "]")):
            return value
        raise ParseError("mismatched brackets")

    def parse_matrix(self, env: str):
        if env == "array" and self.at("{"):
            self.raw_group()
        rows, row = [], []
        while True:
            if self.at("\\end"):
                self.next()
                self.raw_group()
                break
            if self.peek()[0] == "eof":
                raise ParseError("unclosed matrix")
            if self.peek()[0] == "rowsep":
                self.next()
                if row:
                    rows.append(row)
                row = []
                continue
            if self.at("&"):
                self.next()
                continue
            row.append(_expr(self.parse_expr()))
        if row:
            rows.append(row)
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError("ragged matrix")
        return sympy.ImmutableMatrix(rows)

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
            if name in ("overline", "bar", "boxed", "fbox", "mathbf", "mathrm", "mathit", "operatorname", "hat", "vec", "widehat", "tilde"):
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

    def parse_bigop(self, kind: str):
        """\\sum / \\prod with an index ``_{k=a}`` and a bound ``^{b}`` (either order, \\limits allowed).

        The index letter is bound while the body is parsed (``i`` and ``e`` are then the index,
        not the constants). Numeric bounds are evaluated term by term (`bigop_value`).
        """
        lower = upper = var = None
        for _ in range(4):
            if self.at("\\limits", "\\nolimits", "\\displaystyle"):
                self.next()
            elif self.at("_") and var is None:
                self.next()
                var, lower = self.bigop_index()
            elif self.at("^") and upper is None:
                self.next()
                upper = _expr(self.parse_script())
            else:
                break
        if var is None or upper is None:
            raise ParseError(f"{kind} without limits")
        saved = dict(self.bound)
        self.bound[var.name] = var
        try:
            body = _expr(self.parse_term())
        finally:
            self.bound = saved
        return bigop_value(kind, body, var, lower, upper)

    def bigop_index(self):
        """(index symbol, lower bound) of ``_{k=1}`` / ``_k=1`` / ``_{k = 1}``."""
        braced = self.at("{")
        if braced:
            self.next()
        kind, text = self.next()
        if kind == "word" and len(text) == 1:
            var = _sym(text)
        elif kind == "cmd" and text[1:] in _GREEK:
            var = _sym(text[1:])
        else:
            raise ParseError("sum without index")
        if not self.at("="):
            raise ParseError("sum without index")
        self.next()
        if braced:
            lower = _expr(self.parse_list(stops=("}",)))
            self.expect("}")
        else:
            lower = _expr(self.parse_script())
        return var, lower


def guarded_subs(expr, var: sympy.Symbol, value):
    """`expr` with `var` replaced by `value`, rebuilt through the size guards (make_pow ...).

    A plain substitution would evaluate ``k^{k}`` at k = 2000, or ``2^{2^{k}}``, before any
    check could see it; here each power, factorial and binomial is checked as it is rebuilt.
    """
    if expr == var:
        return value
    if not expr.args or not expr.has(var):
        return expr
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        raise TooComplex("nested sum with a symbolic bound")
    args = [guarded_subs(a, var, value) for a in expr.args]
    if expr.is_Pow:
        return make_pow(args[0], args[1])
    if isinstance(expr, sympy.factorial):
        return make_factorial(args[0])
    if isinstance(expr, sympy.binomial):
        return make_binomial(*args)
    return expr.func(*args)


def bigop_value(kind: str, body, var, lower, upper):
    """The value of a sum or product.

    Numeric bounds: a polynomial sum in closed form; anything else term by term, each term
    rebuilt through the guards, at most `MAX_BIGOP_TERMS` terms and `MAX_BIGOP_DIGITS` digits
    of exact terms in all (``\\sum_{k=1}^{2000} k^{k}`` is refused, whatever its index letter
    or spelling, before sympy tries Euler-Maclaurin on it). Symbolic bounds: an unevaluated
    `sympy.Sum` within `check_sum_cost`; a product with a symbolic bound is not parsed.
    """
    if not (lower.is_number and upper.is_number):
        if kind == "prod":
            raise ParseError("product with a symbolic bound")
        check_sum_cost(body, lower, upper)
        return sympy.Sum(body, (var, lower, upper))
    if not (lower.is_Integer and upper.is_Integer):
        raise ParseError(f"{kind} with non-integer bounds")
    terms = int(upper) - int(lower) + 1
    if terms > MAX_SUM_TERMS:
        raise TooComplex(f"{kind} too long")
    if terms <= 0:
        return sympy.Integer(0 if kind == "sum" else 1)
    if kind == "sum" and body.is_polynomial(var):
        degree = sympy.degree(body, var) if body.has(var) else 0
        if degree > MAX_SYMBOLIC_EXPONENT or any(abs(r) > 10**6 for r in body.atoms(sympy.Rational)):
            raise TooComplex("sum of a high power")
        return sympy.summation(body, (var, lower, upper))
    if terms > MAX_BIGOP_TERMS:
        raise TooComplex(f"{kind} of too many general terms")
    values, digits = [], 0
    for k in range(int(lower), int(upper) + 1):
        term = guarded_subs(body, var, sympy.Integer(k))
        if term.is_Rational:
            digits += _digits_estimate(term)
            if digits > MAX_BIGOP_DIGITS:
                raise TooComplex(f"{kind} of huge terms")
        elif term.is_number and sympy.count_ops(term) > MAX_BIGOP_TERM_OPS:
            raise TooComplex(f"{kind} of complicated terms")
        values.append(term)
    return sympy.Add(*values) if kind == "sum" else sympy.Mul(*values)


def check_sum_cost(body: sympy.Expr, lower: sympy.Expr, upper: sympy.Expr) -> None:
    """Raise for a \\sum with a symbolic bound whose evaluation would be costly (high powers,
    huge constants)."""
    exponents = [abs(int(p.exp.p)) for p in body.atoms(sympy.Pow) if p.exp.is_Rational]
    if max(exponents, default=1) > MAX_SYMBOLIC_EXPONENT:
        raise TooComplex("symbolic sum of a high power")
    if any(not p.exp.is_number for p in body.atoms(sympy.Pow)):
        raise TooComplex("symbolic sum of a variable power")
    if any(abs(r) > 10**6 for r in body.atoms(sympy.Rational)):
        raise TooComplex("symbolic sum with huge constants")


def _text_value(raw: str):
    """\\text{...}: numbers parse as numbers, words become Text / symbols."""
    content = raw.strip()
    if not content:
        return sympy.Integer(1)
    if re.fullmatch(r"[-+]?\d+(\.\d+)?", content):
        return make_number(content.lstrip("+")) if not content.startswith("-") else -make_number(content[1:])
    if re.fullmatch(r"\(?[A-Za-z]\)?", content):
        letter = content.strip("()")
        return sympy.E if letter == "e" else sympy.I if letter == "i" else _sym(letter)
    words = " ".join(content.split())
    if re.fullmatch(r"[A-Za-z]+", words):
        return _sym(words)
    return Text(words)


def _expr(value):
    if isinstance(value, sympy.Basic):
        return value
    raise ParseError(f"expected an expression, got {type(value).__name__}")


def _apply_sign(sign, value):
    if sign is None or sign == "+":
        return value
    value = _expr(value)
    if sign == "-":
        return -value
    if sign == "\\pm":
        return PM * value
    if sign == "\\mp":
        return -PM * value
    raise ParseError(sign)


def _mul(a, b):
    a, b = _expr(a), _expr(b)
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        try:
            return a * b
        except Exception as exc:  # shape mismatch
            raise ParseError(str(exc)) from None
    return sympy.Mul(a, b)


def _div(a, b):
    a, b = _expr(a), _expr(b)
    if isinstance(b, sympy.MatrixBase):
        raise ParseError("division by a matrix")
    if b == 0:
        raise ParseError("division by zero")
    if isinstance(a, sympy.MatrixBase):
        return a / b
    return sympy.Mul(a, sympy.Pow(b, -1))


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
