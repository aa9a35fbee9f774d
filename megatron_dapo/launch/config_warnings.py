"""The dry run's warnings: settings that are valid but suspicious (layout across nodes, engine
TP against the heads, memory and throughput options, batch sizes, LR warm-up, missing data).
Nothing is refused here: :func:`megatron_dapo.config.validate` refuses; the report
(:mod:`megatron_dapo.launch.plan`) prints these."""

from __future__ import annotations

from typing import List

from ..config.schema import DAPOConfig
from ..config.validate import data_parallel_size
from ..models.hf_config import ModelArch
from ..rollout.engines import AUTO
from ..rollout.engines import engine_kind as engine_kind_spec
from .rank_layout import expert_group_size
from .schedule import lr_schedule


def plan_warnings(cfg: DAPOConfig, arch: ModelArch, on_gpu: bool) -> List[str]:
    """Suspicious but valid settings (the report prints them; nothing is refused here)."""
    w: List[str] = []
    p, o, r, a, d = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo, cfg.data
    tp = p.tensor_model_parallel_size
    dp = data_parallel_size(cfg)
    e = r.num_gpus_per_engine
    seq = d.max_prompt_length + a.max_response_length
    if tp > p.gpus_per_node:
        w.append(
            f"--tensor-model-parallel-size {tp} > --actor-num-gpus-per-node {p.gpus_per_node}: TP all-reduces cross nodes"
        )
    if e > p.gpus_per_node or p.gpus_per_node % e:
        w.append(
            f"--rollout-num-gpus-per-engine {e} does not divide --actor-num-gpus-per-node {p.gpus_per_node}: "
            "an engine spans two nodes (multi-node SGLang is not set up by this launcher)"
        )
    if arch.is_moe and expert_group_size(cfg) > p.gpus_per_node:
        w.append(
            f"--expert-tensor-parallel-size x --expert-model-parallel-size = {expert_group_size(cfg)} > "
            f"--actor-num-gpus-per-node {p.gpus_per_node}: every MoE layer's token all-to-all (and the weight sync's "
            "expert all-gather) crosses nodes"
        )
    if arch.num_attention_heads % e:
        w.append(f"rollout TP {e} does not divide the {arch.num_attention_heads} attention heads: SGLang refuses it")
    elif arch.num_query_groups % e and e % arch.num_query_groups:
        w.append(f"rollout TP {e} and {arch.num_query_groups} KV heads: uneven KV-head split")
    elif e > arch.num_query_groups:
        w.append(
            f"rollout TP {e} > {arch.num_query_groups} KV heads: the KV cache is replicated {e // arch.num_query_groups}x"
        )
    if dp > 1 and not p.use_distributed_optimizer:
        w.append(f"DP {dp} without --use-distributed-optimizer: Adam state replicated on every DP rank")
    if on_gpu and not cfg.model.bf16:
        w.append("GPU run without --bf16: fp32 weights double the memory and halve the throughput")
    if on_gpu and tp > 1 and not p.sequence_parallel:
        w.append("TP > 1 without --sequence-parallel: norm/residual activations are replicated on every TP rank")
    if o.max_tokens_per_gpu is None:
        w.append("--max-tokens-per-gpu not set: micro-batches are --micro-batch-size responses, unbalanced in tokens")
    elif o.max_tokens_per_gpu < seq:
        w.append(
            f"--max-tokens-per-gpu {o.max_tokens_per_gpu} < --max-prompt-length {d.max_prompt_length} + "
            f"--max-response-length {a.max_response_length} = {seq}: a longest sample does not fit one micro-batch"
        )
    osb = r.over_sampling_batch_size or r.rollout_batch_size
    if a.dynamic_sampling:
        if osb < r.rollout_batch_size:
            w.append(
                f"--over-sampling-batch-size {osb} < --rollout-batch-size {r.rollout_batch_size}: "
                "at least two generation rounds per step even if every group were mixed"
            )
        if r.max_num_gen_batches and osb * r.max_num_gen_batches < r.rollout_batch_size:
            w.append(
                f"--max-num-gen-batches {r.max_num_gen_batches} x --over-sampling-batch-size {osb} < "
                f"--rollout-batch-size {r.rollout_batch_size}: a step can never fill its batch"
            )
    elif r.over_sampling_batch_size and r.over_sampling_batch_size != r.rollout_batch_size:
        w.append("--over-sampling-batch-size has no effect without --dynamic-sampling")
    if r.mem_fraction_static > 0.9:
        w.append(
            f"--sglang-mem-fraction-static {r.mem_fraction_static} leaves little room for activations and CUDA graphs"
        )
    if on_gpu and r.engine != AUTO and not engine_kind_spec(r.engine).for_gpu:
        w.append(f"--rollout-engine {r.engine} on GPU: HF generate is far slower than SGLang for long responses")
    if o.lr > 1e-5 and arch.num_parameters > 5e9:
        w.append(f"--lr {o.lr} is high for a {arch.num_parameters / 1e9:.0f}B model (DAPO: 1e-6)")
    sched = lr_schedule(cfg)
    if sched.warmup_optimizer_steps > sched.total_optimizer_steps:
        w.append(
            f"LR warm-up ({sched.warmup_optimizer_steps} optimizer steps) is longer than the run "
            f"({sched.total_optimizer_steps} optimizer steps): the peak --lr is never reached"
        )
    if (
        o.lr_warmup_rollout_steps is None
        and o.lr_warmup_iters
        and sched.optimizer_steps_per_rollout_step
        and o.lr_warmup_iters % sched.optimizer_steps_per_rollout_step
    ):
        w.append(
            f"--lr-warmup-iters {o.lr_warmup_iters} is not a whole number of rollout steps "
            f"({sched.optimizer_steps_per_rollout_step} optimizer steps each)"
        )
    if cfg.data.prompt_data is None:
        w.append("--prompt-data not given: a real run needs it")
    return w
