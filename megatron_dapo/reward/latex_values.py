"""The values the LaTeX answer parser (`latex`) produces besides sympy expressions.

`Seq` (tuples, bare lists, sets, intervals, ratios), `Rel` (relation chains), `Text` (words),
the ± marker `PM`, and `ParseError`, raised for text the parser does not understand.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

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
