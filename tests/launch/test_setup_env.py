"""scripts/setup_env.sh picks the stack (issue #43): the default stack (DEFAULT_STACK, the one CI's
whole suite runs on) in .venv when its Python is found on PATH or among pyenv's versions, else
the other stack there, said in one line; STACK= asks for the other one, in .venv-STACK; a wrong
interpreter or stack is one line, exit 2.

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


DEFAULT = next(
    line.split("=", 1)[1].strip()
    for line in (ROOT / "scripts" / "setup_env.sh").read_text().splitlines()
    if line.startswith("DEFAULT_STACK=")
)
PY_OF = {"primary": "3.12", "compat": "3.11"}
TORCH_OF = {"primary": "2.14.1", "compat": "2.13.0"}
OTHER = {"primary": "compat", "compat": "primary"}[DEFAULT]


def _pythons(tmp_path: Path, on_path=(), in_pyenv=()) -> tuple:
    bindir, pyenv = tmp_path / "bin", tmp_path / "pyenv"
    bindir.mkdir(exist_ok=True)
    for v in on_path:
        _fake_python(bindir / f"python{v}", v)
    for full in in_pyenv:
        short = ".".join(full.split(".")[:2])
        _fake_python(pyenv / "versions" / full / "bin" / f"python{short}", short)
    return bindir, pyenv


def test_the_default_stack_from_pyenv_goes_to_dot_venv(tmp_path):
    short = PY_OF[DEFAULT]
    bindir, pyenv = _pythons(tmp_path, in_pyenv=(f"{short}.1", f"{short}.9", f"{PY_OF[OTHER]}.2"))
    _fake_python(bindir / "python3", "3.10")  # a python3 of another version is passed over
    p = _plan_of(_plan(tmp_path, bindir, pyenv))
    assert p["stack"] == DEFAULT and p["venv"] == ".venv" and p["torch"] == TORCH_OF[DEFAULT], p
    assert p["python"] == str(pyenv / "versions" / f"{short}.9" / "bin" / f"python{short}"), p  # the newest


def test_python_on_path_comes_before_pyenv(tmp_path):
    short = PY_OF[DEFAULT]
    bindir, pyenv = _pythons(tmp_path, on_path=(short,), in_pyenv=(f"{short}.1",))
    p = _plan_of(_plan(tmp_path, bindir, pyenv))
    assert p["stack"] == DEFAULT and p["python"] == str(bindir / f"python{short}"), p


def test_without_the_default_python_the_other_stack_is_built_and_said_in_one_line(tmp_path):
    bindir, pyenv = _pythons(tmp_path, on_path=(PY_OF[OTHER],))
    r = _plan(tmp_path, bindir, pyenv)
    p = _plan_of(r)
    assert p == {
        "stack": OTHER,
        "python": str(bindir / f"python{PY_OF[OTHER]}"),
        "venv": ".venv",
        "torch": TORCH_OF[OTHER],
    }, p
    said = [x for x in r.stdout.splitlines() if f"no Python {PY_OF[DEFAULT]}" in x]
    assert len(said) == 1 and f"building the {OTHER} stack" in said[0], r.stdout


def test_the_other_stack_asked_for_goes_to_its_own_venv(tmp_path):
    bindir, pyenv = _pythons(tmp_path, on_path=("3.12", "3.11"))
    p = _plan_of(_plan(tmp_path, bindir, pyenv, STACK=OTHER))
    assert p == {
        "stack": OTHER,
        "python": str(bindir / f"python{PY_OF[OTHER]}"),
        "venv": f".venv-{OTHER}",
        "torch": TORCH_OF[OTHER],
    }, p
    p = _plan_of(_plan(tmp_path, bindir, pyenv, STACK=DEFAULT))  # the default, asked for by name
    assert p["stack"] == DEFAULT and p["venv"] == ".venv", p
    p = _plan_of(_plan(tmp_path, bindir, pyenv, STACK="primary"))
    assert p["python"].endswith("python3.12") and p["torch"] == "2.14.1", p


def test_a_wrong_interpreter_or_stack_is_one_line(tmp_path):
    bindir, pyenv = _pythons(tmp_path, on_path=("3.10",))
    r = _plan(tmp_path, bindir, pyenv, PYTHON=str(bindir / "python3.10"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs 3.12" in r.stderr, r.stderr
    r = _plan(tmp_path, bindir, pyenv, STACK="newest")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "STACK must be primary or compat" in r.stderr, r.stderr
    r = _plan(tmp_path, bindir, pyenv)  # no 3.12, no 3.11 either
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no Python 3.12 or 3.11" in r.stderr, r.stderr
    r = _plan(tmp_path, bindir, pyenv, STACK="primary")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "STACK=primary needs a Python 3.12" in r.stderr, r.stderr
