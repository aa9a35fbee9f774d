"""Differential verifier test: `math` mode next to math-verify on generated model-style responses.

The cases come from `benchmarks/verifier_cases.py` (seeded; built from the gold answers of
tests/data/eval/math500.jsonl and the templates of benchmarks/data/verifier/case_templates.json;
every label proved by construction with an independent reader, benchmarks/verifier_reader.py,
see those modules). For each half (`dev`: looked at while the rules were written,
`heldout`: measured only) this prints recall (correct responses accepted) and false accepts
(wrong responses accepted) of

* `math`: ``compute_score(response, gold, mode="math").acc``,
* `dapo`: ``compute_score(response, gold, mode="dapo").acc`` (the official `Answer:` checker,
  for reference: it reads only "Answer:" lines),
* `math-verify`: math-verify 0.9 as it is used to grade responses:
  ``verify(parse("$gold$"), parse(response))`` with its default LaTeX + expression
  extraction (skipped, with a note, when math-verify is not installed),

overall, per answer type, per transform and per response shape, in one run.

Usage::

    python -m venv /tmp/mvenv && /tmp/mvenv/bin/pip install -r benchmarks/requirements-verifier.txt
    /tmp/mvenv/bin/python benchmarks/bench_verifier_diff.py [--split dev|heldout|both] [--show-failures 40]

(the project's own `.venv/bin/python` runs it too, without the math-verify column).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import verifier_cases  # noqa: E402


def make_math_verify():
    """A (gold, response) -> bool callable over math-verify, or (None, note) when absent."""
    try:
        import math_verify
        from math_verify import parse, verify
    except ImportError:
        return (
            None,
            "math-verify not installed (pip install -r benchmarks/requirements-verifier.txt): its column is skipped",
        )

    def check(gold: str, response: str) -> bool:
        try:
            g = gold if "$" in gold else f"${gold}$"
            return bool(verify(parse(g), parse(response)))
        except Exception:  # noqa: BLE001 - a crash is a "no"
            return False

    try:
        from importlib.metadata import version

        stack = ", ".join(
            f"{p}=={version(p)}" for p in ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime")
        )
    except Exception:  # noqa: BLE001 - metadata missing: the module's own attribute
        stack = f"math-verify=={getattr(math_verify, '__version__', '?')}"
    return check, f"math-verify stack: {stack}"


def verifiers(with_math_verify: bool = True) -> tuple[dict, list[str]]:
    from megatron_dapo.reward import compute_score

    checks = {
        "math": lambda g, r: compute_score(r, g, mode="math").acc,
        "dapo": lambda g, r: compute_score(r, g, mode="dapo").acc,
    }
    notes = []
    if with_math_verify:
        mv, note = make_math_verify()
        notes.append(note)
        if mv is not None:
            checks["math-verify"] = mv
    return checks, notes


def run_cases(cases: list[dict], checks: dict) -> tuple[dict, dict]:
    """Verdicts per verifier and seconds per verifier."""
    verdicts, seconds = {}, {}
    for name, check in checks.items():
        check("1", "Answer: 1")  # warm-up (imports, first-call caches)
        start = time.process_time()
        verdicts[name] = [bool(check(c["gold"], c["response"])) for c in cases]
        seconds[name] = time.process_time() - start
    return verdicts, seconds


def _cell(verdicts: list[bool], cases: list[dict], idx: list[int]) -> str:
    pos = [i for i in idx if cases[i]["label"] == 1]
    neg = [i for i in idx if cases[i]["label"] == 0]
    rec = f"{sum(verdicts[i] for i in pos)}/{len(pos)}" if pos else "-"
    fa = f"{sum(verdicts[i] for i in neg)}/{len(neg)}" if neg else "-"
    return f"{rec} | {fa}"


def table(title: str, key: str, cases: list[dict], verdicts: dict) -> list[str]:
    names = list(verdicts)
    groups = collections.defaultdict(list)
    for i, c in enumerate(cases):
        groups[c[key] if key else "all"].append(i)
    lines = [
        f"\n{title}\n",
        "| " + (key or "set") + " | " + " | ".join(f"{n} recall | {n} false accepts" for n in names) + " |",
        "|---|" + "---|---|" * len(names),
    ]
    for group in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        lines.append(f"| {group} | " + " | ".join(_cell(verdicts[n], cases, groups[group]) for n in names) + " |")
    return lines


def summary(cases: list[dict], verdicts: dict, seconds: dict) -> list[str]:
    lines = ["| verifier | recall | false accepts | cases/s |", "|---|---|---|---|"]
    pos = [i for i, c in enumerate(cases) if c["label"] == 1]
    neg = [i for i, c in enumerate(cases) if c["label"] == 0]
    for name, v in verdicts.items():
        r = sum(v[i] for i in pos)
        f = sum(v[i] for i in neg)
        rate = len(cases) / seconds[name] if seconds[name] else float("inf")
        lines.append(
            f"| {name} | {r}/{len(pos)} = {r / max(1, len(pos)):.4f} | {f}/{len(neg)} = {100 * f / max(1, len(neg)):.2f}% | {rate:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", choices=("dev", "heldout", "both"), default="both")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N gold answers")
    parser.add_argument("--per-label", type=int, default=5, help="equivalent and wrong answers drawn per gold (each)")
    parser.add_argument("--no-math-verify", action="store_true", help="skip the math-verify column")
    parser.add_argument("--show-failures", type=int, default=0, help="list up to N cases `math` gets wrong (per split)")
    parser.add_argument(
        "--by", default="type,transform,shape", help="tables to print (comma list of type, transform, shape)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the cases with every verdict to this file")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)

    import sympy

    cases, drops = verifier_cases.generate(seed=args.seed, limit=args.limit, per_label=args.per_label)
    checks, notes = verifiers(not args.no_math_verify)
    for note in notes:
        print(note)
    print(f"sympy=={sympy.__version__}, python {sys.version.split()[0]}, seed {args.seed}")
    print(f"generated {len(cases)} cases with proved labels; dropped: {drops}")
    splits = ["dev", "heldout"] if args.split == "both" else [args.split]
    dump = []
    for split in splits:
        part = [c for c in cases if c["split"] == split]
        verdicts, seconds = run_cases(part, checks)
        n_pos = sum(c["label"] == 1 for c in part)
        print(f"\n## {split}: {len(part)} cases ({n_pos} correct, {len(part) - n_pos} wrong)\n")
        print("\n".join(summary(part, verdicts, seconds)))
        for key in [k for k in args.by.split(",") if k]:
            print("\n".join(table(f"{split}, by {key} (recall | false accepts)", key, part, verdicts)))
        if args.show_failures:
            bad = [i for i, c in enumerate(part) if verdicts["math"][i] != bool(c["label"])]
            print(f"\n{split}: `math` disagrees with the label on {len(bad)} cases (first {args.show_failures}):")
            for i in bad[: args.show_failures]:
                c = part[i]
                tail = c["response"].split("\n")[-1][-110:]
                print(f"- [{c['type']}/{c['transform']}/{c['shape']}] label={c['label']} gold={c['gold']!r} | {tail!r}")
        for i, c in enumerate(part):
            dump.append({**c, **{f"verdict_{n}": verdicts[n][i] for n in verdicts}})
    if args.json:
        args.json.write_text(json.dumps(dump, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
