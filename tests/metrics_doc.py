"""The metrics.jsonl keys that docs/metrics.md documents (its table and its "Extra keys")."""

from __future__ import annotations

import re
from pathlib import Path

METRICS_DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def table_keys() -> set:
    """Keys in the first column of the table; ``a_mean` / `_max`` stands for a_mean and a_max."""
    keys = set()
    for line in METRICS_DOC.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names = re.findall(r"`([a-z][a-z0-9_]*)`", first)
        keys |= set(names)
        if names:
            keys |= {names[0].rsplit("_", 1)[0] + suffix for suffix in re.findall(r"`(_[a-z]+)`", first)}
    return keys


def documented_keys() -> set:
    """Table keys plus the plain keys of the "Extra keys" paragraph (``eval/<dataset>/...`` left out)."""
    text = METRICS_DOC.read_text()
    return table_keys() | set(re.findall(r"`([a-z0-9_]+)`", text[text.index("Extra keys") :]))
