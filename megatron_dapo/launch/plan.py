"""The ``--dry-run`` report: placement plan, per-GPU memory estimate, LR schedule, warnings.

Pure functions of the config tree and the model shape: no GPU, no Ray, no process group.
The driver calls::

    from megatron_dapo.launch.plan import dry_run_report
    print(dry_run_report(cfg, arch, hf_config_source))

``dry_run_report`` first runs :func:`megatron_dapo.config.validate` (a ``ConfigError``
propagates: the driver prints it and exits non-zero), then builds the report.

The parts are computed in modules of their own: the rank and engine layout
(:mod:`~megatron_dapo.launch.rank_layout`), the weight-sync plan
(:mod:`~megatron_dapo.launch.weight_sync_plan`), the per-GPU memory estimate and its model
(:mod:`~megatron_dapo.launch.memory_estimate`), the LR schedule
(:mod:`~megatron_dapo.launch.schedule`) and the warnings
(:mod:`~megatron_dapo.launch.config_warnings`); this module prints them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, List, Optional, Sequence

from ..config.schema import DAPOConfig
from ..config.validate import lora_targets, validate
from ..models.hf_config import ModelArch
from ..rollout.base import MEMORY_TAGS, WEIGHTS
from ..rollout.engines import AUTO, resolve_engine_kind
from ..rollout.engines import engine_kind as engine_kind_spec
from .config_warnings import plan_warnings
from .memory_estimate import (
    CUDA_CONTEXT_GB,
    GB,
    GPU_CAPACITY_GB,
    LOGPROB_CHUNK,
    MARGIN_FRACTION,
    RESERVE_GB,
    MemoryEstimate,
    estimate_memory,
    longest_fitting_sequence,
    smallest_fitting_nodes,
)
from .rank_layout import PlacementPlan, _span, expert_group_size, placement_plan
from .schedule import lr_schedule
from .weight_sync_plan import ENGINE_COPY_GBPS, INTER_NODE_GBPS, INTRA_NODE_GBPS, sync_plan


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _target_is_gpu(cfg: DAPOConfig) -> bool:
    p = cfg.parallel
    engine = cfg.rollout.engine
    return bool(cfg.model.bf16 or (engine != AUTO and engine_kind_spec(engine).on_cpu is None) or p.sequence_parallel)


def launch_order_lines(cfg: DAPOConfig, plan: PlacementPlan, engine_kind: str) -> List[str]:
    """The phases of a launch and of one step, in the order the driver runs them
    (driver/cluster.py, hybrid/phases.py)."""
    engine = engine_kind_spec(engine_kind).title or engine_kind
    released = "/".join(MEMORY_TAGS)
    resumed = "/".join(t for t in MEMORY_TAGS if t != WEIGHTS)
    if cfg.rollout.placement == "disaggregated":
        return [
            "--- launch order (driver/cluster.py; the engines on GPUs of their own) ---",
            f"launch order: 1. engines ({engine} TP{plan.gpus_per_engine} x {cfg.rollout.num_gpus // plan.gpus_per_engine})"
            " on their own GPUs, each sizing its KV cache from the free memory of its GPUs",
            f"  2. trainer builds model + optimizer (TP {plan.tp} x PP {plan.pp} x CP {plan.cp} x DP {plan.dp}) on its GPUs",
            "  3. first weight sync (a broadcast from trainer rank 0); 4. loop: generate -> train -> broadcast, the "
            "engines keep their memory (with --async-mode the two overlap)",
        ]
    return [
        "--- launch order (driver/cluster.py; memory per engine GPU below) ---",
        f"launch order: 1. engines ({engine} TP{plan.gpus_per_engine} x {plan.num_engines}) on free GPUs, each sizing "
        "its KV cache from the free memory at its launch (nothing of the trainer is resident yet)",
        f"  2. engines release {released}",
        f"  3. trainer builds model + optimizer (TP {plan.tp} x PP {plan.pp} x CP {plan.cp} x DP {plan.dp}, one rank per "
        "GPU, on the memory the engines released)",
        f"  4. first weight sync (trainer -> engines: engines resume {WEIGHTS}), trainer offloads, engines resume {resumed}",
        f"  5. loop: generate -> engines release {released} -> trainer onloads, trains -> engines resume {WEIGHTS} -> "
        f"weight sync -> trainer offloads -> engines resume {resumed}",
    ]


def engine_gpu_lines(name: str, mm: MemoryEstimate, msf: float, seq: int, per_engine: int) -> List[str]:
    """What each engine GPU gets at launch, and what it would get with the trainer resident."""
    full = mm.kv_tokens // seq if seq else 0
    old_share = mm.kv_tokens_trainer_resident / mm.kv_tokens if mm.kv_tokens else 0.0
    return [
        f"  {name} engine GPU at launch: free {_gb(mm.engine_free_at_launch)} ({mm.capacity / GB:.0f} GB - "
        f"{CUDA_CONTEXT_GB:.1f} GB CUDA context); --sglang-mem-fraction-static {msf} x free = {_gb(mm.engine_pool)} = "
        f"weights share {_gb(mm.engine_weights)} + KV cache budget {_gb(mm.kv_cache)} = {mm.kv_tokens:,} KV tokens per "
        f"engine = {full} full-length sequences at once ({min(1.0, full / per_engine if per_engine else 1):.0%} of the "
        "round; the rest queue)",
        f"    CUDA graphs {_gb(mm.engine_graphs)} (decode, batch sizes up to {mm.graph_max_bs}: SGLang's 2 MiB per batch "
        f"size) in the {_gb(mm.engine_slack)} outside the static pool; released with the cuda_graph tag during training",
        f"    old order (trainer weights + grads + optimizer {_gb(mm.static)} resident at launch): free "
        f"{_gb(mm.free_at_launch_trainer_resident)} -> KV cache budget {_gb(mm.kv_cache_trainer_resident)} = "
        f"{mm.kv_tokens_trainer_resident:,} KV tokens ({old_share:.0%} of the above)",
    ]


def _optimizer_shards(cfg: DAPOConfig, arch: ModelArch, plan: PlacementPlan) -> str:
    """Over which ranks the distributed optimizer shards its state (megatron-core: dense over
    DP x CP, experts over the expert-data-parallel group)."""
    dense = f"sharded over DP {plan.dp}" if plan.cp == 1 else f"sharded over DP {plan.dp} x CP {plan.cp}"
    if not arch.is_moe:
        return dense
    edp = max(1, plan.world // (plan.pp * expert_group_size(cfg)))
    return f"dense {dense}, experts over EDP {edp}"


def _abridged(items: Sequence, what: str, add) -> Iterator:
    """All of ``items`` when there are at most 32, else the first and last 4 with an
    ``... N more <what> ...`` line (``add``) between them."""
    if len(items) <= 32:
        yield from items
        return
    yield from items[:4]
    add(f"  ... {len(items) - 8} more {what} ...")
    yield from items[-4:]


def disaggregated_lines(cfg: DAPOConfig, arch: ModelArch, plan: PlacementPlan, unit: str) -> List[str]:
    """``--rollout-placement disaggregated``: the two pools, the memory of each, the sync and
    what overlaps (driver/cluster.py, hybrid/weight_broadcast.py)."""
    r = cfg.rollout
    k, n = r.num_gpus_per_engine, r.num_gpus
    engines = n // k
    more_nodes = -(-n // plan.gpus_per_node)
    mm = estimate_memory(cfg, arch, GPU_CAPACITY_GB["H100 80GB"])
    per_engine = r.rollout_batch_size * r.n_samples_per_prompt / max(engines, 1)
    seq = cfg.data.max_prompt_length + cfg.algo.max_response_length
    full = mm.kv_tokens // seq if seq else 0
    lines = [
        f"trainer pool: the {plan.world} {unit} above, nothing offloaded (the engines are elsewhere): on an H100 "
        f"80GB, weights + grads + optimizer {_gb(mm.static)} resident, training peak {_gb(mm.train_peak)}",
        f"engine pool: --rollout-num-gpus {n} {unit} of their own = {engines} engines x TP {k} (--rollout-num-gpus-"
        f"per-engine), about {more_nodes} more node(s) of {plan.gpus_per_node}; on an H100 80GB each engine GPU "
        f"holds its weights share {_gb(mm.engine_weights)} and a KV cache budget {_gb(mm.kv_cache)} "
        f"(--sglang-mem-fraction-static {r.mem_fraction_static} of {_gb(mm.engine_free_at_launch)} free) = "
        f"{mm.kv_tokens:,} KV tokens = {full} full-length sequences at once "
        f"({min(1.0, full / per_engine if per_engine else 1):.0%} of its share of a step), kept across steps",
        f"weight sync: trainer rank 0 gathers every bucket (TP / PP / EP shards into the engine's HF names) and "
        f"broadcasts it once to all {engines} engines over one collective group they join "
        f"({'NCCL' if unit == 'GPUs' else 'gloo'}; hybrid/weight_broadcast.py); the engines are idle at the sync",
    ]
    if r.async_mode == "off":
        lines.append(
            "overlap: none with --async-mode off: the engines wait while the trainer trains and the trainer while "
            "they generate; add --async-mode one-step-off or bounded to overlap them"
        )
    else:
        lines.append(
            f"overlap: --async-mode {r.async_mode}: the engines generate the next step(s) while the trainer trains, "
            "a step taking about max(generation, training) + sync instead of their sum (benchmarks/bench_async.py "
            "simulates the 32B recipe: docs/benchmarks.md, 'Asynchronous DAPO (simulated)')"
        )
    return lines


def dry_run_report(
    cfg: DAPOConfig,
    arch: ModelArch,
    hf_config_source: str = "",
    on_gpu: Optional[bool] = None,
    checks: Optional[Sequence] = None,
) -> str:
    """Validate ``cfg`` against ``arch`` and describe the run without starting anything.

    ``on_gpu``: the target hardware; by default a GPU cluster when the config asks for GPU
    features (``--bf16``, ``--rollout-engine sglang``, ``--sequence-parallel``), else CPU
    (context parallelism runs on both). Raises ``ConfigError`` on an invalid configuration.
    ``checks``: the preflight checks (``launch.preflight_result.Checks``: data, tokenizer, checkpoints,
    disk, outputs), printed last, one ``[check]`` line each.
    """
    if on_gpu is None:
        on_gpu = _target_is_gpu(cfg)
    warnings = list(validate(cfg, arch, on_gpu=on_gpu))
    plan = placement_plan(cfg)
    p, o, r, a, d = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo, cfg.data
    out: List[str] = []
    add = out.append
    add("=== megatron-dapo dry run: configuration valid, nothing started ===")
    add(
        f"model: {arch.model_type} {arch.num_parameters / 1e9:.2f}B params, {arch.num_layers} layers, hidden "
        f"{arch.hidden_size}, FFN {arch.ffn_hidden_size}, {arch.num_attention_heads} heads / "
        f"{arch.num_query_groups} KV heads x {arch.head_dim}, vocab {arch.vocab_size}, "
        f"{'tied' if arch.tie_word_embeddings else 'untied'} embeddings"
        + (
            f"; {arch.num_experts} experts of width {arch.moe_ffn_hidden_size}, top-{arch.moe_router_topk}, "
            f"expert parallel EP {p.expert_model_parallel_size} x ETP "
            f"{p.expert_tensor_parallel_size or p.tensor_model_parallel_size}"
            if arch.is_moe
            else ""
        )
    )
    if hf_config_source:
        add(f"model shape from: {hf_config_source}")
    add(f"target: {'GPU' if on_gpu else 'CPU'} ({'bf16' if cfg.model.bf16 else 'fp32'}), rollout engine {r.engine}")

    add("")
    unit = "GPUs" if on_gpu else "CPU workers"
    dis = r.placement == "disaggregated"
    add(
        f"--- placement (one Ray placement group, one bundle per {unit[:-1]}; "
        + ("the engines in a group of their own) ---" if dis else "trainer and engines colocated) ---")
    )
    add(
        f"{plan.nnodes} nodes x {plan.gpus_per_node} {unit} = {plan.world} {unit}; TP {plan.tp} x PP {plan.pp} x "
        f"CP {plan.cp} x DP {plan.dp}"
    )
    for n in _abridged(plan.nodes, "nodes", add):
        add(
            f"  node {n.node:>3}: ranks {_span(n.ranks)}, PP stage {_span(n.pp_stages)}, DP replica "
            f"{_span(n.dp_replicas)}" + ("" if dis else f", engines {_span(n.engines)}")
        )
    if dis:
        out.extend(disaggregated_lines(cfg, arch, plan, unit))
    else:
        add(
            f"rollout: {plan.num_engines} engines = {plan.world} GPUs / --rollout-num-gpus-per-engine "
            f"{plan.gpus_per_engine} (engine TP {plan.gpus_per_engine}), colocated with the trainer ranks on the same "
            "GPUs"
        )
        for en in _abridged(plan.engines, "engines", add):
            add(f"  engine {en.index:>3}: GPUs {_span(en.gpus)} (node {_span(en.nodes)})")

    if r.async_mode != "off":
        bound = 1 if r.async_mode == "one-step-off" else r.max_staleness
        control = (
            f"the lag steered between 0 and {bound} by each step's ESS / N and ratio tail (--staleness-control ess, "
            f"low {r.staleness_ess_low:g}, high {r.staleness_ess_high:g})"
            if r.staleness_control == "ess"
            else f"a lag of {bound} (none across a checkpoint)"
        )
        what = (
            "the rollout of step n+1 runs while step n trains, with the weights before step n"
            if r.async_mode == "one-step-off"
            else f"the engines generate up to {bound} steps ahead of the trainer; a rollout more than the allowed "
            "lag old when its step trains is regenerated"
        )
        add(
            f"async: --async-mode {r.async_mode}: {what}; {control}; old tokens weighted by min(pi_old / pi_engine, "
            f"--tis-cap {a.tis_cap:g}) (docs/rollout.md, 'Asynchronous DAPO')"
        )

    add("")
    engine_kind = resolve_engine_kind(r.engine, on_gpu)
    out.extend(launch_order_lines(cfg, plan, engine_kind))
    cpu_note = engine_kind_spec(engine_kind).cpu_memory_note
    if not on_gpu and cpu_note:
        add(f"  on this CPU machine: {cpu_note}")

    add("")
    sp = sync_plan(cfg, arch, engine_kind)
    add("--- weight sync plan (every rank feeds the engine on its own GPUs; docs/hybrid.md) ---")
    add(
        f"each feeder gathers (TP) and receives (PP) every bucket: {_gb(sp.bytes_per_feeder)} per feeder and sync "
        f"({'bf16' if cfg.model.bf16 else 'fp32'}), {sp.num_buckets} buckets of {sp.bucket_bytes / 2**20:.0f} MiB "
        f"(--update-weight-buffer-size), {sp.buffers} bucket buffers per GPU = {_gb(sp.extra_peak_bytes)} extra peak"
    )
    if sp.expert_bytes_per_feeder:
        add(
            f"experts: {_gb(sp.expert_bytes_per_feeder)} of it per feeder ({arch.num_layers} layers x "
            f"{arch.num_experts} experts), {_gb(sp.expert_gathered_bytes)} all-gathered from the other "
            f"{sp.expert_group - 1} ranks of each stage's ETP x EP group ("
            + (
                f"{_gb(sp.expert_cross_node_bytes)} of it from other nodes"
                if sp.expert_cross_node_bytes
                else "within the node"
            )
            + f"); one bucket slot per layer's fc1 / fc2 of all "
            f"experts ({'per-expert' if engine_kind_spec(engine_kind).weight_naming == 'checkpoint' else 'fused'} names for the {engine_kind} engine)"
        )
    add(
        f"engine TP rank j <- feeder rank (first + j) on the same node: one payload of memory handles per feeder "
        f"({'CUDA IPC' if on_gpu else 'shared memory'}); Ray carries one small call per bucket and engine, "
        "no tensor bytes (object store unused)"
    )
    for f in _abridged(sp.feeds, "engines", add):
        where = f"node {f.node}" if f.node is not None else "SPANS NODES (refused at launch)"
        cross = f", {_gb(f.cross_node_bytes)} of it from PP stages on other nodes" if f.cross_node_bytes else ""
        add(
            f"  engine {f.engine:>3} ({where}) <- ranks {_span(f.feeders)}: {_gb(sp.bytes_per_feeder)} per feeder{cross}"
        )
    add(
        f"expected sync: {sp.seconds:.2f} s for all engines in parallel at {INTRA_NODE_GBPS:.0f} GB/s intra-node "
        f"(NVLink gathers), {INTER_NODE_GBPS:.0f} GB/s between nodes, {ENGINE_COPY_GBPS:.0f} GB/s engine copy (HBM)"
        if on_gpu
        else f"expected sync: {sp.seconds:.2f} s at the GPU figures ({INTRA_NODE_GBPS:.0f} GB/s intra-node); on CPU "
        "the copies run at memory bandwidth (benchmarks/bench_weight_sync.py)"
    )
    if any(f.node is None for f in sp.feeds):
        warnings.append(
            f"--rollout-num-gpus-per-engine {plan.gpus_per_engine} does not divide --actor-num-gpus-per-node "
            f"{plan.gpus_per_node}: an engine would span nodes (CUDA IPC does not cross nodes)"
        )

    add("")
    add("--- per-GPU memory estimate (GB = 1e9 bytes; rough) ---")
    mems = {name: estimate_memory(cfg, arch, cap) for name, cap in GPU_CAPACITY_GB.items()}
    m = next(iter(mems.values()))
    wb = "bf16" if cfg.model.bf16 else "fp32"
    add(
        f"trainer: {m.params_per_gpu / 1e9:.3f}B params per GPU (busiest PP stage; total "
        f"{arch.num_parameters / 1e9:.2f}B / (TP {plan.tp} x PP {plan.pp}))"
    )
    lora = m.lora_params_per_gpu
    if lora:
        add(
            f"  LoRA rank {cfg.model.lora_rank} on {','.join(lora_targets(cfg))}: {lora / 1e6:.2f}M adapter params per "
            "GPU trained; the base frozen (no gradients, no optimizer state; docs/lora.md)"
        )
    add(f"  weights {wb:<17}{_gb(m.weights):>10}{'  (base + adapters)' if lora else ''}")
    add(f"  grads fp32               {_gb(m.grads):>10}{'  (adapters only)' if lora else ''}")
    add(
        f"  Adam m+v{' + fp32 main' if cfg.model.bf16 else ''}     {_gb(m.optimizer):>10}"
        f"  ({_optimizer_shards(cfg, arch, plan) if p.use_distributed_optimizer else 'not sharded (no --use-distributed-optimizer)'})"
    )
    add(f"  = static                 {_gb(m.static):>10}")
    add(
        f"  activations for {m.tokens_per_gpu} tokens/GPU (--max-tokens-per-gpu"
        f"{', / CP ' + str(plan.cp) if plan.cp > 1 else ''}; first stage, PP {plan.pp} micro-batches in flight):"
    )
    mark = lambda on: "  <- configured" if on else ""  # noqa: E731
    sel = " (selective: about the same with flash attention)" if cfg.model.recompute_granularity == "selective" else ""
    add(
        f"    no recompute           {_gb(m.activations_no_recompute):>10}{mark(not m.recompute)}{sel if not m.recompute else ''}"
    )
    add(f"    full recompute         {_gb(m.activations_full_recompute):>10}{mark(m.recompute)}")
    add(f"  logits (vocab / TP)      {_gb(m.logits):>10}  (bf16 + grad; fp32 only {LOGPROB_CHUNK} tokens at a time)")
    add(f"  + reserve                {_gb(RESERVE_GB * GB):>10}")
    add(f"  = training peak          {_gb(m.train_peak):>10}")
    add(
        f"rollout engine (TP {r.num_gpus_per_engine}): weights bf16 {_gb(m.engine_weights)} per GPU; KV cache "
        f"{arch.num_layers} layers x 2 x {max(1, arch.num_query_groups // r.num_gpus_per_engine)} KV heads/GPU x "
        f"{arch.head_dim} x 2 bytes = {m.kv_bytes_per_token / 1024:.0f} KiB per token per GPU"
    )
    osb = r.over_sampling_batch_size or r.rollout_batch_size
    seqs_round = osb * r.n_samples_per_prompt
    per_engine = math.ceil(seqs_round / plan.num_engines)
    seq = d.max_prompt_length + a.max_response_length
    add(
        f"  one generation round: {osb} prompts x {r.n_samples_per_prompt} = {seqs_round} sequences, "
        f"{per_engine} per engine, up to {seq} tokens each ({_gb(per_engine * seq * m.kv_bytes_per_token)} "
        "of KV per GPU if all ran at once)"
    )
    for name, mm in mems.items():
        out.extend(engine_gpu_lines(name, mm, r.mem_fraction_static, seq, per_engine))
    add("colocated (trainer offloaded during generation, engine released during training):")
    for name, mm in mems.items():
        peak = max(mm.train_peak, mm.rollout_peak)
        ok = peak <= mm.capacity
        add(
            f"  {name}: training {_gb(mm.train_peak)}, generation {_gb(mm.rollout_peak)} -> peak {_gb(peak)} "
            f"of {mm.capacity / GB:.0f} GB: {'fits' if ok else 'DOES NOT FIT'}"
        )
    if lora:
        fits = {name: smallest_fitting_nodes(cfg, arch, cap) for name, cap in GPU_CAPACITY_GB.items()}
        full = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, lora_rank=0))
        fits_full = {name: smallest_fitting_nodes(full, arch, cap) for name, cap in GPU_CAPACITY_GB.items()}
        shown = lambda n: f"{n} node(s)" if n else "more than 64 nodes"  # noqa: E731
        add(
            f"smallest node count at TP {plan.tp} x PP {plan.pp} x CP {plan.cp} ({plan.gpus_per_node} {unit} per node) "
            "on which it fits, LoRA vs full fine-tuning: "
            + "; ".join(f"{name} {shown(fits[name])} vs {shown(fits_full[name])}" for name in GPU_CAPACITY_GB)
        )
    packed = o.use_packing or plan.cp > 1
    add(
        f"micro-batches: {'packed (THD, no padding; each sequence padded to the multiple TP/CP need)' if packed else 'THD, consecutive responses, at most --micro-batch-size each (--use-packing packs them by tokens)'}"
        f", up to {m.tokens_per_gpu} tokens; DP shards balanced by tokens (Karmarkar-Karp)"
    )
    for name, cap in GPU_CAPACITY_GB.items():
        fit = longest_fitting_sequence(cfg, arch, cap)
        verdict = (
            f"a {seq}-token sequence fits at CP {plan.cp}"
            if fit >= seq
            else f"a {seq}-token sequence does NOT fit at CP {plan.cp}: raise --context-parallel-size"
        )
        add(
            f"  {name}: longest sequence whose training step leaves {MARGIN_FRACTION:.0%} free: {fit:,} tokens -> {verdict}"
        )
    if on_gpu:
        h100 = mems["H100 80GB"]
        if longest_fitting_sequence(cfg, arch, h100.capacity / GB) < seq:
            warnings.append(
                f"one {seq}-token sequence does not fit an 80 GB GPU with {MARGIN_FRACTION:.0%} margin at CP {plan.cp}: "
                "raise --context-parallel-size (or TP / recompute)"
            )
        if h100.train_peak > h100.capacity:
            if (
                not h100.recompute
                and h100.train_peak - h100.activations_no_recompute + h100.activations_full_recompute <= h100.capacity
            ):
                warnings.append(
                    "training does not fit an 80 GB GPU without recompute; --recompute-granularity full would fit"
                )
            else:
                warnings.append(
                    "training does not fit an 80 GB GPU: raise TP/PP, shard the optimizer or lower --max-tokens-per-gpu"
                )
        if h100.engine_weights > h100.engine_pool:
            warnings.append(
                f"engine weights {_gb(h100.engine_weights)} exceed --sglang-mem-fraction-static x 80 GB: raise "
                "--rollout-num-gpus-per-engine"
            )
        elif h100.kv_tokens < seq:
            warnings.append(
                f"an engine's KV cache ({h100.kv_tokens} tokens) cannot hold one {seq}-token sequence on 80 GB"
            )

    add("")
    s = lr_schedule(cfg)
    add("--- LR schedule ---")
    add(f"AdamW lr {s.lr:g}, constant after linear warm-up; weight decay {o.weight_decay}, clip-grad {o.clip_grad}")
    add(
        f"optimizer steps per rollout step = --rollout-batch-size {r.rollout_batch_size} x --n-samples-per-prompt "
        f"{r.n_samples_per_prompt} / --global-batch-size {o.global_batch_size} = {s.optimizer_steps_per_rollout_step}"
    )
    add(
        f"warm-up: {s.warmup_rollout_steps:g} rollout steps = {s.warmup_optimizer_steps} optimizer steps"
        f" (given as {'--lr-warmup-rollout-steps' if o.lr_warmup_rollout_steps is not None else '--lr-warmup-iters'})"
    )
    add(f"run: {s.total_rollout_steps} rollout steps = {s.total_optimizer_steps} optimizer steps")
    add(
        f"DAPO: eps {a.eps_clip_low}/{a.eps_clip_high}, dual-clip c {a.clip_ratio_c}, loss {a.loss_agg_mode}, "
        f"dynamic sampling {a.dynamic_sampling} ({osb} prompts per round, at most "
        f"{r.max_num_gen_batches or 'unbounded'} rounds), max response {a.max_response_length} "
        f"(overlong buffer {a.overlong_buffer_length}), max prompt {d.max_prompt_length} ({d.prompt_overflow})"
    )

    warnings += plan_warnings(cfg, arch, on_gpu)
    add("")
    if warnings:
        add(f"--- warnings ({len(warnings)}) ---")
        out.extend(f"WARNING: {x}" for x in warnings)
    else:
        add("--- warnings: none ---")
    if checks is not None:
        add("")
        add(f"--- {checks.title()} (files, tokenizer, checkpoints, disk; launch/preflight.py) ---")
        out.extend(c.line for c in checks)
    return "\n".join(out)
