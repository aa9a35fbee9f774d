#!/usr/bin/env bash
# A real factorial ablation on the CPU: 2^3 (clip-higher x dynamic sampling x token-level loss) x 2 seeds
# = 16 short DAPO runs of SmolLM2-135M on the CPU demo's two-digit addition task, one after another,
# then the report (held-out greedy accuracy, effects with t intervals over the seeds, diagnosis per run).
#
#   bash examples/ablate_cpu.sh              # plan, launch what is not done, report (resumable: run it again)
#   bash examples/ablate_cpu.sh --dry-run    # the plan, what it can separate, its cost; starts nothing
#   bash examples/ablate_cpu.sh --slurm ...  # any other tools/ablate.py run option is passed on
#
# Env: GRID (default runs/ablate-cpu), STEPS (rollout steps per run, default 4), SEEDS (default "1 2"),
#      WORK (prepared model and data, shared with examples/run_smollm2_cpu.sh; default .cache/demo).
# Budget: about 90 min on 2 cores alone (measured 2026-12-04: 299-380 s per run; the report is in
# docs/ablation-cpu/report.md, read in docs/ablation.md). Ctrl-C stops the running run (nothing left behind); the same command
# again fills only the runs that are missing or unfinished (an unfinished run starts over, its partial
# files moved into RUN_DIR/aside-<time>/).
#
# Every cell is the CPU demo's DAPO configuration (--algorithm dapo: overlong filtering and soft
# punishment with L_max 12 / L_cache 4, dual clip 10) cut down to fit the budget (8 prompts x 8 samples
# per step, STEPS steps, 2 optimizer steps per rollout step), with the three factors switched:
#   A clip-higher       --eps-clip-high 0.2 | 0.28
#   B dynamic-sampling  --dynamic-sampling false | true
#   C token-level-loss  --loss-agg-mode seq-mean-token-mean | token-mean
# Held-out accuracy: greedy, 128 problems, every 2 steps (--eval-data, logged as eval/heldout/pass@1).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
PY=.venv/bin/python
GRID=${GRID:-runs/ablate-cpu}
WORK=${WORK:-.cache/demo}
STEPS=${STEPS:-4}
SEEDS=${SEEDS:-1 2}
HF=$WORK/smollm2-hf
CKPT=$WORK/smollm2-torch_dist
DATA=$WORK/addition
DRY_RUN=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY_RUN=1; done
mkdir -p "$WORK"

$PY tools/prepare_smollm2.py --out "$HF"
$PY examples/demo/make_addition_data.py --out "$DATA" --train 2000 --heldout 128
if [ $DRY_RUN = 0 ] && [ ! -f "$CKPT/megatron_dapo_checkpoint.json" ]; then
  $PY tools/convert_hf_to_megatron.py --hf-checkpoint "$HF" --save "$CKPT" --dtype fp32
fi

# --step-seconds 60: the demo's measured step (128 responses: ~100-140 s on this 2-core machine,
# docs/benchmarks.md) scaled to 64 responses; it only feeds the plan's cost line.
# shellcheck disable=SC2086
exec $PY tools/ablate.py run --grid "$GRID" \
  --factors clip-higher,dynamic-sampling,token-level-loss --seeds $SEEDS \
  --step-seconds 60 --threshold 0.5 "$@" -- \
  --hf-checkpoint "$HF" --pretrained-checkpoint "$CKPT" \
  --prompt-data "$DATA/train.jsonl" --no-apply-chat-template --max-prompt-length 128 \
  --algorithm dapo --rollout-batch-size 8 --n-samples-per-prompt 8 --over-sampling-batch-size 16 \
  --max-num-gen-batches 4 --global-batch-size 32 --micro-batch-size 16 \
  --max-response-length 12 --overlong-buffer-length 4 --rollout-stop '\n' \
  --rollout-temperature 1.0 --rollout-top-p 1.0 \
  --lr 1e-5 --weight-decay 0.0 --clip-grad 1.0 --adam-beta2 0.99 \
  --num-rollout "$STEPS" --reward-num-workers 1 \
  --eval-data "$DATA/heldout.jsonl" --eval-interval 2 --eval-k 1 --eval-temperature 0 --eval-top-p 1.0 \
  --wandb-mode disabled --no-progress
