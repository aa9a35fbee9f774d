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
TAG=run_qwen32b
# REPO_ROOT, SHARED_DATA, PYTHON, user_set, note, dry_run_stand_ins, the shared recipe, run_driver
source "$SCRIPT_DIR/lib/common.sh"

HF_CKPT="${HF_CKPT-/checkpoints/Qwen2.5-32B}"
PROMPT_DATA="${PROMPT_DATA-/data/dapo-math-17k.parquet}"
EVAL_DATA="${EVAL_DATA-/data/aime-2024.parquet}"
TOKENIZER="${TOKENIZER-}"
SAVE_DIR="${SAVE_DIR:-/checkpoints/dapo-qwen2.5-32b}"
RUN_DIR="${RUN_DIR:-runs/dapo-qwen2.5-32b}"
NUM_ROLLOUT="${NUM_ROLLOUT:-1000}"      # rollout steps; set it to your compute budget
NNODES="${NNODES:-16}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"

# A dry run must work on a machine without the 32B weights or the data sets: stand-ins for the defaults only.
dry_run_stand_ins examples/qwen2.5-32b "" "$@"
# The checkpoint, sampling, DAPO and evaluation flags of the paper and the official 32B script (lib/common.sh).
dapo_math_recipe

# ---------------------------------------------------------------------------------------------- model
# Shape (64 layers, hidden 5120, FFN 27648, 40 heads / 8 KV heads, vocab 152064, untied) from config.json.
MODEL_ARGS=(
  --hf-checkpoint "$HF_CKPT"        # initial weights + tokenizer; --load (below) resumes instead
  ${TOKENIZER:+--tokenizer "$TOKENIZER"}
  --bf16
)

# ---------------------------------------------------------------------------------------------- checkpoints
# Every 10 steps, the last 3 kept, an HF export every 100; resumes when $SAVE_DIR/latest exists (lib/common.sh).
CKPT_ARGS=("${RECIPE_CKPT_ARGS[@]}")

# ---------------------------------------------------------------------------------------------- rollout
ROLLOUT_ARGS=(
  "${RECIPE_ROLLOUT_ARGS[@]}"         # DAPO-Math-17K, G 16, 512 prompts kept of 1536 per round (lib/common.sh)
  --rollout-num-gpus-per-engine 4     # engine TP 4: 32 engines, 2 per node (memory below)
  --sglang-mem-fraction-static 0.7
)

# ---------------------------------------------------------------------------------------------- DAPO + optimizer
# The paper's hyperparameters; the LR warm-up (10 rollout steps) and the dual clip of the official 32B script
# (lib/common.sh says why).
DAPO_ARGS=("${RECIPE_DAPO_ARGS[@]}")

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
  "${RECIPE_PERF_ARGS[@]}"            # distributed optimizer, 22528 tokens per micro-batch, packing, full recompute
)

# ---------------------------------------------------------------------------------------------- evaluation
# AIME 2024 every 10 steps when EVAL_DATA is set (lib/common.sh).
EVAL_ARGS=("${RECIPE_EVAL_ARGS[@]}")

# ---------------------------------------------------------------------------------------------- logging
LOG_ARGS=(
  --run-dir "$RUN_DIR"
  --wandb-project dapo-qwen2.5-32b
  --wandb-mode offline
  --dump-rollouts-every 10
)

run_driver "${MODEL_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${DAPO_ARGS[@]}" "${PERF_ARGS[@]}" \
  "${EVAL_ARGS[@]}" "${LOG_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} "$@"
