#!/usr/bin/env bash
# DAPO on Qwen2.5-32B with LoRA adapters (issue 41; docs/lora.md): run_qwen32b.sh's recipe (the paper's
# hyperparameters, DAPO-Math-17K, AIME 2024 evaluation) with the base frozen and rank-32 adapters on every
# linear projection, on fewer nodes.
#
#   bash examples/run_qwen32b_lora.sh --dry-run   # the plan: memory with LoRA, the smallest node count
#   bash examples/run_qwen32b_lora.sh             # on the Ray head node (RAY_ADDRESS set)
#
# Environment: as run_qwen32b.sh (HF_CKPT, PROMPT_DATA, EVAL_DATA, SAVE_DIR, RUN_DIR, NNODES, ...).
# Extra arguments go to `python -m megatron_dapo.train` and win over the ones below.
#
# Learning rate: 1e-5, ten times the full fine-tuning rate of run_qwen32b.sh (1e-6). With PEFT's
# init (B = 0) and scaling alpha / r, the best LoRA learning rate has been measured at about 10x the
# full fine-tuning one, nearly independent of the rank, for supervised and for policy-gradient RL
# (Thinking Machines, "LoRA Without Regret", 2025, alpha 32); RL moves few bits per episode, so
# small ranks already match full fine-tuning there. docs/lora.md says more, and how to check it on
# the CPU demo first.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# memory: 1 node of 8 H100s holds the trainer with adapters and the engines (the dry run prints
# the smallest node count); more nodes generate faster
export NNODES="${NNODES:-2}"
export SAVE_DIR="${SAVE_DIR:-/checkpoints/dapo-qwen2.5-32b-lora}"
export RUN_DIR="${RUN_DIR:-runs/dapo-qwen2.5-32b-lora}"

LORA_ARGS=(
  --lora-rank 32
  --lora-alpha 32
  --lora-target-modules all-linear
  --lora-sync merged                 # W + (alpha/r) B A through the bucketed weight sync
  --lr 1e-5                          # 10x the full fine-tuning rate (above)
)
exec bash "$SCRIPT_DIR/run_qwen32b.sh" "${LORA_ARGS[@]}" "$@"
