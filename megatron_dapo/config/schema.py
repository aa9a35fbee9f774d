"""The one typed config tree of a run (dataclasses), one section per concern.

Every field becomes a command-line flag (``megatron_dapo.config.cli``): model, parallelism
and optimizer flags use Megatron-LM's names so users can paste their scripts; the flag of a
field is ``metadata["flag"]`` or ``--`` + its dashed name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from ..algo.config import AlgorithmConfig
from ..models.hf_config import LORA_TARGETS
from ..ranges import COUNT, EVERY, NONNEGATIVE, OPEN_FRACTION, POSITIVE, SEED, Range
from ..reward.api import REWARD_MODES
from ..rollout.engines import engine_choices


def _f(default: Any, help: str, flag: Optional[str] = None, **extra: Any):
    md = {"help": help, **extra}
    if flag:
        md["flag"] = flag
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=md)  # type: ignore[misc]  # a fresh copy per instance
    return field(default=default, metadata=md)


@dataclass
class ModelConfig:
    hf_checkpoint: Optional[str] = _f(
        None,
        "HF checkpoint directory: model shape (config.json), tokenizer, and initial weights unless "
        "--pretrained-checkpoint or --load is given.",
    )
    pretrained_checkpoint: Optional[str] = _f(None, "A converted torch_dist checkpoint to initialise weights from.")
    tokenizer: Optional[str] = _f(None, "Tokenizer directory (default: --hf-checkpoint).")
    make_vocab_size_divisible_by: int = _f(
        128, "Pad the vocabulary to a multiple of this x TP (Megatron-LM).", range=COUNT
    )
    bf16: bool = _f(False, "bf16 parameters and compute (GPU); CPU runs are fp32.")
    recompute_granularity: Optional[str] = _f(
        None, "Activation recompute: full or selective.", choices=(None, "full", "selective")
    )
    transformer_impl: str = _f(
        "transformer_engine",
        "Layer implementation (Megatron-LM): transformer_engine on GPU (an error if TE does not "
        "import), or local (megatron-core's local spec; always on CPU).",
        choices=("transformer_engine", "local"),
    )
    recompute_method: Optional[str] = _f(
        None, "uniform or block (with --recompute-granularity full).", choices=(None, "uniform", "block")
    )
    recompute_num_layers: Optional[int] = _f(
        None, "Layers per recompute chunk (uniform) or recomputed layers (block).", range=COUNT
    )
    ref_load: Optional[str] = _f(
        None, "Reference model checkpoint for KL (default: the initial policy) when --kl-coef > 0."
    )
    lora_rank: int = _f(
        0,
        "LoRA rank r; 0 trains every weight. With r > 0 the base weights are frozen and adapters on "
        "--lora-target-modules are trained (docs/lora.md).",
        range=EVERY,
    )
    lora_alpha: float = _f(32.0, "LoRA alpha: the adapters' output is scaled by alpha / r.", range=POSITIVE)
    lora_dropout: float = _f(
        0.0, "Dropout on the adapters' input (PEFT's lora_dropout).", range=Range(0, 1, hi_open=True)
    )
    lora_target_modules: list = _f(
        list(LORA_TARGETS),
        "HF projections that get adapters, in PEFT's names (space or comma separated; all-linear: all seven).",
        nargs="*",
    )
    lora_sync: str = _f(
        "merged",
        "How the rollout engines get a LoRA policy: merged (W + (alpha/r) B A through the bucketed weight "
        "sync) or adapter (the adapters only, loaded as a LoRA adapter of the engine).",
        choices=("merged", "adapter"),
    )


@dataclass
class ParallelConfig:
    tensor_model_parallel_size: int = _f(1, "Tensor model parallel size.", range=COUNT)
    pipeline_model_parallel_size: int = _f(1, "Pipeline model parallel size.", range=COUNT)
    context_parallel_size: int = _f(
        1,
        "Context parallel size: every packed sequence is split into 2 x CP chunks in the load-balanced (zigzag) "
        "order (packing is on; needs --max-tokens-per-gpu).",
        range=COUNT,
    )
    sequence_parallel: bool = _f(False, "Sequence parallelism with TP (GPU/TE only).")
    use_distributed_optimizer: bool = _f(False, "Shard optimizer state over data-parallel ranks.")
    nnodes: int = _f(1, "Number of nodes.", "--actor-num-nodes", range=COUNT)
    gpus_per_node: int = _f(1, "GPUs (CPU demo: worker processes) per node.", "--actor-num-gpus-per-node", range=COUNT)
    expert_model_parallel_size: int = _f(
        1,
        "Expert parallel size (mixture-of-experts models): each EP rank holds num_experts / EP experts; EP ranks "
        "are drawn from the TP x CP x DP ranks of a pipeline stage (docs/moe.md).",
        range=COUNT,
    )
    expert_tensor_parallel_size: Optional[int] = _f(
        None, "Tensor parallel size of each expert (default: --tensor-model-parallel-size).", range=COUNT
    )


@dataclass
class OptimConfig:
    lr: float = _f(1e-6, "Learning rate (constant after warm-up).", range=POSITIVE)
    lr_warmup_iters: int = _f(0, "Linear warm-up length in optimizer steps.", range=EVERY)
    lr_warmup_rollout_steps: Optional[int] = _f(
        None,
        "Linear warm-up length in rollout steps (converted to optimizer steps; wins over --lr-warmup-iters).",
        range=EVERY,
    )
    weight_decay: float = _f(0.1, "AdamW weight decay.", range=NONNEGATIVE)
    clip_grad: float = _f(1.0, "Gradient clipping by global norm (0 = off).", range=NONNEGATIVE)
    adam_beta1: float = _f(0.9, "AdamW beta1.", range=Range(0, 1, hi_open=True))
    adam_beta2: float = _f(0.999, "AdamW beta2.", range=Range(0, 1, hi_open=True))
    adam_eps: float = _f(1e-8, "AdamW epsilon.", range=POSITIVE)
    micro_batch_size: int = _f(
        1,
        "Responses per micro-batch (consecutive responses; upper bound when --max-tokens-per-gpu also limits "
        "them); with --use-packing micro-batches are bounded by --max-tokens-per-gpu only.",
        range=COUNT,
    )
    global_batch_size: int = _f(512, "Responses per optimizer step (all DP ranks).", range=COUNT)
    max_tokens_per_gpu: Optional[int] = _f(
        None, "Token budget of one micro-batch; micro-batches are packed to it.", range=COUNT
    )
    use_packing: bool = _f(
        False,
        "Group responses into the fewest micro-batches of at most --max-tokens-per-gpu tokens, balanced by "
        "tokens, instead of consecutive groups of --micro-batch-size (micro-batches are THD either way: each "
        "sequence padded only to what TP/CP need). Always on with --context-parallel-size > 1.",
    )
    seed: int = _f(1234, "Random seed.", range=SEED)
    max_skipped_steps: int = _f(
        3, "Stop after this many consecutive skipped (non-finite) optimizer steps.", range=EVERY
    )


@dataclass
class RolloutConfig:
    engine: str = _f(
        "auto",
        "Rollout engine kind (rollout/engines.py ENGINE_KINDS): sglang (GPU), hf (CPU), or auto: the first kind made for this machine.",
        "--rollout-engine",
        choices=engine_choices(),
    )
    rollout_batch_size: int = _f(512, "Prompts per rollout step (groups kept after dynamic sampling).", range=COUNT)
    n_samples_per_prompt: int = _f(16, "Responses per prompt (group size G).", range=COUNT)
    over_sampling_batch_size: Optional[int] = _f(
        None,
        "Prompts generating at once (the window, default: --rollout-batch-size); a group that ends and is "
        "verified frees its place for a new prompt while more are needed (docs/rollout.md, Streaming).",
        range=COUNT,
    )
    max_num_gen_batches: int = _f(
        10,
        "The step's request budget in windows (>= 1): at most this many x --over-sampling-batch-size prompts are "
        "started before the step fails with what to change.",
        range=COUNT,
    )
    temperature: float = _f(
        1.0,
        "Sampling temperature for training rollouts; the trainer divides its logits by it for old and new "
        "logprobs, entropy and the KL reference.",
        "--rollout-temperature",
        range=POSITIVE,
    )
    top_p: float = _f(
        1.0,
        "Top-p for training rollouts (must be 1.0: truncated sampling is refused for training).",
        "--rollout-top-p",
        range=OPEN_FRACTION,
    )
    top_k: int = _f(
        -1,
        "Top-k for training rollouts (must be -1: truncated sampling is refused for training).",
        "--rollout-top-k",
        range=Range(-1, integer=True),
    )
    stop: list = _f([], "Stop strings (repeatable).", "--rollout-stop", nargs="*")
    num_gpus_per_engine: int = _f(
        1, "GPUs per rollout engine (engine TP size).", "--rollout-num-gpus-per-engine", range=COUNT
    )
    placement: str = _f(
        "colocated",
        "Where the rollout engines run: 'colocated' (on the trainer's GPUs, the hybrid engine: generate, offload, "
        "train, sync) or 'disaggregated' (on --rollout-num-gpus GPUs of their own, next to the trainer's: the "
        "engines keep their memory, and each sync broadcasts the weights from the trainer's rank 0 over a "
        "collective group the engines join; what --async-mode needs on GPUs).",
        "--rollout-placement",
        choices=("colocated", "disaggregated"),
    )
    num_gpus: int = _f(
        0,
        "--rollout-placement disaggregated: the GPUs of the engines, apart from the trainer's (a multiple of "
        "--rollout-num-gpus-per-engine; 0 with colocated engines).",
        "--rollout-num-gpus",
        range=EVERY,
    )
    mem_fraction_static: float = _f(
        0.7,
        "SGLang static memory fraction.",
        "--sglang-mem-fraction-static",
        range=Range(0, 1, lo_open=True, hi_open=True),
    )
    update_weight_buffer_size: int = _f(512 * 1024**2, "Weight-sync bucket size in bytes.", range=COUNT)
    check_weight_sync_every: int = _f(
        1,
        "Check the engines after every N-th weight sync (0 = never): exact per-tensor checksums of what the "
        "engine holds against what the trainer sent (engines that can report them: hf), and engine vs trainer "
        "logprobs on the probe's first 256 tokens.",
        range=EVERY,
    )
    check_weight_sync_init: bool = _f(
        False,
        "Exact check of the first weight sync, by the engine's own tensor names (the check for SGLang): the "
        "engines load --hf-checkpoint's weights at launch and record them, overwrite them with random values before "
        "the first sync, and after it every tensor must equal its record again; the error names each tensor that "
        "differs. For runs whose trainer starts from --hf-checkpoint (not with --load or --pretrained-checkpoint); "
        "engines load the checkpoint at launch (slower start).",
    )
    weight_sync_tolerance: Optional[float] = _f(
        None,
        "Mean |logp_engine - logp_trainer| tolerated on the weight-sync probe; its 90th percentile may reach "
        "3x this, its max is logged only (default by parameter dtype: fp32 1e-4, fp16 0.03, bf16 0.1).",
        range=POSITIVE,
    )
    offload_train: Optional[bool] = _f(
        None,
        "Offload trainer params, grads and optimizer state while the engine generates "
        "(default: on with GPUs, off on CPU).",
    )
    reuse_surplus_groups: bool = _f(
        False,
        "Carry mixed groups generated beyond --rollout-batch-size over to the next step (with their old-policy "
        "logprobs) instead of dropping them. Not part of any --algorithm preset; the paper drops them.",
    )
    engine_timeout_s: float = _f(600.0, "A generation call slower than this restarts the engine.", range=POSITIVE)
    partial_rollout: bool = _f(
        False,
        "Partial rollout: when a step's batch is full, in-flight generations are stopped and their prefixes "
        "kept (tokens, engine logprobs, weight version); the next step continues them with the new weights before "
        "starting new prompts. A group is scored only when all its samples finished.",
    )
    partial_rollout_offpolicy: str = _f(
        "mask",
        "Tokens of a continued prefix generated under older weights: 'mask' (no loss) or 'correct' "
        "(weighted by min(pi_old / pi_engine, --tis-cap)).",
        choices=("mask", "correct"),
    )
    partial_rollout_max_staleness: int = _f(
        2,
        "A kept prefix whose oldest token is more than this many steps old is dropped and its sample "
        "regenerated from the prompt (>= 1).",
        range=COUNT,
    )
    async_mode: str = _f(
        "off",
        "Asynchronous training: 'off' (generate, train, sync: on-policy), 'one-step-off' (the rollout for step "
        "n+1 runs while step n trains, with the weights before step n: every sample one version old) or 'bounded' "
        "(the engines generate the next steps' rollouts ahead of the trainer, each admitted to training only while "
        "it is at most --max-staleness versions old, otherwise regenerated). Old tokens are weighted by "
        "min(pi_old / pi_engine, --tis-cap), the decoupled loss; docs/rollout.md, 'Asynchronous DAPO'. Needs "
        "engines that keep their memory while the trainer trains: a CPU run today (separate GPUs for the engines "
        "are not built yet).",
        choices=("off", "one-step-off", "bounded"),
    )
    max_staleness: int = _f(
        2,
        "--async-mode bounded: the most weight versions a rollout may lag behind the trainer that trains on it "
        "(the engines never generate further ahead; with --staleness-control ess the controller's upper bound).",
        range=COUNT,
    )
    staleness_control: str = _f(
        "fixed",
        "How the lag of --async-mode is chosen: 'fixed' (always its lag: 1, or --max-staleness when bounded) or "
        "'ess' (closed loop: the lag drops by one, down to 0, on-policy, at once when the importance weights' "
        "ESS / N of a step falls below --staleness-ess-low or more than 1% of the stale tokens' pi_old / pi_engine "
        "exceed 3, and "
        "rises again after 3 steps at or above --staleness-ess-high; a raise that fails waits twice as long the next "
        "time; every change is logged with its reason: algo.staleness.StalenessController).",
        choices=("fixed", "ess"),
    )
    staleness_ess_low: float = _f(
        0.6,
        "--staleness-control ess: a step's ESS / N below this lowers the lag (0 < low < high).",
        range=OPEN_FRACTION,
    )
    staleness_ess_high: float = _f(
        0.85,
        "--staleness-control ess: ESS / N at or above this counts as healthy (low < high <= 1).",
        range=OPEN_FRACTION,
    )


@dataclass
class RewardConfig:
    mode: str = _f(
        "dapo",
        "Built-in verifier (reward/api.py REWARD_MODES): dapo (official Answer: check), math (sympy equivalence).",
        "--reward-mode",
        choices=REWARD_MODES,
    )
    reward_fn: Optional[str] = _f(
        None,
        "Default reward instead of --reward-mode: 'package.module:function' or the http(s) URL of a remote "
        "reward model (see docs/reward.md).",
    )
    reward_source: list = _f(
        [],
        "Reward per data source, DATA_SOURCE=SPEC (repeatable); SPEC is dapo, math, 'package.module:function' "
        "or an http(s) URL of a remote reward model. Other sources use --reward-fn or --reward-mode.",
        nargs="*",
    )
    remote_timeout_s: float = _f(
        30.0, "Budget of one request to a remote reward model, seconds.", "--reward-remote-timeout", range=POSITIVE
    )
    remote_max_retries: int = _f(
        3, "Retries of a failed request to a remote reward model.", "--reward-remote-max-retries", range=EVERY
    )
    remote_batch_size: int = _f(
        64, "Samples per request to a remote reward model.", "--reward-remote-batch-size", range=COUNT
    )
    num_workers: int = _f(2, "Verifier processes.", "--reward-num-workers", range=COUNT)
    timeout_s: float = _f(10.0, "Per-item verifier timeout.", "--reward-timeout", range=POSITIVE)


@dataclass
class DataConfig:
    prompt_data: Optional[str] = _f(None, "Training prompts: parquet or jsonl in the verl schema.")
    eval_data: list = _f([], "Evaluation sets (parquet/jsonl), repeatable.", nargs="*")
    max_prompt_length: int = _f(
        2048, "Prompts longer than this many tokens are skipped or left-truncated.", range=COUNT
    )
    prompt_overflow: str = _f(
        "skip", "What to do with long prompts: skip (counted) or truncate-left.", choices=("skip", "truncate-left")
    )
    apply_chat_template: bool = _f(True, "Render chat-message prompts with the tokenizer's chat template.")
    skip_bad_rows: bool = _f(False, "Skip rows without a prompt or ground truth (counted) instead of failing.")
    allow_data_change: bool = _f(False, "Allow resuming with a dataset whose fingerprint changed.")
    shuffle: bool = _f(True, "Shuffle prompts each epoch (deterministic from --seed).")


@dataclass
class CheckpointConfig:
    load: Optional[str] = _f(None, "Resume a run from this checkpoint directory (weights, optimizer, trainer state).")
    save: Optional[str] = _f(None, "Directory for checkpoints.")
    save_interval: int = _f(0, "Save every N rollout steps (0 = only at the end when --save is given).", range=EVERY)
    keep_last: int = _f(
        2,
        "Keep the N newest checkpoints of this run (older ones of the same run are removed; another run's never).",
        range=COUNT,
    )
    start_over: bool = _f(
        False,
        "Move what is in this run's way into aside-<time>/ (never deleting): a previous run's files in "
        "--run-dir and its checkpoints in --save for a fresh run; this run's checkpoints after the --load step for "
        "a rollback. Without it such a run is refused.",
    )
    save_hf_interval: int = _f(
        0,
        "Export the trainer's weights as an HF checkpoint every N rollout steps to RUN_DIR/hf/step_XXXXXX (0 = off).",
        range=EVERY,
    )
    save_hf_final: bool = _f(False, "Export the trainer's final weights as an HF checkpoint to RUN_DIR/final_hf.")


@dataclass
class LoggingConfig:
    run_dir: str = _f("runs/latest", "Run directory: metrics.jsonl, rollouts/, plots.")
    wandb_project: Optional[str] = _f(None, "wandb project (offline mode unless --wandb-mode online).")
    wandb_mode: str = _f(
        "offline", "wandb mode: offline, online or disabled.", choices=("offline", "online", "disabled")
    )
    tensorboard: bool = _f(False, "Also write tensorboard event files.")
    dump_rollouts_every: int = _f(0, "Write rollouts to RUN_DIR/rollouts/step_XXXXXX.jsonl every N steps.", range=EVERY)
    eval_interval: int = _f(0, "Evaluate on --eval-data every N steps (0 = off).", range=EVERY)
    eval_k: int = _f(32, "Samples per problem for avg@k / pass@k / maj@k (DAPO: 32).", range=COUNT)
    eval_temperature: float = _f(1.0, "Evaluation sampling temperature (DAPO: 1.0).", range=NONNEGATIVE)
    eval_top_p: float = _f(0.7, "Evaluation top-p (DAPO: 0.7).", range=OPEN_FRACTION)
    eval_prompt_style: Optional[str] = _f(None, "Prompt style for eval sets without chat prompts (see tools/eval.py).")
    progress: bool = _f(True, "Progress bars.")


@dataclass
class RunConfig:
    num_rollout_steps: int = _f(100, "Rollout steps to run.", "--num-rollout", range=COUNT)
    deterministic: bool = _f(False, "Per-sample seeds, fixed generation rounds: reruns and resumes are identical.")
    dry_run: bool = _f(False, "Validate configuration, data and paths, print the plan, start nothing.")
    inject_nan_at_step: Optional[int] = _f(
        None, "Testing: make the loss NaN at this step.", "--debug-inject-nan-step", range=COUNT
    )
    kill_engine_at_step: Optional[int] = _f(
        None,
        "Testing: SIGKILL the engine process while it generates this step's rollout (under --async-mode, "
        "while earlier steps train).",
        "--debug-kill-engine-step",
        range=COUNT,
    )
    crash_during_save_at_step: Optional[int] = _f(
        None, "Testing: SIGKILL the driver mid-save at this step.", "--debug-crash-during-save-step", range=COUNT
    )
    dump_train_batch: Optional[str] = _f(
        None, "Testing: write the training batch and weights of each step here.", "--debug-dump-train-batch"
    )


@dataclass
class MoEConfig:
    """How a mixture-of-experts model (Qwen3-MoE) is trained; docs/moe.md has the defaults' sources."""

    moe_router_load_balancing_type: str = _f(
        "aux_loss",
        "Load-balancing loss: aux_loss (Switch Transformer, per micro-batch), seq_aux_loss (per "
        "sequence), global_aux_loss (over the data-parallel group: the global-batch balance Qwen3 trains with), "
        "none.",
        choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "none"),
    )
    moe_aux_loss_coeff: Optional[float] = _f(
        None,
        "Coefficient of the load-balancing loss, as the mean over the step's micro-batches (default: the HF "
        "config's router_aux_loss_coef, 0.001 for Qwen3-MoE).",
        range=NONNEGATIVE,
    )
    moe_router_enable_expert_bias: bool = _f(
        False,
        "Aux-loss-free balancing (DeepSeek-V3): a per-expert bias on the routing scores, updated after each "
        "step. megatron-core supports it with sigmoid scores only: refused for Qwen3-MoE's softmax router.",
    )
    moe_router_bias_update_rate: float = _f(1e-3, "Update rate of that bias (DeepSeek-V3's gamma).", range=NONNEGATIVE)
    moe_token_dispatcher_type: str = _f(
        "alltoall",
        "How tokens reach their experts' EP ranks: alltoall or allgather.",
        choices=("alltoall", "allgather"),
    )
    routing_replay: bool = _f(
        False,
        "Routing replay (R3): the rollout engines return the routed experts of every token and the trainer "
        "replays them in the old-logprob forward and in training (docs/moe.md). MoE models only.",
    )


@dataclass
class DAPOConfig:
    """Root of the config tree."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    run: RunConfig = field(default_factory=RunConfig)
    moe: MoEConfig = field(default_factory=MoEConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


SECTIONS = [f.name for f in dataclasses.fields(DAPOConfig)]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))
