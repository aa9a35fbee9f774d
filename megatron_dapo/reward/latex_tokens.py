"""The tokenizer of the LaTeX answer parser (`latex`) and the vocabulary the grammar knows.

`tokenize` splits answer text into (kind, text) tokens; the tables name the functions (LaTeX
and ASCII), their inverses, Greek letters, relation and multiplication commands, and the
commands that are layout only.
"""

from __future__ import annotations

import re

import sympy

from .latex_values import ParseError
from .sympy_build import make_pow

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
    "sin": sympy.sin,
    "cos": sympy.cos,
    "tan": sympy.tan,
    "sec": sympy.sec,
    "csc": sympy.csc,
    "cot": sympy.cot,
    "arcsin": sympy.asin,
    "arccos": sympy.acos,
    "arctan": sympy.atan,
    "sinh": sympy.sinh,
    "cosh": sympy.cosh,
    "tanh": sympy.tanh,
    "exp": sympy.exp,
    "ln": sympy.log,
    "log": sympy.log,
    "lg": lambda x: sympy.log(x, 10),
}
_ASCII_FUNCS = {"sqrt": sympy.sqrt, "cbrt": lambda x: make_pow(x, sympy.Rational(1, 3)), "abs": sympy.Abs}
_INVERSES = {
    sympy.sin: sympy.asin,
    sympy.cos: sympy.acos,
    sympy.tan: sympy.atan,
    sympy.cot: sympy.acot,
    sympy.sinh: sympy.asinh,
    sympy.cosh: sympy.acosh,
    sympy.tanh: sympy.atanh,
}
_GREEK = {
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
}
_REL_CMDS = {
    "le": "<=",
    "leq": "<=",
    "leqslant": "<=",
    "ge": ">=",
    "geq": ">=",
    "geqslant": ">=",
    "lt": "<",
    "gt": ">",
    "ne": "!=",
    "neq": "!=",
    "approx": "~",
    "in": "in",
    "eq": "=",
}
_REL_OPS = {"=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "=<": "<=", "=>": ">=", "!=": "!="}
_MUL_CMDS = {"cdot", "times", "ast"}
_IGNORED_CMDS = {"displaystyle", "textstyle", "limits", "nolimits", "circ", "degree", "angle", "mathstrut"}
_FUNCTION_LETTERS = {"f", "g", "h"}


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
