# Shared by the cluster recipes (examples/run_qwen32b.sh, examples/run_qwen3_30b_a3b.sh): sourced, not run.
#
# The recipe sets SCRIPT_DIR (its own directory) and TAG (its name in messages), then sources this file
# BEFORE it gives its path variables their defaults (which ones the user set is recorded here). It gets:
#   REPO_ROOT, SHARED_DATA, PYTHON (the checkout's .venv when there is one)
#   user_set NAME            whether the user set NAME (even to ""): such a path is never replaced
#   note MESSAGE             "[TAG] MESSAGE" on stderr
#   dry_run_stand_ins SHAPE_DIR TOKENIZER_REMARK "$@"
#                            DRY_RUN (1 with --dry-run or DRY_RUN=1) and EXTRA (--dry-run when only DRY_RUN=1 asked
#                            for it); in a dry run, stand-ins for the paths the user did NOT set and that do not exist
#   dapo_math_recipe         after the paths: the flags both recipes share, as RECIPE_*_ARGS arrays (below)
#   run_driver ARGS...       cd to the checkout, print the command line, exec python -m megatron_dapo.train ARGS
# A recipe differs from another in its model, layout, engine TP and logging; the algorithm (the DAPO paper's
# hyperparameters and the official 32B script's sampling) is the same, so it is written once, here.

REPO_ROOT="$(cd "$SCRIPT_DIR/.." && pwd)"
SHARED_DATA="${SHARED_DATA:-$REPO_ROOT/../shared/data}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then PYTHON="$REPO_ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi

# Which of the paths the user set (even to ""): those are never replaced.
USER_SET=" "
for v in HF_CKPT PROMPT_DATA EVAL_DATA TOKENIZER; do [[ -n "${!v+set}" ]] && USER_SET+="$v "; done
user_set() { [[ "$USER_SET" == *" $1 "* ]]; }

note() { echo "[$TAG] $*" >&2; }

# A dry run must work on a machine without the weights or the data sets: stand-ins for the defaults only.
# SHAPE_DIR: the model's public config.json (shape only, no weights), relative to the checkout.
# TOKENIZER_REMARK: appended to the note that the Qwen2 tokenizer stands in (empty: nothing).
dry_run_stand_ins() {
  local shape_dir=$1 remark=$2 a
  shift 2
  DRY_RUN=${DRY_RUN:-0}
  for a in "$@"; do [[ "$a" == "--dry-run" ]] && DRY_RUN=1; done
  EXTRA=()
  [[ "$DRY_RUN" == 1 ]] || return 0
  grep -qx -- "--dry-run" < <(printf '%s\n' "$@") || EXTRA+=(--dry-run)
  if ! user_set HF_CKPT && [[ ! -f "$HF_CKPT/config.json" ]]; then
    note "HF_CKPT not set and $HF_CKPT/config.json not found: dry run with the public config in $shape_dir (shape only, no weights)"
    HF_CKPT="$REPO_ROOT/$shape_dir"
    if ! user_set TOKENIZER && [[ -f "$SHARED_DATA/tokenizers/qwen2/tokenizer.json" ]]; then
      TOKENIZER="$SHARED_DATA/tokenizers/qwen2"; note "TOKENIZER not set: the Qwen2 tokenizer in $TOKENIZER${remark:+ $remark}"
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
  return 0
}

# The flags both recipes share, from SAVE_DIR, PROMPT_DATA, NUM_ROLLOUT and EVAL_DATA (after dry_run_stand_ins).
dapo_math_recipe() {
  # ---------------------------------------------------------------------------------------------- checkpoints
  RECIPE_CKPT_ARGS=(
    --save "$SAVE_DIR"
    --save-interval 10
    --keep-last 3
    --save-hf-interval 100
  )
  # Resume automatically when this run already wrote a checkpoint (weights, optimizer, trainer state).
  if [[ -e "$SAVE_DIR/latest" ]]; then RECIPE_CKPT_ARGS+=(--load "$SAVE_DIR"); fi

  # ---------------------------------------------------------------------------------------------- rollout
  # (the engine's TP and memory fraction are the recipe's)
  RECIPE_ROLLOUT_ARGS=(
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
  )

  # ---------------------------------------------------------------------------------------------- DAPO + optimizer
  # LR warm-up: 10 rollout steps (= 160 optimizer steps at 16 updates per step), as in the official 32B script,
  # not the paper's 20: the script is the run that produced the published AIME numbers, and the algorithm preset
  # follows the same script elsewhere (dual-clip c = 10). Use --lr-warmup-rollout-steps 20 for the paper's text.
  RECIPE_DAPO_ARGS=(
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

  # ---------------------------------------------------------------------------------------------- memory
  # (after the recipe's own layout flags; its comments say what fits)
  RECIPE_PERF_ARGS=(
    --use-distributed-optimizer
    --max-tokens-per-gpu 22528          # 2048 prompt + 20480 response: one longest sample per micro-batch
    --use-packing                       # THD micro-batches filled to the budget, no padding
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
  )

  # ---------------------------------------------------------------------------------------------- evaluation
  # The paper reports AIME 2024 avg@32 at temperature 1.0, top_p 0.7.
  RECIPE_EVAL_ARGS=(
    ${EVAL_DATA:+--eval-data "$EVAL_DATA"}
    ${EVAL_DATA:+--eval-interval 10}
  )
}

run_driver() {
  cd "$REPO_ROOT"
  local cmd=("$PYTHON" -m megatron_dapo.train "$@")
  echo "[$TAG] ${cmd[*]}" >&2
  exec "${cmd[@]}"
}
