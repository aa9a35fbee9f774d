"""Convert HardVerify-Math (TinyV) into gold/pred/expected pairs for benchmarks/bench_verifier.py.

Input: ``benchmarks/HardVerify-Math.json`` of the public repository uw-nsl/TinyV (MIT licence),
read at commit d4a3ae59566e3c0a2a5b7b235aef53a5e834a320. Each of its 250 items holds a question,
a ground truth, a correct answer that rule-based checkers miss (``fn_output``) and a wrong one
(``tn_output``). Each item gives two pairs: (ground_truth, fn_output, expected=1) and
(ground_truth, tn_output, expected=0).

Dropped: items whose source is MATH-500 and any item whose question also appears in an
evaluation file used elsewhere in this project (``../shared/data/eval``: AIME 2024, MATH-500,
AMC 2023, GSM8K test), so that none of these pairs comes from those sets.

Split: items with an even ``id`` are the ``dev`` half (which may be looked at while developing
the verifier), odd ids the ``heldout`` half (only measured). See README.md beside this file.

Usage::

    python benchmarks/data/verifier/convert_hardverify.py PATH/TO/HardVerify-Math.json \\
        [--out benchmarks/data/verifier/hardverify-math-pairs.jsonl]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
EVAL_DIR = ROOT.parent / "shared" / "data" / "eval"
DEFAULT_OUT = HERE / "hardverify-math-pairs.jsonl"


def _key(text: str) -> str:
    """A question's identity: lower-case letters and digits of its first 200 characters."""
    return re.sub(r"[^a-z0-9]", "", text.lower())[:200]


def eval_questions(eval_dir: Path = EVAL_DIR) -> set[str]:
    """Keys of every question in the project's evaluation files (empty when they are absent)."""
    keys: set[str] = set()
    for path in sorted(eval_dir.glob("*.jsonl")):
        for line in path.open():
            row = json.loads(line)
            text = row.get("problem") or row.get("question")
            if text is None and isinstance(row.get("prompt"), list):
                text = row["prompt"][-1]["content"]
                text = text.split("\n\n", 1)[-1].rsplit("\n\nRemember", 1)[0]
            if text:
                keys.add(_key(text))
    return keys


def convert(items: list[dict], excluded: set[str]) -> tuple[list[dict], dict]:
    pairs, dropped = [], {"math500_source": 0, "in_project_eval": 0}
    for item in items:
        if item["source"].lower().startswith("math_500"):
            dropped["math500_source"] += 1
            continue
        if _key(item["question"]) in excluded:
            dropped["in_project_eval"] += 1
            continue
        split = "dev" if item["id"] % 2 == 0 else "heldout"
        for pred, expected in ((item["fn_output"], 1), (item["tn_output"], 0)):
            pairs.append(
                {
                    "gold": item["ground_truth"],
                    "pred": pred,
                    "expected": expected,
                    "split": split,
                    "source": f"HardVerify-Math#{item['id']} ({item['source']})",
                }
            )
    return pairs, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("input", type=Path, help="HardVerify-Math.json from uw-nsl/TinyV")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    items = json.loads(args.input.read_text())
    pairs, dropped = convert(items, eval_questions())
    with args.out.open("w") as f:
        for pair in pairs:
            f.write(json.dumps(pair, ensure_ascii=False) + "\n")
    n_items = len(pairs) // 2
    print(f"{len(items)} items, dropped {dropped}, wrote {len(pairs)} pairs ({n_items} items) to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
