#!/usr/bin/env bash
# DAPO on Qwen2.5-32B (base) with DAPO-Math-17K, the paper's hyperparameters, 16 nodes x 8 H100/H200.
#
#   bash examples/run_qwen32b.sh                 # on the Ray head node (RAY_ADDRESS set), or via
#   sbatch examples/slurm/submit_dapo.sbatch     # which starts Ray on every node and calls this script
#   bash examples/run_qwen32b.sh --dry-run       # validate, print placement + memory plan, start nothing
#
# Extra arguments are passed through to `python -m megatron_dapo.train` and win over the ones below.
# Environment: HF_CKPT (HF checkpoint dir of Qwen2.5-32B), PROMPT_DATA (DAPO-Math-17K parquet, verl schema),
# EVAL_DATA (AIME 2024 parquet; set it empty for none), TOKENIZER (default: HF_CKPT's), SAVE_DIR, RUN_DIR,
# NUM_ROLLOUT, NNODES, GPUS_PER_NODE, PYTHON.
# The model shape is read from $HF_CKPT/config.json (--hf-checkpoint), never retyped here. A path you set is used as
# given: if it does not exist, the dry run fails naming it. Only for a variable you did NOT set, a dry run on a machine
# without the default paths stands in (and says so): Qwen2.5-32B's public config.json in examples/qwen2.5-32b (shape
# only) with the Qwen2 tokenizer, and the sample files in $SHARED_DATA (16 DAPO-Math-17K rows, AIME 2024).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
SHARED_DATA="${SHARED_DATA:-$REPO_ROOT/../shared/data}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# Which of the paths the user set (even to ""): those are never replaced.
USER_SET=" "
for v in HF_CKPT PROMPT_DATA EVAL_DATA TOKENIZER; do [[ -n "${!v+set}" ]] && USER_SET+="$v "; done
user_set() { [[ "$USER_SET" == *" $1 "* ]]; }

HF_CKPT="${HF_CKPT-/checkpoints/Qwen2.5-32B}"
PROMPT_DATA="${PROMPT_DATA-/data/dapo-math-17k.parquet}"
EVAL_DATA="${EVAL_DATA-/data/aime-2024.parquet}"
TOKENIZER="${TOKENIZER-}"
SAVE_DIR="${SAVE_DIR:-/checkpoints/dapo-qwen2.5-32b}"
RUN_DIR="${RUN_DIR:-runs/dapo-qwen2.5-32b}"
NUM_ROLLOUT="${NUM_ROLLOUT:-1000}"      # rollout steps; set it to your compute budget
NNODES="${NNODES:-16}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"

DRY_RUN=${DRY_RUN:-0}
for a in "$@"; do [[ "$a" == "--dry-run" ]] && DRY_RUN=1; done
EXTRA=()
note() { echo "[run_qwen32b] $*" >&2; }
if [[ "$DRY_RUN" == 1 ]]; then
  grep -qx -- "--dry-run" < <(printf '%s\n' "$@") || EXTRA+=(--dry-run)
  # A dry run must work on a machine without the 32B weights or the data sets: stand-ins for the defaults only.
  if ! user_set HF_CKPT && [[ ! -f "$HF_CKPT/config.json" ]]; then
    note "HF_CKPT not set and $HF_CKPT/config.json not found: dry run with the public config in examples/qwen2.5-32b (shape only, no weights)"
    HF_CKPT="$REPO_ROOT/examples/qwen2.5-32b"
    if ! user_set TOKENIZER && [[ -f "$SHARED_DATA/tokenizers/qwen2/tokenizer.json" ]]; then
      TOKENIZER="$SHARED_DATA/tokenizers/qwen2"; note "TOKENIZER not set: the Qwen2 tokenizer in $TOKENIZER"
    fi
  fi
  if ! user_set PROMPT_DATA && [[ ! -e "$PROMPT_DATA" ]]; then
    SAMPLE="$SHARED_DATA/train/dapo-math-17k-head16.parquet"
    if [[ -e "$SAMPLE" ]]; then
      note "PROMPT_DATA not set and $PROMPT_DATA not found: dry run with the 16-row sample $SAMPLE"; PROMPT_DATA="$SAMPLE"
    else
      note "PROMPT_DATA not set and $PROMPT_DATA not found: dry run without --prompt-data"; PROMPT_DATA=""
    fi
  fi
  if ! user_set EVAL_DATA && [[ ! -e "$EVAL_DATA" ]]; then
    SAMPLE="$SHARED_DATA/eval/aime-2024.parquet"
    if [[ -e "$SAMPLE" ]]; then
      note "EVAL_DATA not set and $EVAL_DATA not found: dry run with $SAMPLE"; EVAL_DATA="$SAMPLE"
    else
      note "EVAL_DATA not set and $EVAL_DATA not found: dry run without --eval-data"; EVAL_DATA=""
    fi
  fi
fi

# ---------------------------------------------------------------------------------------------- model
# Shape (64 layers, hidden 5120, FFN 27648, 40 heads / 8 KV heads, vocab 152064, untied) from config.json.
MODEL_ARGS=(
  --hf-checkpoint "$HF_CKPT"        # initial weights + tokenizer; --load (below) resumes instead
  ${TOKENIZER:+--tokenizer "$TOKENIZER"}
  --bf16
)

# ---------------------------------------------------------------------------------------------- checkpoints
CKPT_ARGS=(
  --save "$SAVE_DIR"
  --save-interval 10
  --keep-last 3
  --save-hf-interval 100
)
# Resume automatically when this run already wrote a checkpoint (weights, optimizer, trainer state).
if [[ -e "$SAVE_DIR/latest" ]]; then CKPT_ARGS+=(--load "$SAVE_DIR"); fi

# ---------------------------------------------------------------------------------------------- rollout
ROLLOUT_ARGS=(
  ${PROMPT_DATA:+--prompt-data "$PROMPT_DATA"}
  --rollout-engine sglang
  --num-rollout "$NUM_ROLLOUT"
  --rollout-batch-size 512            # prompts kept per step (after dynamic sampling)
  --n-samples-per-prompt 16           # G
  --over-sampling-batch-size 1536     # 3x prompts generated per round (official script)
  --max-num-gen-batches 10            # at most 10 generation rounds per step, then a clear error
  --rollout-temperature 1.0
  --rollout-top-p 1.0
  --rollout-top-k -1
  --max-prompt-length 2048
  --prompt-overflow truncate-left     # the official recipe truncates long prompts on the left
  --reward-mode dapo                  # the official "Answer:" check, +1 / -1
  --rollout-num-gpus-per-engine 4     # engine TP 4: 32 engines, 2 per node (memory below)
  --sglang-mem-fraction-static 0.7
)

# ---------------------------------------------------------------------------------------------- DAPO + optimizer
# LR warm-up: 10 rollout steps (= 160 optimizer steps at 16 updates per step), as in the official 32B script,
# not the paper's 20: the script is the run that produced the published AIME numbers, and the algorithm preset
# follows the same script elsewhere (dual-clip c = 10). Use --lr-warmup-rollout-steps 20 for the paper's text.
DAPO_ARGS=(
  --algorithm dapo
  --eps-clip-low 0.2
  --eps-clip-high 0.28                # clip-higher
  --clip-ratio-c 10                   # dual clip (official script; 'none' = the paper's objective)
  --loss-agg-mode token-mean          # token-level loss over the whole optimizer step
  --dynamic-sampling true
  --dynamic-sampling-metric acc       # filter groups on raw correctness, not the length-shaped score
  --max-response-length 20480         # 16384 expected + 4096 soft-punishment buffer
  --overlong-buffer-length 4096
  --overlong-penalty true
  --overlong-penalty-factor 1.0
  --kl-coef 0
  --entropy-coef 0
  --lr 1e-6                           # constant after the linear warm-up
  --lr-warmup-rollout-steps 10
  --weight-decay 0.1
  --clip-grad 1.0
  --adam-beta1 0.9
  --adam-beta2 0.999
  --global-batch-size 512             # responses per optimizer step: 512 x 16 / 512 = 16 updates per step
)

# ---------------------------------------------------------------------------------------------- parallelism
# 16 nodes x 8 GPUs = 128. Trainer TP 8 (one node, NVLink) x PP 1 x CP 1 -> DP 16. Per GPU (decimal GB):
#   bf16 weights 65.5 / 8 = 8.2, fp32 grads 16.4, Adam m+v + fp32 main params 12 B/param / DP 16 = 3.1
#   -> 27.6 static; activations of one 22528-token micro-batch with sequence parallel: ~44 GB without
#   recompute, ~3 GB with full recompute (so recompute is on), logits ~2.3 GB (bf16 + grad; the logprob
#   stage works in fp32 on 2048 tokens at a time) -> ~37 GB training peak. The dry run inverts this:
#   the longest single sequence that trains with 15% of the GPU free is ~163k tokens on H100 80 GB and
#   ~400k on H200 141 GB, so a 22528-token response needs no context parallelism at TP 8 (CP 2 without
#   recompute would also fit, but TP 8 x CP 2 spans two nodes). Responses are packed (--use-packing): a
#   micro-batch holds up to 22528 tokens of whole responses, each padded only to a multiple of TP 8, so on
#   DAPO's length mix ~1.0x the useful tokens are computed instead of ~1.3x with right padding
#   (benchmarks/bench_packing.py), and DP shards are balanced by tokens (Karmarkar-Karp).
#   PP 2 would halve the static part but adds a pipeline bubble, and each engine would then need half its
#   weights from another node at every sync; with PP 1 every node holds a whole replica and syncs intra-node.
# Rollout TP 4 (as the official recipe): bf16 weights 16.4 GB per GPU; KV cache 64 layers x 2 x 2 KV heads/GPU
#   x 128 x 2 B = 64 KiB per token per GPU. The engines launch first, on free GPUs: 0.7 x (80 - 1 GB CUDA
#   context) = 55.3 GB - 16.4 = ~38.9 GB of KV = ~594k tokens per engine, ~26 sequences of 22528 tokens at once
#   (H200: ~1.25M tokens, ~55); a round of 1536 x 16 = 24576 sequences (768 per engine) queues in continuous
#   batching. Colocated: the trainer is offloaded while generating and the engine released while training,
#   so the peak is ~63 GB (H100) per GPU. --dry-run prints the launch order and these numbers.
#   `--dry-run` prints this estimate from the config actually passed.
PERF_ARGS=(
  --actor-num-nodes "$NNODES"
  --actor-num-gpus-per-node "$GPUS_PER_NODE"
  --tensor-model-parallel-size 8
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --sequence-parallel
  --use-distributed-optimizer
  --max-tokens-per-gpu 22528          # 2048 prompt + 20480 response: one longest sample per micro-batch
  --use-packing                       # THD micro-batches filled to the budget, no padding
  --recompute-granularity full
  --recompute-method uniform
  --recompute-num-layers 1
)

# ---------------------------------------------------------------------------------------------- evaluation
# The paper reports AIME 2024 avg@32 at temperature 1.0, top_p 0.7.
EVAL_ARGS=(
  ${EVAL_DATA:+--eval-data "$EVAL_DATA"}
  ${EVAL_DATA:+--eval-interval 10}
)

# ---------------------------------------------------------------------------------------------- logging
LOG_ARGS=(
  --run-dir "$RUN_DIR"
  --wandb-project dapo-qwen2.5-32b
  --wandb-mode offline
  --dump-rollouts-every 10
)

cd "$REPO_ROOT"
CMD=("$PYTHON" -m megatron_dapo.train
  "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${DAPO_ARGS[@]}" "${PERF_ARGS[@]}"
  "${EVAL_ARGS[@]}" "${LOG_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} "$@")
echo "[run_qwen32b] ${CMD[*]}" >&2
exec "${CMD[@]}"
