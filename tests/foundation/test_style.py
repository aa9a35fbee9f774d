"""The house style holds (issue #39): ``ruff check`` and ``ruff format --check`` with the rules of
ruff.toml on the whole tree, and ``mypy`` on the typed core named in mypy.ini (algo/, config/,
driver/, hybrid/phases.py, errors.py). Each runs as a subprocess from the repository root; its
output is the failure message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: scripts/setup_env.sh installs the dev extra (setup.py)")
    return found


def _run(cmd: list, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_ruff_lint():
    r = _run([_tool("ruff"), "check", "--no-cache", "--output-format", "concise", "."])
    assert r.returncode == 0, f"ruff check (fix with `ruff check --fix .`):\n{r.stdout[-6000:]}{r.stderr[-2000:]}"


def test_ruff_format():
    r = _run([_tool("ruff"), "format", "--check", "--no-cache", "."])
    assert r.returncode == 0, f"ruff format --check (fix with `ruff format .`):\n{r.stdout[-6000:]}{r.stderr[-2000:]}"


def test_mypy_on_the_typed_core(tmp_path):
    # the cache outside the repository: the suite fails on files a test leaves there
    r = _run(
        [_tool("mypy"), "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / "mypy-cache"), "--no-error-summary"],
        timeout=900,
    )
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert r.returncode == 0 and not errors, "mypy (mypy.ini):\n" + "\n".join(
        errors or [r.stdout[-4000:], r.stderr[-2000:]]
    )
