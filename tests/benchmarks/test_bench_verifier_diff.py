"""benchmarks/bench_verifier_diff.py and its generator: a small run, proved labels, a seeded split.

The full differential run (thousands of responses, math-verify beside `math` mode) belongs in
benchmarks/ (docs/benchmarks.md); here only a smoke test on the first golds of MATH-500.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import verifier_cases  # noqa: E402


def test_generator_is_seeded_split_by_problem_and_labelled():
    cases, drops = verifier_cases.generate(seed=0, limit=40)
    again, _ = verifier_cases.generate(seed=0, limit=40)
    assert cases == again  # the same seed writes the same cases
    other, _ = verifier_cases.generate(seed=1, limit=40)
    assert other != cases
    assert {c["split"] for c in cases} == {"dev", "heldout"}
    assert {c["label"] for c in cases} == {0, 1}
    by_problem = {}
    for c in cases:
        by_problem.setdefault(c["id"], set()).add(c["split"])
    assert all(len(s) == 1 for s in by_problem.values())  # a problem's rewrites stay in one half
    transforms = {c["transform"] for c in cases}
    assert {"identity", "hedge-or", "hedge-boxes-or", "last-number", "correction-to-gold"} <= transforms
    # a correction in the open is labelled by its last answer: one proved wrong, then one proved right
    fixes = [c for c in cases if c["transform"] == "correction-to-gold"]
    assert fixes and all(c["label"] == 1 and c["shape"].startswith("correction-") for c in fixes)
    assert drops["unprovable"] < len(cases) / 5


def test_labels_are_proved_by_the_generators_own_reader():
    read = verifier_cases.read_value
    gold = read("\\frac{\\sqrt{3}}{3}")
    assert verifier_cases.values_equal(gold, read("1/sqrt(3)")) is True
    assert verifier_cases.values_equal(gold, read("0.577")) is False
    assert verifier_cases.values_equal(read("(3,4]"), read("[3, 4]")) is False
    assert verifier_cases.values_equal(read("3, 5, 7"), read("7, 3, 5")) is True
    assert verifier_cases.values_equal(read("x^2 - 1"), read("(x-1)(x+1)")) is True
    assert verifier_cases.values_equal(read("x^2 - 1"), read("(x-1)^2")) is False
    # The generator and its reader (verifier_reader.py) do not use the verifier they test.
    for module in ("verifier_cases.py", "verifier_reader.py"):
        tree = ast.parse((ROOT / "benchmarks" / module).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
        }
        assert not any(name.startswith("megatron_dapo") for name in imported), (module, imported)


def test_small_differential_run_prints_the_tables():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_verifier_diff.py"),
            "--limit",
            "24",
            "--by",
            "type,transform",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "## dev:" in text and "## heldout:" in text
    assert "| math |" in text and "| dapo |" in text
    assert "by type (recall | false accepts)" in text and "by transform" in text
    try:
        import math_verify  # noqa: F401
    except ImportError:
        assert "math-verify not installed" in text  # its column is skipped with a note
    else:
        assert "| math-verify |" in text
