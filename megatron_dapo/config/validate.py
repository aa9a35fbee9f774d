"""Checks of a whole configuration, run before any process group is created.

Every message names the flags and their values, so a user can fix the command line.
"""

from __future__ import annotations

import os
from typing import Optional

from ..models.hf_config import LORA_TARGETS, ModelConfigError, lora_moe_refusal
from ..ranges import numeric_fields, range_error
from ..reward.api import RewardConfigError
from ..reward.plugins import RewardRouter, parse_reward_sources
from ..rollout.engines import AUTO, ENGINE_KINDS, resolve_engine_kind
from .cli import ConfigError
from .schema import DAPOConfig, flag_of


def world_size(cfg: DAPOConfig) -> int:
    return cfg.parallel.nnodes * cfg.parallel.gpus_per_node


def data_parallel_size(cfg: DAPOConfig) -> int:
    p = cfg.parallel
    return world_size(cfg) // (p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size)


#: Files of which a tokenizer directory holds at least one (fast tokenizer, its config, BPE
#: vocabulary, SentencePiece model).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def check_model_dir(cfg: DAPOConfig) -> None:
    """``--hf-checkpoint`` is a directory with a config.json (read first: it gives the model shape)."""
    m = cfg.model
    if m.hf_checkpoint:
        if not os.path.isdir(m.hf_checkpoint):
            what = "not a directory" if os.path.exists(m.hf_checkpoint) else "directory not found"
            raise ConfigError(
                f"--hf-checkpoint: {what}: {m.hf_checkpoint} (give an HF checkpoint directory with config.json)"
            )
        if not os.path.isfile(os.path.join(m.hf_checkpoint, "config.json")):
            raise ConfigError(
                f"--hf-checkpoint {m.hf_checkpoint}: no config.json there (give an HF checkpoint "
                "directory: config.json, weights, tokenizer)"
            )


def check_paths(cfg: DAPOConfig) -> None:
    """The input paths of a run, checked before anything reads them (a mistyped path is one
    ConfigError naming the flag, not a traceback from the library that opens it, and never a
    download: a path that does not exist is not looked up on a model hub)."""
    check_model_dir(cfg)
    m = cfg.model
    if m.tokenizer:
        if not os.path.isdir(m.tokenizer):
            what = "not a directory" if os.path.exists(m.tokenizer) else "directory not found"
            raise ConfigError(
                f"--tokenizer: {what}: {m.tokenizer} (give the directory the tokenizer was saved to; "
                "it is never downloaded)"
            )
        if not any(os.path.isfile(os.path.join(m.tokenizer, f)) for f in TOKENIZER_FILES):
            raise ConfigError(
                f"--tokenizer {m.tokenizer}: no tokenizer there (none of {', '.join(TOKENIZER_FILES)}); "
                "give the directory the tokenizer was saved to, or drop --tokenizer to use "
                "--hf-checkpoint's"
            )
    if cfg.data.prompt_data and not os.path.exists(cfg.data.prompt_data):
        raise ConfigError(f"--prompt-data: file not found: {cfg.data.prompt_data}")
    if cfg.checkpoint.load and not os.path.exists(cfg.checkpoint.load):
        raise ConfigError(f"--load: directory not found: {cfg.checkpoint.load}")


def load_tokenizer(path: str, flag: str):
    """``AutoTokenizer.from_pretrained(path)``, local files only; a directory without a tokenizer,
    one that does not load, or one without a vocabulary is a ModelConfigError naming ``flag``."""
    from transformers import AutoTokenizer

    fix = f"give a directory with the model's tokenizer ({' / '.join(TOKENIZER_FILES)})"
    if not os.path.isdir(path) or not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ModelConfigError(f"{flag} {path}: no tokenizer there; {fix}")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # the library's errors for a directory with a broken tokenizer
        raise ModelConfigError(
            f"{flag} {path}: the tokenizer does not load ({' '.join(str(e).split())[:300]}); {fix}"
        ) from e
    if len(tok) < 2:  # a tokenizer_config.json without its vocabulary: transformers builds an empty tokenizer
        raise ModelConfigError(f"{flag} {path}: the tokenizer has no vocabulary ({len(tok)} token); {fix}")
    return tok


def check_reward(cfg: DAPOConfig) -> None:
    """The reward settings (their numbers are range-checked by ``check_ranges``): every
    ``--reward-fn`` / ``--reward-source`` spec well formed and importable (its module is imported once here). Raises RewardConfigError
    naming the flag."""
    rc = cfg.reward

    def named(flag, e):
        msg = " ".join(str(e).split())
        if isinstance(e, SyntaxError) and e.filename:
            msg = f"{e.filename}:{e.lineno}: {e.msg}"
        return RewardConfigError(msg if msg.startswith(flag) else f"{flag}: {msg}")

    try:
        RewardRouter(rc.mode, rc.reward_fn, None)
    except RewardConfigError:
        raise
    except (ValueError, ImportError, AttributeError, TypeError, SyntaxError) as e:
        raise named("--reward-fn" if rc.reward_fn else "--reward-mode", e) from e
    try:
        parse_reward_sources(rc.reward_source)
    except (ValueError, ImportError, AttributeError, TypeError, SyntaxError) as e:
        raise named("--reward-source", e) from e


def check_expert_layout(cfg: DAPOConfig, arch=None) -> None:
    """Expert parallelism (docs/moe.md; sizes and rates are range-checked by ``check_ranges``): the world divisible by ETP x EP x PP, the
    experts by EP, each expert's width by ETP; a dense model has no experts to split; megatron
    trains a MoE layer with TP > 1 only under sequence parallelism; the aux-loss-free bias
    needs sigmoid router scores, which Qwen3-MoE does not have."""
    p, m = cfg.parallel, cfg.moe
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    ep = p.expert_model_parallel_size
    etp = p.expert_tensor_parallel_size or tp
    world = world_size(cfg)
    if world % (etp * ep * pp):
        raise ConfigError(
            f"world size {world} is not divisible by --expert-tensor-parallel-size {etp} x "
            f"--expert-model-parallel-size {ep} x --pipeline-model-parallel-size {pp} (experts are laid out over the "
            "same ranks as the dense layers, per pipeline stage)"
        )
    if arch is None:
        return
    if not arch.is_moe:
        if ep > 1 or p.expert_tensor_parallel_size not in (None, tp):
            raise ConfigError(
                f"--expert-model-parallel-size {ep} / --expert-tensor-parallel-size {etp}: the model "
                f"({arch.model_type}, --hf-checkpoint config) has no experts; drop them"
            )
        if m.routing_replay:
            raise ConfigError(
                f"--routing-replay: the model ({arch.model_type}, --hf-checkpoint config) has no "
                "experts to route; drop it"
            )
        return
    if arch.num_experts % ep:
        raise ConfigError(
            f"{arch.num_experts} experts (--hf-checkpoint config num_experts) not divisible by "
            f"--expert-model-parallel-size {ep}"
        )
    if arch.moe_ffn_hidden_size % etp:
        raise ConfigError(
            f"expert width {arch.moe_ffn_hidden_size} (--hf-checkpoint config moe_intermediate_size) "
            f"not divisible by --expert-tensor-parallel-size {etp}"
        )
    if tp > 1 and not p.sequence_parallel:
        raise ConfigError(
            f"--tensor-model-parallel-size {tp} with a mixture-of-experts model needs --sequence-parallel (megatron-core "
            "refuses to train a MoE layer with TP > 1 otherwise; GPU/TE only): add --sequence-parallel, or split the "
            "experts with --expert-model-parallel-size at TP 1"
        )
    if m.moe_router_enable_expert_bias:
        raise ConfigError(
            f"--moe-router-enable-expert-bias: megatron-core's aux-loss-free bias needs sigmoid router scores, and "
            f"{arch.model_type} routes with a softmax (its rollout engines route without any bias either); drop it "
            "and balance with --moe-router-load-balancing-type / --moe-aux-loss-coeff"
        )


def check_ranges(cfg: DAPOConfig) -> None:
    """Every numeric field against the range declared next to its default (``_f(..., range=)``,
    megatron_dapo/ranges.py): NaN, the infinities and out-of-range values are refused in one
    line naming the flag."""
    for f, flag, value in numeric_fields(cfg, flag_of):
        err = range_error(f, flag, value)
        if err:
            raise ConfigError(err)


def validate(cfg: DAPOConfig, arch=None, on_gpu: Optional[bool] = None) -> list[str]:
    """Raise ConfigError on the first invalid combination; return a list of warnings.

    ``arch`` (a ModelArch) enables the model-shape checks.
    """
    check_ranges(cfg)
    if on_gpu is None:
        import torch

        on_gpu = torch.cuda.is_available()
    warnings: list[str] = []
    p, o, r, a = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    world = world_size(cfg)
    if world % (tp * pp * cp):
        raise ConfigError(
            f"world size {world} (--actor-num-nodes {p.nnodes} x --actor-num-gpus-per-node {p.gpus_per_node}) is not "
            f"divisible by --tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} x "
            f"--context-parallel-size {cp}"
        )
    dp = data_parallel_size(cfg)
    check_expert_layout(cfg, arch)
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
    if a.dynamic_sampling and r.n_samples_per_prompt < 2:
        raise ConfigError(
            f"--dynamic-sampling needs --n-samples-per-prompt >= 2 (a group of 1 is never mixed), got {r.n_samples_per_prompt}"
        )
    if r.placement == "colocated" and world % r.num_gpus_per_engine:
        raise ConfigError(f"world size {world} not divisible by --rollout-num-gpus-per-engine {r.num_gpus_per_engine}")
    if p.sequence_parallel and tp == 1:
        raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1")
    if p.sequence_parallel and cfg.model.transformer_impl == "local":
        raise ConfigError(
            "--sequence-parallel needs --transformer-impl transformer_engine (megatron's local norm refuses it without TE/apex)"
        )
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
        if r.engine != AUTO:
            on_cpu = ENGINE_KINDS.get(r.engine).on_cpu
            if on_cpu is None:
                raise ConfigError(
                    f"--rollout-engine {r.engine} needs a GPU (use {resolve_engine_kind(AUTO, False)} on CPU)"
                )
            refused = on_cpu(cfg)
            if refused:
                raise ConfigError(refused)
    if cfg.model.recompute_method and cfg.model.recompute_granularity != "full":
        raise ConfigError(
            f"--recompute-method {cfg.model.recompute_method} needs --recompute-granularity full, "
            f"got {cfg.model.recompute_granularity}"
        )
    check_placement(cfg)
    check_async(cfg, on_gpu)
    check_lora(cfg, arch, on_gpu)
    check_paths(cfg)
    if cfg.rollout.check_weight_sync_init and (cfg.checkpoint.load or cfg.model.pretrained_checkpoint):
        raise ConfigError(
            "--check-weight-sync-init needs the trainer to start from --hf-checkpoint's weights: drop it "
            "or drop --load / --pretrained-checkpoint"
        )
    try:
        a.validate()
    except ValueError as e:
        raise ConfigError(str(e)) from e
    # CISPO's bounds are an importance-weight band, whose lower side is often open (eps_low 1)
    if a.eps_clip_high < a.eps_clip_low and a.policy_loss != "cispo":
        raise ConfigError(
            f"--eps-clip-high {a.eps_clip_high} is below --eps-clip-low {a.eps_clip_low}: the ratio would be clipped "
            f"at 1 + {a.eps_clip_high} above and 1 - {a.eps_clip_low} below, the reverse of DAPO's clip-higher "
            "(eps_high >= eps_low, the paper's 0.28 / 0.2); swap the two values"
        )
    check_reward(cfg)
    if a.dynamic_sampling and a.dynamic_sampling_metric != "acc":
        warnings.append(
            f"--dynamic-sampling-metric {a.dynamic_sampling_metric}: DAPO filters on raw accuracy; filtering on the "
            "length-shaped score is known to collapse the policy"
        )
    return warnings


def stale_token_mode(cfg: DAPOConfig) -> Optional[str]:
    """How the trainer weighs tokens generated under older weights: 'correct' (min(pi_old /
    pi_engine, --tis-cap): the decoupled loss) under --async-mode, else --partial-rollout-offpolicy
    with --partial-rollout, else None (every token is of the current weights)."""
    r = cfg.rollout
    if r.async_mode != "off":
        return "correct"
    return r.partial_rollout_offpolicy if r.partial_rollout else None


def offload_train_default(cfg: DAPOConfig, on_gpu: bool) -> bool:
    """``--offload-train`` when not given: on with colocated engines on GPUs (the trainer gives
    the engines its memory while they generate), off on the CPU and with engines on GPUs of
    their own."""
    r = cfg.rollout
    if r.offload_train is not None:
        return bool(r.offload_train)
    return on_gpu and r.placement == "colocated"


def check_placement(cfg: DAPOConfig) -> None:
    """``--rollout-placement``: disaggregated engines need GPUs of their own, in whole engines."""
    r = cfg.rollout
    if r.placement == "colocated":
        if r.num_gpus:
            raise ConfigError(
                f"--rollout-num-gpus {r.num_gpus} gives the engines GPUs of their own: add --rollout-placement "
                "disaggregated (colocated engines use the trainer's GPUs)"
            )
        return
    if r.num_gpus < 1 or r.num_gpus % r.num_gpus_per_engine:
        raise ConfigError(
            f"--rollout-placement disaggregated needs --rollout-num-gpus, a multiple of --rollout-num-gpus-per-engine "
            f"{r.num_gpus_per_engine} (got {r.num_gpus})"
        )
    if r.offload_train:
        raise ConfigError(
            "--offload-train frees the trainer's GPU memory for colocated engines: with --rollout-placement "
            "disaggregated the engines have GPUs of their own, drop it"
        )


def check_async(cfg: DAPOConfig, on_gpu: bool) -> None:
    """``--async-mode``: what one-step-off needs and what it does not combine with yet."""
    r = cfg.rollout
    if r.staleness_control != "fixed" and r.async_mode == "off":
        raise ConfigError(
            f"--staleness-control {r.staleness_control} steers the lag of asynchronous training: set --async-mode "
            "one-step-off or bounded (with --async-mode off every step is on-policy already)"
        )
    if not r.staleness_ess_low < r.staleness_ess_high:
        raise ConfigError(
            f"--staleness-ess-low {r.staleness_ess_low} must be below --staleness-ess-high {r.staleness_ess_high} "
            "(the band between them is the controller's hysteresis)"
        )
    if cfg.algo.proximal_logprobs != "recompute" and r.async_mode == "off":
        raise ConfigError(
            f"--proximal-logprobs {cfg.algo.proximal_logprobs} approximates the proximal policy of tokens generated "
            "under older weights: set --async-mode one-step-off or bounded (on-policy, there are none)"
        )
    if r.async_mode == "off":
        return
    flag = f"--async-mode {r.async_mode}"
    if on_gpu and r.placement == "colocated":
        raise ConfigError(
            f"{flag} needs engines on GPUs of their own, so that they keep generating while the trainer trains: "
            "add --rollout-placement disaggregated --rollout-num-gpus N (or run with --async-mode off)"
        )
    if r.partial_rollout:
        raise ConfigError(f"{flag} with --partial-rollout is not built yet: drop one of them")
    if r.reuse_surplus_groups:
        raise ConfigError(f"{flag} with --reuse-surplus-groups is not built yet: drop one of them")


def lora_targets(cfg: DAPOConfig) -> tuple:
    """``--lora-target-modules`` as a tuple of HF projection names, in the order of
    ``LORA_TARGETS`` (space or comma separated; ``all-linear``: all of them). Raises ConfigError
    on a name that is no projection."""
    names = [n.strip() for item in cfg.model.lora_target_modules for n in str(item).split(",") if n.strip()]
    if "all-linear" in names:
        names = [n for n in names if n != "all-linear"] + list(LORA_TARGETS)
    bad = sorted({n for n in names if n not in LORA_TARGETS})
    if bad or not names:
        got = ", ".join(bad) if bad else "nothing"
        raise ConfigError(
            f"--lora-target-modules {got}: name HF projections, from {', '.join(LORA_TARGETS)} (or all-linear)"
        )
    return tuple(t for t in LORA_TARGETS if t in names)


def check_lora(cfg: DAPOConfig, arch=None, on_gpu: bool = False) -> None:
    """LoRA's flags (--lora-rank > 0): the targets against the model, and what --lora-sync adapter
    runs with (the HF engine, colocated, synchronous). Both layer specs take adapters (the TE
    spec with its norms unfused: models/provider.py)."""
    m = cfg.model
    if not m.lora_rank:
        return
    targets = lora_targets(cfg)
    if m.lora_dropout > 0 and cfg.parallel.tensor_model_parallel_size > 1:
        raise ConfigError(
            f"--lora-dropout {m.lora_dropout} with --tensor-model-parallel-size {cfg.parallel.tensor_model_parallel_size}: "
            "the TP ranks would draw different masks on the input their replicated LoRA A factors share; "
            "use --lora-dropout 0 (the default) at TP > 1"
        )
    if arch is not None:
        refusal = lora_moe_refusal(arch, targets)
        if refusal:
            raise ConfigError(refusal)
        narrowest = min(arch.hidden_size, arch.head_dim * arch.num_query_groups)
        if m.lora_rank > narrowest:
            raise ConfigError(
                f"--lora-rank {m.lora_rank} is above the narrowest adapted projection's width ({narrowest}): "
                "an adapter that wide is no low-rank update; lower it"
            )
    if m.lora_sync == "adapter":
        r = cfg.rollout
        engine = resolve_engine_kind(r.engine, on_gpu)
        other = (
            f"--rollout-engine {engine} (its adapter API is not wired yet: issue 41)"
            if engine != "hf"
            else "--rollout-placement disaggregated"
            if r.placement == "disaggregated"
            else f"--async-mode {r.async_mode}"
            if r.async_mode != "off"
            else None
        )
        if other:
            raise ConfigError(
                f"--lora-sync adapter with {other}: use --lora-sync merged, which folds the adapters into the "
                "weights every engine receives"
            )


def lr_warmup_optimizer_steps(cfg: DAPOConfig) -> int:
    """Warm-up in optimizer steps (the schedule's unit); rollout steps are converted."""
    o, r = cfg.optim, cfg.rollout
    if o.lr_warmup_rollout_steps is not None:
        per_rollout = (r.rollout_batch_size * r.n_samples_per_prompt) // o.global_batch_size
        return o.lr_warmup_rollout_steps * per_rollout
    return o.lr_warmup_iters


def hf_config_source(cfg) -> str:
    """Where the model shape and the tokenizer come from: --hf-checkpoint (required; a torch_dist
    checkpoint holds the weights, not the tokenizer files)."""
    if cfg.model.hf_checkpoint:
        return cfg.model.hf_checkpoint
    raise ConfigError("--hf-checkpoint is required (the model shape and tokenizer are read from its config.json)")
