"""Checks of a whole configuration, run before any process group is created.

Every message names the flags and their values, so a user can fix the command line.
"""

from __future__ import annotations

import os
from typing import Optional

from .cli import ConfigError
from .schema import DAPOConfig


def world_size(cfg: DAPOConfig) -> int:
    return cfg.parallel.nnodes * cfg.parallel.gpus_per_node


def data_parallel_size(cfg: DAPOConfig) -> int:
    p = cfg.parallel
    return world_size(cfg) // (p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size)


def validate(cfg: DAPOConfig, arch=None, on_gpu: Optional[bool] = None) -> list[str]:
    """Raise ConfigError on the first invalid combination; return a list of warnings.

    ``arch`` (a ModelArch) enables the model-shape checks.
    """
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    warnings: list[str] = []
    p, o, r, a = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    for flag, v in (
        ("--tensor-model-parallel-size", tp),
        ("--pipeline-model-parallel-size", pp),
        ("--context-parallel-size", cp),
        ("--actor-num-nodes", p.nnodes),
        ("--actor-num-gpus-per-node", p.gpus_per_node),
        ("--micro-batch-size", o.micro_batch_size),
        ("--global-batch-size", o.global_batch_size),
        ("--rollout-batch-size", r.rollout_batch_size),
        ("--n-samples-per-prompt", r.n_samples_per_prompt),
        ("--rollout-num-gpus-per-engine", r.num_gpus_per_engine),
    ):
        if v < 1:
            raise ConfigError(f"{flag} must be >= 1, got {v}")
    world = world_size(cfg)
    if world % (tp * pp * cp):
        raise ConfigError(
            f"world size {world} (--actor-num-nodes {p.nnodes} x --actor-num-gpus-per-node {p.gpus_per_node}) is not "
            f"divisible by --tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
            f"--context-parallel-size {cp}"
        )
    dp = data_parallel_size(cfg)
    if arch is not None:
        if arch.num_attention_heads % tp:
            raise ConfigError(
                f"attention heads {arch.num_attention_heads} (--hf-checkpoint config) not divisible by "
                f"--tensor-model-parallel-size {tp}"
            )
        if arch.num_query_groups % tp:
            raise ConfigError(
                f"KV heads {arch.num_query_groups} (--hf-checkpoint config) not divisible by "
                f"--tensor-model-parallel-size {tp}"
            )
        if arch.num_layers % pp:
            raise ConfigError(
                f"layers {arch.num_layers} (--hf-checkpoint config) not divisible by --pipeline-model-parallel-size {pp}"
            )
        total = cfg.data.max_prompt_length + a.max_response_length
        if total > arch.max_position_embeddings:
            raise ConfigError(
                f"--max-prompt-length {cfg.data.max_prompt_length} + --max-response-length {a.max_response_length} "
                f"= {total} exceeds the model's max_position_embeddings {arch.max_position_embeddings}"
            )
    responses = r.rollout_batch_size * r.n_samples_per_prompt
    if responses % o.global_batch_size:
        raise ConfigError(
            f"responses per rollout step (--rollout-batch-size {r.rollout_batch_size} x --n-samples-per-prompt "
            f"{r.n_samples_per_prompt} = {responses}) not divisible by --global-batch-size {o.global_batch_size}"
        )
    if o.global_batch_size % dp:
        raise ConfigError(
            f"--global-batch-size {o.global_batch_size} (responses per optimizer step) not divisible by the "
            f"data-parallel size {dp} (world {world} / (TP {tp} x PP {pp} x CP {cp}))"
        )
    if (o.global_batch_size // dp) % o.micro_batch_size:
        raise ConfigError(
            f"responses per DP rank per optimizer step ({o.global_batch_size} / DP {dp}) not divisible by "
            f"--micro-batch-size {o.micro_batch_size}"
        )
    if r.over_sampling_batch_size is not None and r.over_sampling_batch_size < 1:
        raise ConfigError(f"--over-sampling-batch-size must be >= 1, got {r.over_sampling_batch_size}")
    if r.partial_rollout and r.partial_rollout_max_staleness < 1:
        raise ConfigError(f"--partial-rollout-max-staleness must be >= 1, got {r.partial_rollout_max_staleness}")
    if r.max_num_gen_batches < 1:
        raise ConfigError(
            f"--max-num-gen-batches must be >= 1, got {r.max_num_gen_batches}: it bounds the generation rounds of a "
            "step (on data the model always solves or always fails, an unbounded search would never end); give a "
            "larger number for hard data, or --no-dynamic-sampling")
    if a.dynamic_sampling and r.n_samples_per_prompt < 2:
        raise ConfigError(
            f"--dynamic-sampling needs --n-samples-per-prompt >= 2 (a group of 1 is never mixed), got {r.n_samples_per_prompt}"
        )
    if world % r.num_gpus_per_engine:
        raise ConfigError(f"world size {world} not divisible by --rollout-num-gpus-per-engine {r.num_gpus_per_engine}")
    if p.sequence_parallel and tp == 1:
        raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if p.sequence_parallel and cfg.model.transformer_impl == "local":
        raise ConfigError(
            "--sequence-parallel needs --transformer-impl transformer_engine (megatron's local norm refuses it without TE/apex)")
    if (cp > 1 or o.use_packing) and not o.max_tokens_per_gpu:
        raise ConfigError(
            f"--use-packing / --context-parallel-size {cp}: packed micro-batches are filled up to a token budget; "
            "set --max-tokens-per-gpu"
        )
    if cp > 1 and a.loss_agg_mode == "seq-mean-token-mean":
        raise ConfigError(
            "--loss-agg-mode seq-mean-token-mean divides each sequence by its own length, which a CP rank holding a "
            "share of it does not see: use token-mean or seq-mean-token-sum with --context-parallel-size > 1"
        )
    if r.temperature <= 0:
        raise ConfigError(f"--rollout-temperature must be > 0 for training (the trainer divides logits by it), got {r.temperature}")
    if r.top_p < 1.0 or r.top_k > 0:
        raise ConfigError(
            f"--rollout-top-p {r.top_p} / --rollout-top-k {r.top_k}: training rollouts must sample from the full "
            "tempered distribution (top-p 1.0, top-k -1); the trainer's old and new logprobs cover the whole "
            "vocabulary, so truncated sampling would make the importance ratios wrong. Truncate only in evaluation "
            "(--eval-top-p)"
        )
    if not on_gpu:
        if cfg.model.bf16:
            raise ConfigError("--bf16 is GPU-only (CPU runs are fp32)")
        if p.sequence_parallel:
            raise ConfigError("--sequence-parallel is GPU-only (megatron's local norm refuses it without TE/apex)")
        if r.engine == "sglang":
            raise ConfigError("--rollout-engine sglang needs a GPU (use hf on CPU)")
    if cfg.model.recompute_method and cfg.model.recompute_granularity != "full":
        raise ConfigError(
            f"--recompute-method {cfg.model.recompute_method} needs --recompute-granularity full, "
            f"got {cfg.model.recompute_granularity}"
        )
    if o.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {o.lr}")
    if cfg.checkpoint.save_interval < 0 or cfg.checkpoint.keep_last < 1:
        raise ConfigError(
            f"--save-interval must be >= 0 and --keep-last >= 1, got {cfg.checkpoint.save_interval}, {cfg.checkpoint.keep_last}"
        )
    if cfg.data.prompt_data and not os.path.exists(cfg.data.prompt_data):
        raise ConfigError(f"--prompt-data: file not found: {cfg.data.prompt_data}")
    if cfg.model.hf_checkpoint and not os.path.exists(cfg.model.hf_checkpoint):
        raise ConfigError(f"--hf-checkpoint: directory not found: {cfg.model.hf_checkpoint}")
    if cfg.checkpoint.load and not os.path.exists(cfg.checkpoint.load):
        raise ConfigError(f"--load: directory not found: {cfg.checkpoint.load}")
    if cfg.rollout.check_weight_sync_init and (cfg.checkpoint.load or cfg.model.pretrained_checkpoint):
        raise ConfigError("--check-weight-sync-init needs the trainer to start from --hf-checkpoint's weights: drop it "
                          "or drop --load / --pretrained-checkpoint")
    try:
        a.validate()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if a.dynamic_sampling and a.dynamic_sampling_metric != "acc":
        warnings.append(
            f"--dynamic-sampling-metric {a.dynamic_sampling_metric}: DAPO filters on raw accuracy; filtering on the "
            "length-shaped score is known to collapse the policy"
        )
    return warnings


def lr_warmup_optimizer_steps(cfg: DAPOConfig) -> int:
    """Warm-up in optimizer steps (the schedule's unit); rollout steps are converted."""
    o, r = cfg.optim, cfg.rollout
    if o.lr_warmup_rollout_steps is not None:
        per_rollout = (r.rollout_batch_size * r.n_samples_per_prompt) // o.global_batch_size
        return o.lr_warmup_rollout_steps * per_rollout
    return o.lr_warmup_iters
