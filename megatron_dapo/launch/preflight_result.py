"""The result types of the preflight checks (launch/preflight.py runs them).

A check returns a :class:`Check`: one line, ``[check] NAME TARGET: what was found``, or
``[check] FAIL ...`` / ``[check] WARN ...``; :class:`Checks` holds one preflight's, in order,
and raises :class:`PreflightError` (a ``ConfigError``: exit 2, one line) when any failed. Also
the statuses, :data:`SHAPE_ONLY_FILE` and the message helper the check modules share.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

from ..config import ConfigError

OK, WARN, FAIL = "ok", "warn", "fail"
#: A directory with this file holds a model's shape only (config.json): no weights, no tokenizer.
SHAPE_ONLY_FILE = "SHAPE_ONLY.md"


class PreflightError(ConfigError):
    """One or more preflight checks failed; the message lists each (one line)."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str  # prompt-data, eval-data, reward, tokenizer, hf-checkpoint, load, ..., disk, outputs, config
    status: str  # OK, WARN or FAIL
    target: str  # the path or flag value checked ("" when none)
    detail: str  # what was found; for WARN/FAIL what is wrong and the fix

    @property
    def line(self) -> str:
        tag = {OK: "", WARN: "WARN ", FAIL: "FAIL "}[self.status]
        target = f" {self.target}" if self.target else ""
        return f"[check] {tag}{self.name}{target}: {self.detail}"


class Checks(list):
    """The checks of one preflight, in order."""

    outputs_lines: List[str]
    #: the tokenizer the tokenizer check loaded, and from where (the driver reuses it)
    tokenizer: object
    tokenizer_dir: Optional[str]

    def __init__(self, items=()):
        super().__init__(items)
        self.outputs_lines = []
        self.tokenizer, self.tokenizer_dir = None, None

    @property
    def failed(self) -> List[Check]:
        return [c for c in self if c.status == FAIL]

    @property
    def warned(self) -> List[Check]:
        return [c for c in self if c.status == WARN]

    def lines(self) -> List[str]:
        return [c.line for c in self]

    def title(self) -> str:
        return f"{len(self)} checks: {len(self) - len(self.failed) - len(self.warned)} ok, {len(self.warned)} warnings, {len(self.failed)} failed"

    def raise_if_failed(self, what: str) -> None:
        bad = self.failed
        if bad:
            parts = "; ".join(f"{c.name}{' ' + c.target if c.target else ''}: {c.detail}" for c in bad)
            raise PreflightError(f"{what}: {len(bad)} of {len(self)} checks failed ([check] FAIL lines above): {parts}")


def _strip(msg: str, path: str) -> str:
    """``msg`` without a leading ``"<path>: "`` (the check's line names the path already)."""
    return msg[len(path) + 2 :] if path and msg.startswith(path + ": ") else msg


__all__ = ["Check", "Checks", "PreflightError", "SHAPE_ONLY_FILE"]
