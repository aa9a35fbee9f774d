"""Verifier benchmark: our `dapo` and `math` modes against the math-verify package.

For each case file (gold/pred/expected pairs, optionally a `split` field) this prints, for each
verifier, how many equal pairs it recognises and how many non-equal pairs it accepts, and the
throughput of each on the same inputs in the same run (single process, one core). Case files:

* ../shared/data/verifier/equivalence-cases.jsonl: 251 unique pairs from the Math-Verify and
  lighteval test suites (218 equal, 33 not equal); the `math` rules were developed on it.
* benchmarks/data/verifier/hardverify-math-pairs.jsonl (when converted, see the README there):
  470 pairs from HardVerify-Math (model answers that rule-based checkers miss, with a wrong
  answer each), reported per split (`dev`, `heldout`).
* benchmarks/data/verifier/grader-suites-cases.jsonl: 175 cases from ten other projects' grader
  test suites (GRADER_SUITES.md: repository, commit and path of each), some of them whole
  responses (`pred_kind`), reported per project.

* `dapo`: ``compute_score("Answer: " + pred, gold, mode="dapo")`` (a whole response as it is) -
  Minerva-normalised exact strings, the official DAPO rule.
* `math`: ``compute_score(pred, gold, mode="math")``, the trainer's entry (it reads a bare answer
  and a whole response the same way ``is_equivalent`` does).
* `math-verify`: math-verify 0.9.0 (benchmarks/requirements-verifier.txt pins it and its
  antlr4 runtime) with LaTeX + expression extraction on ``$gold$`` / ``$pred$``, the ``$``
  added only where the text has none (this reproduces the 203/218 reference point). Two
  variants are reported for accuracy only: ``$...$`` always added, and the raw texts.

Usage::

    python -m venv /tmp/mvenv && /tmp/mvenv/bin/pip install -r benchmarks/requirements-verifier.txt
    /tmp/mvenv/bin/python benchmarks/bench_verifier.py [--repeats 3] [--show-disagreements] [--cases FILE ...]

(math-verify is a benchmark-only dependency: keep it out of the project's virtual environment.)

Whole responses rather than answer pairs: `benchmarks/bench_verifier_diff.py` (generated
model-style responses with proved labels, recall and false accepts per answer type and
transform, docs/verifier.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CASES_PATH = ROOT.parent / "shared" / "data" / "verifier" / "equivalence-cases.jsonl"
UNSEEN_PATH = ROOT / "benchmarks" / "data" / "verifier" / "hardverify-math-pairs.jsonl"
#: other projects' grader test suites (GRADER_SUITES.md there): cases this verifier was not written from
GRADER_PATH = ROOT / "benchmarks" / "data" / "verifier" / "grader-suites-cases.jsonl"


def load_cases(path: Path = CASES_PATH) -> list[dict]:
    return [json.loads(line) for line in path.open()]


WRAPS = {
    "math-verify": lambda s: s if "$" in s else f"${s}$",
    "math-verify ($ always added)": lambda s: f"${s}$",
    "math-verify (raw text)": lambda s: s,
}


def make_math_verify(wrap=WRAPS["math-verify"]):
    """A (gold, pred) -> bool callable over math-verify, or None when it is not installed."""
    try:
        import math_verify
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        return None, None
    config = [LatexExtractionConfig(), ExprExtractionConfig()]

    def check(gold: str, pred: str, kind: str = "answer") -> bool:
        try:
            # a whole response is parsed as math-verify grades responses: as it is
            p = pred if kind == "response" else wrap(pred)
            return bool(verify(parse(wrap(gold), extraction_config=config), parse(p, extraction_config=config)))
        except Exception:  # noqa: BLE001 - a crash is a "no"
            return False

    versions = {"math-verify": getattr(math_verify, "__version__", "?")}
    try:
        from importlib.metadata import version

        versions = {p: version(p) for p in ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime")}
    except Exception:  # noqa: BLE001
        pass
    return check, versions


def run(check, cases: list[dict]) -> tuple[list[bool], float]:
    start = time.perf_counter()
    verdicts = [check(c["gold"], c["pred"], c.get("pred_kind", "answer")) for c in cases]
    return verdicts, time.perf_counter() - start


def case_sets(paths: list[Path]) -> dict[str, list[dict]]:
    """Named case lists: one per file, and one per `split` value inside a file."""
    sets: dict[str, list[dict]] = {}
    for path in paths:
        if not path.exists():
            print(f"skipped {path} (absent)", file=sys.stderr)
            continue
        cases = load_cases(path)
        splits = sorted({c.get("split") for c in cases if c.get("split")})
        if not splits:
            sets[path.name] = cases
        projects = sorted({c["source"].split("@")[0] for c in cases if "@" in c.get("source", "")})
        for project in projects if len(projects) > 1 else []:  # other projects' grader suites, per project
            sets[f"{path.name} [{project}]"] = [c for c in cases if c["source"].startswith(project + "@")]
        for split in splits:
            sets[f"{path.name} [{split}]"] = [c for c in cases if c.get("split") == split]
    return sets


def report(name: str, cases: list[dict], verifiers: dict, variants: dict, repeats: int, show: bool) -> None:
    n_eq = sum(c["expected"] == 1 for c in cases)
    n_ne = len(cases) - n_eq
    verdicts: dict[str, list[bool]] = {}
    times: dict[str, list[float]] = {v: [] for v in verifiers}
    for _ in range(repeats):  # interleaved passes: machine noise hits all verifiers alike
        for vname, check in verifiers.items():
            result, seconds = run(check, cases)
            verdicts.setdefault(vname, result)
            times[vname].append(seconds)
    print(f"\ncases: {name}: {len(cases)} ({n_eq} equal, {n_ne} not equal)\n")
    print(
        "| verifier | equal pairs recognised | non-equal pairs accepted | pairs/s (median of %d) | throughput vs math-verify |"
        % repeats
    )
    print("|---|---|---|---|---|")
    rate = {v: len(cases) / statistics.median(ts) for v, ts in times.items()}
    for vname in verifiers:
        eq_ok = sum(v and c["expected"] == 1 for v, c in zip(verdicts[vname], cases))
        ne_ok = sum(v and c["expected"] == 0 for v, c in zip(verdicts[vname], cases))
        rel = f"{rate[vname] / rate['math-verify']:.1f}x" if "math-verify" in rate else "n/a"
        print(f"| {vname} | {eq_ok}/{n_eq} | {ne_ok}/{n_ne} | {rate[vname]:.0f} | {rel} |")
    for vname, check in variants.items():  # accuracy only
        result, _ = run(check, cases)
        verdicts[vname] = result
        eq_ok = sum(v and c["expected"] == 1 for v, c in zip(result, cases))
        ne_ok = sum(v and c["expected"] == 0 for v, c in zip(result, cases))
        print(f"| {vname} | {eq_ok}/{n_eq} | {ne_ok}/{n_ne} | - | - |")
    if show:
        print()
        for i, c in enumerate(cases):
            wrong = [v for v in ("math", "math-verify") if v in verdicts and verdicts[v][i] != bool(c["expected"])]
            if wrong:
                tag = c.get("source", f"#{i}")
                print(
                    f"- {tag} expected={c['expected']} wrong: {', '.join(wrong)} | gold={c['gold'][-70:]!r} | pred={c['pred'][-70:]!r}"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per verifier (median reported)")
    parser.add_argument(
        "--show-disagreements", action="store_true", help="list pairs where verifiers differ from the label"
    )
    parser.add_argument(
        "--cases",
        type=Path,
        action="append",
        help="case file(s) (default: the shared cases and the HardVerify-Math pairs)",
    )
    args = parser.parse_args(argv)

    from megatron_dapo.reward import compute_score

    # the trainer's entry: compute_score reads a bare answer and a whole response alike
    verifiers = {
        "dapo": lambda g, p, kind="answer": (
            compute_score(p if kind == "response" else f"Answer: {p}", g, mode="dapo").acc
        ),
        "math": lambda g, p, kind="answer": compute_score(p, g, mode="math").acc,
    }
    mv, versions = make_math_verify()
    if mv is not None:
        verifiers["math-verify"] = mv
        variants = {name: make_math_verify(wrap)[0] for name, wrap in WRAPS.items() if name != "math-verify"}
    else:
        variants = {}
        print("math-verify not installed: pip install -r benchmarks/requirements-verifier.txt", file=sys.stderr)
    if versions:
        print("math-verify stack: " + ", ".join(f"{k}=={v}" for k, v in versions.items()))
    import sympy

    print(f"sympy=={sympy.__version__}, python {sys.version.split()[0]}")

    for check in verifiers.values():  # warm-up: imports and first-call caches
        check("1", "1")
    for name, cases in case_sets(args.cases or [CASES_PATH, UNSEEN_PATH, GRADER_PATH]).items():
        report(name, cases, verifiers, variants, args.repeats, args.show_disagreements)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
