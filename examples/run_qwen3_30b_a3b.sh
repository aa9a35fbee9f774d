#!/usr/bin/env bash
# DAPO on Qwen3-30B-A3B (base; mixture of experts: 128 experts, top-8, 3.3B active of 30.5B) with DAPO-Math-17K,
# the paper's hyperparameters, 4 or 8 nodes x 8 H100/H200, expert parallel, routing replay (R3).
#
#   bash examples/run_qwen3_30b_a3b.sh                 # on the Ray head node (RAY_ADDRESS set), or via
#   DRIVER_SCRIPT=$PWD/examples/run_qwen3_30b_a3b.sh sbatch -N 4 examples/slurm/submit_dapo.sbatch   # docs/slurm.md
#   NNODES=8 bash examples/run_qwen3_30b_a3b.sh --dry-run   # validate, print placement + memory + sync plan
#
# Extra arguments are passed through to `python -m megatron_dapo.train` and win over the ones below.
# Environment: HF_CKPT (HF checkpoint dir of Qwen3-30B-A3B-Base), PROMPT_DATA (DAPO-Math-17K parquet, verl schema),
# EVAL_DATA (AIME 2024 parquet; set it empty for none), TOKENIZER (default: HF_CKPT's), SAVE_DIR, RUN_DIR,
# NUM_ROLLOUT, NNODES (default 4; 8 works with the same layout), GPUS_PER_NODE, PYTHON, ROUTING_REPLAY (default 1;
# 0 drops --routing-replay, e.g. to measure the rollout/trainer routing agreement without it).
# The GPU kind is not a setting: the dry run prints the memory plan for an 80 GB H100 and a 141 GB H200 side by side.
# The model shape is read from $HF_CKPT/config.json (--hf-checkpoint), never retyped here. A path you set is used as
# given: if it does not exist, the dry run fails naming it. Only for a variable you did NOT set, a dry run on a machine
# without the default paths stands in (and says so): Qwen3-30B-A3B's config.json in examples/qwen3-30b-a3b (shape
# only) with the Qwen2 tokenizer, and the sample files in $SHARED_DATA (16 DAPO-Math-17K rows, AIME 2024).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TAG=run_qwen3_30b_a3b
# REPO_ROOT, SHARED_DATA, PYTHON, user_set, note, dry_run_stand_ins, the shared recipe, run_driver
source "$SCRIPT_DIR/lib/common.sh"

HF_CKPT="${HF_CKPT-/checkpoints/Qwen3-30B-A3B-Base}"
PROMPT_DATA="${PROMPT_DATA-/data/dapo-math-17k.parquet}"
EVAL_DATA="${EVAL_DATA-/data/aime-2024.parquet}"
TOKENIZER="${TOKENIZER-}"
SAVE_DIR="${SAVE_DIR:-/checkpoints/dapo-qwen3-30b-a3b}"
RUN_DIR="${RUN_DIR:-runs/dapo-qwen3-30b-a3b}"
NUM_ROLLOUT="${NUM_ROLLOUT:-1000}"      # rollout steps; set it to your compute budget
NNODES="${NNODES:-4}"               # 4 or 8 nodes: the layout below is the same (docs/moe.md)
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"

# A dry run must work on a machine without the 30B weights or the data sets: stand-ins for the defaults only.
dry_run_stand_ins examples/qwen3-30b-a3b \
  "(Qwen3 uses the same byte-level BPE; its few extra special tokens do not matter to a dry run)" "$@"
# The checkpoint, sampling, DAPO and evaluation flags of the paper and the official 32B script (lib/common.sh).
dapo_math_recipe

# ---------------------------------------------------------------------------------------------- model
# Shape (48 layers, hidden 2048, 32 heads / 4 KV heads x 128, q/k norms, 128 experts of width 768, top-8 renormalised,
# vocab 151936, untied) from config.json. The router, its normalisation and the aux-loss coefficient (0.001) come from
# the config too (docs/moe.md "What is read from the HF config").
MODEL_ARGS=(
  --hf-checkpoint "$HF_CKPT"        # initial weights + tokenizer; --load (below) resumes instead
  ${TOKENIZER:+--tokenizer "$TOKENIZER"}
  --bf16
)

# ---------------------------------------------------------------------------------------------- mixture of experts
# Load balancing: Switch-style aux loss, as HF's Qwen3-MoE computes it, over the data-parallel group (global-batch
# balance, as the Qwen3 report trains), coefficient from config.json (0.001). No aux-loss-free bias (refused for a
# softmax router). Routing replay (R3): the engines return the experts they routed every generated token to, and the
# trainer replays them in the old-logprob forward and in training, so engine and trainer route alike.
MOE_ARGS=(
  --moe-router-load-balancing-type global_aux_loss
  --moe-token-dispatcher-type alltoall
)
if [[ "${ROUTING_REPLAY:-1}" == 1 ]]; then MOE_ARGS+=(--routing-replay); fi

# ---------------------------------------------------------------------------------------------- checkpoints
# Every 10 steps, the last 3 kept, an HF export every 100; resumes when $SAVE_DIR/latest exists (lib/common.sh).
CKPT_ARGS=("${RECIPE_CKPT_ARGS[@]}")

# ---------------------------------------------------------------------------------------------- rollout
ROLLOUT_ARGS=(
  "${RECIPE_ROLLOUT_ARGS[@]}"         # DAPO-Math-17K, G 16, 512 prompts kept of 1536 per round (lib/common.sh)
  --rollout-num-gpus-per-engine 4     # engine TP 4 = the 4 KV heads: 2 engines per node (layout below)
  --sglang-mem-fraction-static 0.7
)

# ---------------------------------------------------------------------------------------------- DAPO + optimizer
# As examples/run_qwen32b.sh (the paper and the official 32B script; both take it from lib/common.sh): the recipe
# is the algorithm's, not the model's.
DAPO_ARGS=("${RECIPE_DAPO_ARGS[@]}")

# ---------------------------------------------------------------------------------------------- parallelism
# 4 nodes x 8 GPUs = 32 (or 8 x 8 = 64, same layout). Dense part TP 2 (sequence parallel) x PP 1 x CP 1 -> DP 16 (32);
# experts EP 8 x ETP 1 -> 16 whole experts per GPU, expert-data-parallel EDP 4 (8). Why (docs/moe.md, "Recipe"):
#   EP 8 = one node: every MoE layer's token all-to-all runs on NVLink; EP 16 would cross InfiniBand 2 x 48 times per
#     forward (the dry run warns). ETP 1: whole experts (768 wide); ETP 2 x EP 8 = 16 ranks would also cross nodes.
#   TP <= 4 (megatron needs the 4 KV heads divisible by TP). TP 1 does not fit an H100: bf16 logits + grad of a
#     22528-token micro-batch over the 152k vocabulary alone ~18.7 GB, training peak ~76 GB. TP 2 is the smallest
#     that fits with the plan's 15% margin (longest trainable sequence 43k tokens on H100, 138k on H200); TP 4 would
#     save ~10 GB that nothing needs (generation sets the peak) and shrink the 2048-wide GEMMs further.
#   PP 1: PP 2 would halve the layers per GPU (static ~25 GB) but adds a pipeline bubble and puts half of every
#     engine's weights on another node at each sync (0.98 s instead of 0.37 s); nothing needs it.
# Per GPU at 4 nodes (decimal GB; the dry run prints it): 4.40B params (dense 1.54B / TP 2 + router + 29.0B experts
#   / 8): bf16 weights 8.8, fp32 grads 17.6, Adam + fp32 main 11.5 (dense over DP 16, experts over EDP 4) = 37.9
#   static (32.1 at 8 nodes: EDP 8); activations with full recompute 5.5 (MoE: every token's 8 routed copies),
#   logits 9.3 -> training peak 56.7 GB (51.0 at 8 nodes).
# Rollout: engine TP 4 = the 4 KV heads (one per GPU, none replicated): bf16 weights 15.3 GB per GPU, KV 24 KiB per
#   token per GPU; 0.7 x 79 GB = 55.3 GB -> KV budget 40.0 GB = 1.63M tokens per engine on H100 (3.37M on H200),
#   13.0M tokens over 8 engines (TP 2: 8.1M, TP 8: 7.8M). SGLang splits each expert's width over the engine's 4 TP
#   ranks (its default ep_size 1; --ep-size 4 would hold 32 whole experts per GPU at the same bytes, not passed by
#   this launcher yet). Colocated peak = generation: 63.3 GB of 80 (H100), 106.0 of 141 (H200).
# Weight sync: each feeder receives the whole model, 61.1 GB bf16 per sync, of which 58.0 GB experts, 50.7 GB of
#   them all-gathered inside the node from the other 7 ranks of its EP group; ~0.37 s at the plan's bandwidths.
PERF_ARGS=(
  --actor-num-nodes "$NNODES"
  --actor-num-gpus-per-node "$GPUS_PER_NODE"
  --tensor-model-parallel-size 2
  --sequence-parallel                 # megatron-core trains a MoE layer at TP > 1 only with it
  --pipeline-model-parallel-size 1
  --context-parallel-size 1
  --expert-model-parallel-size 8      # 16 experts per GPU, the token all-to-all inside one node (NVLink)
  --expert-tensor-parallel-size 1     # whole experts (default would be TP 2: half-width 384 GEMMs)
  "${RECIPE_PERF_ARGS[@]}"            # distributed optimizer, 22528 tokens per micro-batch, packing, full recompute
)

# ---------------------------------------------------------------------------------------------- evaluation
# AIME 2024 every 10 steps when EVAL_DATA is set (lib/common.sh).
EVAL_ARGS=("${RECIPE_EVAL_ARGS[@]}")

# ---------------------------------------------------------------------------------------------- logging
LOG_ARGS=(
  --run-dir "$RUN_DIR"
  --wandb-project dapo-qwen3-30b-a3b
  --wandb-mode offline
  --dump-rollouts-every 10
)

run_driver "${MODEL_ARGS[@]}" "${MOE_ARGS[@]}" "${CKPT_ARGS[@]}" "${ROLLOUT_ARGS[@]}" "${DAPO_ARGS[@]}" \
  "${PERF_ARGS[@]}" "${EVAL_ARGS[@]}" "${LOG_ARGS[@]}" ${EXTRA[@]+"${EXTRA[@]}"} "$@"
