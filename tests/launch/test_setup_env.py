"""scripts/setup_env.sh picks the stack (issue #43): a Python 3.12 on PATH or among pyenv's versions
builds the primary stack in .venv; without one it builds the compatibility stack and says so in
one line; STACK=compat asks for it in .venv-compat; a wrong interpreter is one line, exit 2.

Run with SETUP_PLAN_ONLY=1 (the script prints its choice and stops before creating anything) on a
PATH and a pyenv root made of stand-in interpreters: small scripts that answer the version query."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake_python(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho "{version}"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _plan(tmp_path: Path, bindir: Path, pyenv: Path, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("STACK", "PYTHON", "VENV", "PYENV_ROOT")}
    # the stand-ins, and the few tools the script calls (not the system's own pythons)
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    for name in ("bash", "ls", "sort", "cat", "sha1sum", "cut", "dirname"):
        if not (tools / name).exists():
            (tools / name).symlink_to(shutil.which(name))
    base.update(
        PATH=os.pathsep.join([str(bindir), str(tools)]), PYENV_ROOT=str(pyenv), SETUP_PLAN_ONLY="1", HOME=str(tmp_path)
    )
    base.update(env)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup_env.sh")], capture_output=True, text=True, env=base, timeout=60
    )


def _plan_of(r) -> dict:
    line = [x for x in r.stdout.splitlines() if x.startswith("stack=")]
    assert r.returncode == 0 and line, r.stdout + r.stderr
    return dict(kv.split("=", 1) for kv in line[0].split())


def test_pyenvs_312_builds_the_primary_stack_in_dot_venv(tmp_path):
    bindir = tmp_path / "bin"
    _fake_python(bindir / "python3", "3.11")  # the machine's python3 is 3.11, as here
    pyenv = tmp_path / "pyenv"
    _fake_python(pyenv / "versions" / "3.12.1" / "bin" / "python3.12", "3.12")
    _fake_python(pyenv / "versions" / "3.12.9" / "bin" / "python3.12", "3.12")
    _fake_python(pyenv / "versions" / "3.11.7" / "bin" / "python3.11", "3.11")
    p = _plan_of(_plan(tmp_path, bindir, pyenv))
    assert p["stack"] == "primary" and p["venv"] == ".venv" and p["torch"] == "2.14.1", p
    assert p["python"] == str(pyenv / "versions" / "3.12.9" / "bin" / "python3.12"), p  # the newest 3.12


def test_a_312_on_path_comes_before_pyenv(tmp_path):
    bindir = tmp_path / "bin"
    on_path = _fake_python(bindir / "python3.12", "3.12")
    pyenv = tmp_path / "pyenv"
    _fake_python(pyenv / "versions" / "3.12.1" / "bin" / "python3.12", "3.12")
    p = _plan_of(_plan(tmp_path, bindir, pyenv))
    assert p["stack"] == "primary" and p["python"] == str(on_path), p


def test_without_312_the_compatibility_stack_is_built_and_said_in_one_line(tmp_path):
    bindir = tmp_path / "bin"
    py311 = _fake_python(bindir / "python3.11", "3.11")
    r = _plan(tmp_path, bindir, tmp_path / "no-pyenv")
    p = _plan_of(r)
    assert p["stack"] == "compat" and p["python"] == str(py311) and p["venv"] == ".venv" and p["torch"] == "2.13.0", p
    said = [x for x in r.stdout.splitlines() if "no Python 3.12" in x]
    assert len(said) == 1 and "compatibility stack" in said[0], r.stdout


def test_stack_compat_asked_for_goes_to_its_own_venv(tmp_path):
    bindir = tmp_path / "bin"
    _fake_python(bindir / "python3.12", "3.12")
    py311 = _fake_python(bindir / "python3.11", "3.11")
    p = _plan_of(_plan(tmp_path, bindir, tmp_path / "no-pyenv", STACK="compat"))
    assert p == {"stack": "compat", "python": str(py311), "venv": ".venv-compat", "torch": "2.13.0"}, p


def test_a_wrong_interpreter_or_stack_is_one_line(tmp_path):
    bindir = tmp_path / "bin"
    py310 = _fake_python(bindir / "python3.10", "3.10")
    r = _plan(tmp_path, bindir, tmp_path / "no-pyenv", PYTHON=str(py310))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs 3.12" in r.stderr, r.stderr
    r = _plan(tmp_path, bindir, tmp_path / "no-pyenv", STACK="newest")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "STACK must be primary or compat" in r.stderr, r.stderr
    r = _plan(tmp_path, bindir, tmp_path / "no-pyenv")  # no 3.12, no 3.11 either
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no Python 3.12 or 3.11" in r.stderr, r.stderr
