"""tests/stack_subset.txt, the tests CI runs on the second stack (the one that is not
scripts/setup_env.sh's DEFAULT_STACK), names tests that exist (a renamed test would otherwise drop
out of that run silently) and covers what issue #43 asks of it: models, TP/PP logits, the
distributed optimizer, checkpoint save/load/reshard across releases, MoE, a tiny end-to-end run;
and .ci/run runs it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _entries() -> list[str]:
    lines = (ROOT / "tests" / "stack_subset.txt").read_text().splitlines()
    return [e for e in (line.split("#", 1)[0].strip() for line in lines) if e]


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_entry_names_an_existing_test():
    entries = _entries()
    assert entries
    for e in entries:
        file, _, name = e.partition("::")
        path = ROOT / file
        assert path.is_file(), f"tests/stack_subset.txt: {file} does not exist"
        if name:
            assert name in _test_names(path), f"tests/stack_subset.txt: {file} has no test {name}"


def test_the_subset_covers_what_the_compatibility_stack_must_keep():
    files = {e.partition("::")[0] for e in _entries()}
    for what, needed in {
        "models": "tests/foundation/test_models.py",
        "TP/PP logits": "tests/foundation/test_parallel_logits.py",
        "distributed optimizer": "tests/foundation/test_dp_optimizer.py",
        "checkpoint save/load/reshard": "tests/training/test_reshard_resume.py",
        "MoE": "tests/moe/test_moe_train.py",
        "a tiny end-to-end run": "tests/e2e/test_train_e2e.py",
        "a checkpoint across releases": "tests/training/test_checkpoint_across_releases.py",
    }.items():
        assert needed in files, f"tests/stack_subset.txt lacks {what} ({needed})"


def test_ci_runs_the_whole_suite_on_the_default_stack_and_the_subset_on_the_other():
    default = next(
        line.split("=", 1)[1].strip()
        for line in (ROOT / "scripts" / "setup_env.sh").read_text().splitlines()
        if line.startswith("DEFAULT_STACK=")
    )
    other = {"primary": "compat", "compat": "primary"}[default]
    runs = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "scripts/run_tests.sh" in line]
    assert runs == ["bash scripts/run_tests.sh", f"STACK={other} bash scripts/run_tests.sh"], runs
