"""The ``--dry-run`` report: placement plan, per-GPU memory estimate, LR schedule, warnings.

Pure functions of the config tree and the model shape: no GPU, no Ray, no process group.
The driver calls::

    from megatron_dapo.launch.plan import dry_run_report
    print(dry_run_report(cfg, arch, hf_config_source))

``dry_run_report`` first runs :func:`megatron_dapo.config.validate` (a ``ConfigError``
propagates: the driver prints it and exits non-zero), then builds the report.

Memory model (decimal GB, 1 GB = 1e9 bytes; GPU capacities are the nominal 80 GB of an
H100 and 141 GB of an H200, which understates their real HBM a little, so the check is on
the safe side):

* Trainer, per GPU, for the busiest pipeline stage (its layers, plus the embedding on the
  first stage and the output layer on the last, each vocabulary-parallel over TP):
  weights 2 bytes/param (bf16; 4 in fp32), gradients 4 bytes/param (megatron's fp32 main
  grads), Adam m + v 8 bytes/param plus 4 bytes/param of fp32 main parameters when the
  weights are bf16; the optimizer part is divided by DP with ``--use-distributed-optimizer``.
* Activations for one micro-batch of ``--max-tokens-per-gpu`` tokens (divided by CP), per
  layer and token: layer-norm inputs, QKV, attention output, MLP gate/up/activation
  (flash attention: no s x s scores; a MoE layer: the router's scores and every token's top-k
  routed copies, :func:`_act_bytes_per_token_layer`), bf16; the tensor-parallel parts are divided by TP,
  the hidden-size parts only with ``--sequence-parallel``. The first pipeline stage holds
  up to PP micro-batches in flight (1F1B), so it holds about ``num_layers`` layers' worth.
  With full recompute only each layer's input is kept, plus one layer's full activations
  while it is recomputed. Logits: the bf16 logits and their gradient (4 bytes per token and
  vocabulary entry of the TP shard) plus the float32 temporaries of the chunked logprob and
  entropy stage, 16 bytes per vocabulary entry for ``LOGPROB_CHUNK`` tokens at a time
  (``training.logprobs``: no float32 [tokens x vocab] tensor). The token budget is the same
  for both groupings of the THD micro-batches (--use-packing only changes which responses share one);
  CP divides it. :func:`longest_fitting_sequence` inverts the model: the longest single
  sequence whose training step fits a GPU with a margin, so the report says whether CP is
  needed for the configured response length.
* Rollout engine, per GPU: bf16 weights / rollout TP, and a KV cache of
  ``layers x 2 x kv_heads_per_gpu x head_dim x 2 bytes`` per token in what is left of
  ``--sglang-mem-fraction-static`` x the free memory at the engine's launch (SGLang 0.5.23's
  sizing, ``kv_cache_configurator._profile_available_bytes``: free memory after the weights
  minus ``(1 - mem_fraction_static)`` x the free memory before them). The engines are
  launched first, on GPUs that hold nothing but a CUDA context (``CUDA_CONTEXT_GB``); the
  report compares the budget with the old order, where the trainer's weights, gradients and
  optimizer state were resident at the engines' launch. CUDA graphs live in the remaining
  ``(1 - mem_fraction_static)`` share: SGLang's own estimate, 2 MiB per decode batch size up to
  the captured maximum (``arg_groups/memory_hook.py`` ``reserve_for_graph_mb`` and the
  ``max_bs`` defaults of ``handle_gpu_memory_settings``); the prefill graph is disabled under
  the memory saver (rollout/sglang_engine.py ``graph_saver_launch``).
* Colocation: the hybrid engine offloads the trainer's weights, gradients and optimizer
  state during generation and releases the engine's weights and KV cache during training
  (megatron_dapo/hybrid), so the per-GPU peak is the larger of the two phases, plus a
  reserve for the CUDA context, NCCL buffers and the allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional, Sequence

from ..config.schema import DAPOConfig
from ..config.validate import data_parallel_size, lr_warmup_optimizer_steps, validate, world_size
from ..models.hf_config import ModelArch, padded_vocab_size
from ..rollout.base import MEMORY_TAGS, WEIGHTS
from ..rollout.engines import AUTO, engine_kind as engine_kind_spec, resolve_engine_kind

GB = 1e9
#: Nominal GPU memory (GB) the estimate is compared with.
GPU_CAPACITY_GB = {"H100 80GB": 80.0, "H200 141GB": 141.0}
#: CUDA context, NCCL buffers, allocator fragmentation: kept free in every phase.
RESERVE_GB = 4.0
#: Activation/cuda-graph workspace SGLang needs outside its static pool.
ENGINE_WORKSPACE_GB = 4.0
#: What a GPU holds when an engine starts on it before anything else: CUDA context, NCCL buffers.
CUDA_CONTEXT_GB = 1.0
#: SGLang 0.5.23's decode CUDA-graph memory estimate per captured batch size (MiB).
GRAPH_MIB_PER_BATCH_SIZE = 2
#: Tokens per chunk of the logprob/entropy stage (megatron_dapo.training.logprobs.DEFAULT_CHUNK).
LOGPROB_CHUNK = 2048
#: Free memory the plan keeps on top of its estimate when it calls a layout a fit.
MARGIN_FRACTION = 0.15


# ----------------------------------------------------------------------------- placement


@dataclasses.dataclass(frozen=True)
class RankCoord:
    rank: int
    tp: int
    cp: int
    dp: int
    pp: int


def rank_coord(rank: int, tp: int, cp: int, dp: int, pp: int) -> RankCoord:
    """Megatron's default rank order (``tp-cp-ep-dp-pp``, EP = 1): TP varies fastest."""
    r = rank
    t = r % tp
    r //= tp
    c = r % cp
    r //= cp
    d = r % dp
    r //= dp
    return RankCoord(rank, t, c, d, r)


@dataclasses.dataclass(frozen=True)
class NodePlan:
    node: int
    ranks: range
    pp_stages: tuple
    dp_replicas: tuple
    engines: tuple


@dataclasses.dataclass(frozen=True)
class EnginePlan:
    index: int
    gpus: range  # global GPU (= trainer rank) indices
    nodes: tuple


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    nnodes: int
    gpus_per_node: int
    world: int
    tp: int
    pp: int
    cp: int
    dp: int
    gpus_per_engine: int
    nodes: List[NodePlan]
    engines: List[EnginePlan]

    @property
    def num_engines(self) -> int:
        return len(self.engines)


def _span(xs) -> str:
    xs = sorted(set(xs))
    if not xs:
        return "-"
    if xs == list(range(xs[0], xs[-1] + 1)):
        return str(xs[0]) if len(xs) == 1 else f"{xs[0]}-{xs[-1]}"
    return ",".join(map(str, xs))


def placement_plan(cfg: DAPOConfig) -> PlacementPlan:
    """Which trainer ranks and rollout engines sit on which node (global GPU i = rank i)."""
    p = cfg.parallel
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    world, dp, g = world_size(cfg), data_parallel_size(cfg), p.gpus_per_node
    e = cfg.rollout.num_gpus_per_engine
    engines = [
        EnginePlan(i, range(i * e, (i + 1) * e), tuple(sorted({r // g for r in range(i * e, (i + 1) * e)})))
        for i in range(world // e)
    ]
    nodes = []
    for n in range(p.nnodes):
        ranks = range(n * g, (n + 1) * g)
        coords = [rank_coord(r, tp, cp, dp, pp) for r in ranks]
        nodes.append(
            NodePlan(
                n,
                ranks,
                tuple(sorted({c.pp for c in coords})),
                tuple(sorted({c.dp for c in coords})),
                tuple(en.index for en in engines if n in en.nodes),
            )
        )
    return PlacementPlan(p.nnodes, g, world, tp, pp, cp, dp, e, nodes, engines)


# ----------------------------------------------------------------------------- weight sync

#: Stated bandwidths of the sync estimate (GB/s per GPU, effective): the TP all-gather and PP
#: broadcast inside a node (NVLink, NCCL bus bandwidth), a PP broadcast between nodes
#: (InfiniBand, 400 Gb/s per GPU), and the engine's copy out of the feeder's memory (HBM
#: read + write).
INTRA_NODE_GBPS = 200.0
INTER_NODE_GBPS = 40.0
ENGINE_COPY_GBPS = 1000.0


@dataclasses.dataclass(frozen=True)
class EngineFeed:
    engine: int
    node: Optional[int]  # None: the engine's GPUs span nodes (refused at launch)
    feeders: range  # feeder rank = engine TP rank + feeders.start
    cross_node_bytes: int  # bytes each feeder receives over the network (PP stages on other nodes)


@dataclasses.dataclass(frozen=True)
class SyncPlan:
    """Who feeds which engine, and the expected cost of one sync (all engines in parallel)."""

    feeds: List[EngineFeed]
    bytes_per_feeder: int  # the full HF model in the parameters' dtype: every feeder holds it all
    bucket_bytes: int
    num_buckets: int
    buffers: int  # bucket buffers per feeder (2 for HFEngine; 3 for SGLang, which reads a bucket until the next call returns)
    seconds: float
    # mixture of experts: the experts' part of bytes_per_feeder, and what of it reaches a
    # feeder's stage by the expert all-gather (the other ETP x EP ranks' experts)
    expert_bytes_per_feeder: int = 0
    expert_gathered_bytes: int = 0
    expert_group: int = 1  # ETP x EP ranks of one stage's expert all-gather
    # what of expert_gathered_bytes comes from ranks on other nodes (an ETP x EP group wider
    # than a node: megatron lays a group out on consecutive ranks)
    expert_cross_node_bytes: int = 0

    @property
    def extra_peak_bytes(self) -> int:
        return min(self.bucket_bytes, self.bytes_per_feeder) * self.buffers


def sync_plan(cfg: DAPOConfig, arch: ModelArch, engine_kind: str = "hf") -> SyncPlan:
    """The weight-sync plan (hybrid/weight_sync.py ``engine_feeders`` and ``PayloadSink``): engine
    ``e`` is fed by the ranks on its GPUs; each feeder gathers (TP) and receives (PP) every
    bucket, so it moves the whole model; the estimate is that volume at the stated bandwidths
    (intra-node for the gathers and same-node stages, inter-node for stages on other nodes)
    plus the engine's copy."""
    p = cfg.parallel
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    world, g, k = world_size(cfg), p.gpus_per_node, cfg.rollout.num_gpus_per_engine
    dtype_bytes = 2 if cfg.model.bf16 else 4
    total = arch.num_parameters * dtype_bytes
    stages = stage_params(arch, tp, pp, cfg.model.make_vocab_size_divisible_by)
    share = [x / sum(stages) for x in stages]
    per_stage = world // pp  # ranks per PP stage (megatron order: PP outermost)
    feeds, worst_cross = [], 0
    for e in range(world // k):
        ranks = range(e * k, (e + 1) * k)
        nodes = {r // g for r in ranks}
        cross = 0
        for r in ranks:
            me = r % per_stage
            c = sum(share[s] for s in range(pp) if (me + s * per_stage) // g != r // g) * total
            cross = max(cross, int(c))
        worst_cross = max(worst_cross, cross)
        feeds.append(EngineFeed(e, nodes.pop() if len(nodes) == 1 else None, ranks, cross))
    bucket = cfg.rollout.update_weight_buffer_size
    buffers = engine_kind_spec(engine_kind).lag + 2
    experts = arch.num_layers * arch.expert_parameters_per_layer * dtype_bytes
    group = expert_group_size(cfg) if arch.is_moe else 1
    # the expert all-gather of a feeder's own stage: the group's ranks beyond its node send over the network
    expert_cross = int(experts / pp * (group - min(group, g)) / group) if group > g else 0
    net = worst_cross + expert_cross
    seconds = (total - net) / (INTRA_NODE_GBPS * GB) + net / (INTER_NODE_GBPS * GB) + total / (
        ENGINE_COPY_GBPS * GB)
    return SyncPlan(feeds, total, bucket, math.ceil(total / bucket), buffers, seconds,
                    expert_bytes_per_feeder=experts, expert_gathered_bytes=experts - experts // group,
                    expert_group=group, expert_cross_node_bytes=expert_cross)


def expert_group_size(cfg: DAPOConfig) -> int:
    """ETP x EP: the ranks of one pipeline stage among which a layer's experts are split."""
    p = cfg.parallel
    return (p.expert_tensor_parallel_size or p.tensor_model_parallel_size) * p.expert_model_parallel_size


# ----------------------------------------------------------------------------- memory


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes of each part (see the module docstring for the model)."""

    params_per_gpu: int  # parameters on the busiest pipeline stage's GPU
    weights: float
    grads: float
    optimizer: float
    activations_no_recompute: float
    activations_full_recompute: float
    logits: float
    recompute: bool  # what the config asks for
    tokens_per_gpu: Optional[int]
    engine_weights: float
    engine_pool: float  # mem_fraction_static x free memory at the engine's launch
    kv_bytes_per_token: int  # per GPU of one engine
    capacity: float
    engine_free_at_launch: float = 0.0  # capacity - CUDA context (engines launched first)
    engine_graphs: float = 0.0  # SGLang's decode CUDA graphs (released with the cuda_graph tag)
    graph_max_bs: int = 0
    mem_fraction_static: float = 0.0

    @property
    def static(self) -> float:
        return self.weights + self.grads + self.optimizer

    @property
    def activations(self) -> float:
        return self.activations_full_recompute if self.recompute else self.activations_no_recompute

    @property
    def train_peak(self) -> float:
        return self.static + self.activations + self.logits + RESERVE_GB * GB

    @property
    def kv_cache(self) -> float:
        return max(0.0, self.engine_pool - self.engine_weights)

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV pool of one engine holds (each GPU holds its heads for every token)."""
        return int(self.kv_cache // self.kv_bytes_per_token) if self.kv_bytes_per_token else 0

    @property
    def engine_slack(self) -> float:
        """What SGLang leaves outside its static pool: CUDA graphs and activations."""
        return (1 - self.mem_fraction_static) * self.engine_free_at_launch

    @property
    def free_at_launch_trainer_resident(self) -> float:
        """Free memory at the engine's launch had the trainer been built first (the old order)."""
        return max(0.0, self.engine_free_at_launch - self.static)

    @property
    def kv_cache_trainer_resident(self) -> float:
        return max(0.0, self.mem_fraction_static * self.free_at_launch_trainer_resident - self.engine_weights)

    @property
    def kv_tokens_trainer_resident(self) -> int:
        return int(self.kv_cache_trainer_resident // self.kv_bytes_per_token) if self.kv_bytes_per_token else 0

    @property
    def rollout_peak(self) -> float:
        return self.engine_pool + ENGINE_WORKSPACE_GB * GB + RESERVE_GB * GB


def sglang_graph_max_bs(capacity_gb: float, engine_tp: int) -> int:
    """The decode CUDA-graph batch-size maximum sglang 0.5.23 picks for a GPU of this size
    (``arg_groups/memory_hook.py`` ``handle_gpu_memory_settings``; GPU memory in MiB)."""
    mib = capacity_gb * GB / 2**20
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 48 if engine_tp < 4 else 160
    if mib < 60 * 1024:
        return 32 if engine_tp < 4 else 160
    if mib < 160 * 1024:
        return 256 if engine_tp < 4 else 512
    return 512


def sglang_graph_bytes(capacity_gb: float, engine_tp: int) -> float:
    """SGLang's estimate of its decode CUDA-graph memory per GPU (``reserve_for_graph_mb``:
    ``max_bs * 2`` MiB; no prefill graph: disabled under the memory saver)."""
    return sglang_graph_max_bs(capacity_gb, engine_tp) * GRAPH_MIB_PER_BATCH_SIZE * 2**20


def _per_layer_params(arch: ModelArch) -> int:
    """One layer's parameters that TP splits (attention, dense MLP, norms); a MoE layer's router
    is :func:`_router_params` (replicated on every TP rank), its experts
    :func:`expert_params_per_gpu`'s."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_query_groups * arch.head_dim
    attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if arch.qkv_bias else 0)
    mlp = 0 if arch.is_moe else 3 * h * f
    return attn + mlp + 2 * h + (2 * arch.head_dim if arch.qk_layernorm else 0)


def _router_params(arch: ModelArch) -> int:
    """One MoE layer's router weight ``[E, H]``: every TP rank holds all of it."""
    return arch.num_experts * arch.hidden_size if arch.is_moe else 0


def expert_params_per_gpu(arch: ModelArch, pp: int, expert_group: int) -> int:
    """The experts one GPU of a stage holds: its stage's layers x experts / (ETP x EP)."""
    return arch.num_layers // pp * arch.expert_parameters_per_layer // expert_group


def stage_params(arch: ModelArch, tp: int, pp: int, make_vocab_size_divisible_by: int = 128,
                 expert_group: int = 1) -> List[int]:
    """Parameters held by one GPU of each pipeline stage (TP-sharded; a MoE model's experts
    split over ``expert_group`` = ETP x EP ranks; norms counted once)."""
    v = padded_vocab_size(arch.vocab_size, make_vocab_size_divisible_by, tp)
    emb = v * arch.hidden_size // tp
    layer = _per_layer_params(arch) // tp + _router_params(arch) + arch.expert_parameters_per_layer // expert_group
    per_stage = [arch.num_layers // pp * layer for _ in range(pp)]
    per_stage[0] += emb
    if not arch.tie_word_embeddings or pp > 1:
        # untied output layer, or megatron's copy of the tied embedding on the last stage
        per_stage[-1] += emb
    per_stage[-1] += arch.hidden_size  # final norm
    return per_stage


def _act_bytes_per_token_layer(arch: ModelArch, tp: int, sp: bool, dtype_bytes: int, etp: int = 1) -> tuple:
    """(hidden-size part, tensor-parallel part) of one layer's stored activations per token of
    the micro-batch.

    A MoE layer (megatron-core's alltoall dispatcher): each rank holds ``tokens / TP`` tokens
    (sequence parallel; a MoE model trains at TP > 1 only with it) and routes each to top-k
    experts; the ETP x EP ranks of an expert group together process every routed copy of their
    tokens, each copy on the EP rank of its expert and, ETP-split, on ETP ranks; balanced, a rank
    holds ``ETP x tokens x top-k / TP`` copies, each with its dispatched input and combined
    output (the probabilities' gradient needs it), ``2 H``, and its share of fc1 out and the
    activation, ``3 I / ETP``: per token of the micro-batch ``top-k x (2 H x ETP + 3 I) / TP``.
    The router's logits and scores (``E`` values, bf16 and fp32) are per token of the rank."""
    h, f = arch.hidden_size, arch.ffn_hidden_size
    q = arch.num_attention_heads * arch.head_dim
    kv = arch.num_query_groups * arch.head_dim
    hidden = 4 * h * dtype_bytes  # two norm inputs, QKV input, MLP input
    if arch.is_moe:
        hidden += arch.num_experts * (dtype_bytes + 4)  # router logits + fp32 scores
        moe = arch.moe_router_topk * (2 * h * etp + 3 * arch.moe_ffn_hidden_size) * dtype_bytes
        tpp = (3 * q + 2 * kv) * dtype_bytes + moe  # Q/K/V, attn out + o_proj in; routed copies
    else:
        tpp = (3 * q + 2 * kv + 3 * f) * dtype_bytes  # Q/K/V, attn out + o_proj in, gate/up, act
    return hidden / (tp if sp else 1), tpp / tp


def estimate_memory(cfg: DAPOConfig, arch: ModelArch, capacity_gb: float = 80.0) -> MemoryEstimate:
    p, o, r = cfg.parallel, cfg.optim, cfg.rollout
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    dp = data_parallel_size(cfg)
    wbytes = 2 if cfg.model.bf16 else 4
    group = expert_group_size(cfg) if arch.is_moe else 1
    params = max(stage_params(arch, tp, pp, cfg.model.make_vocab_size_divisible_by, group))
    weights = params * wbytes
    grads = params * 4
    opt_per_param = 8 + (4 if cfg.model.bf16 else 0)
    # the distributed optimizer shards dense state over DP x CP and expert state over the
    # expert-data-parallel ranks (world / (PP x ETP x EP))
    experts = expert_params_per_gpu(arch, pp, group)
    edp = max(1, world_size(cfg) // (pp * group))
    # dense state: megatron-core's distributed optimizer shards it over DP x CP (its dp_cp group)
    optimizer = ((params - experts) / (dp * cp) + experts / edp if p.use_distributed_optimizer else params) * opt_per_param

    tokens = o.max_tokens_per_gpu
    if tokens is None:
        tokens = o.micro_batch_size * (cfg.data.max_prompt_length + cfg.algo.max_response_length)
    tokens_cp = math.ceil(tokens / cp)
    hid, tpp = _act_bytes_per_token_layer(arch, tp, p.sequence_parallel, wbytes,
                                          p.expert_tensor_parallel_size or tp)
    layers_in_flight = arch.num_layers // pp * pp  # first stage: its layers x PP micro-batches (1F1B)
    full = tokens_cp * layers_in_flight * (hid + tpp)
    layer_input = arch.hidden_size * wbytes / (tp if p.sequence_parallel else 1)
    recomputed = tokens_cp * (layers_in_flight * layer_input + 2 * (hid + tpp))
    v = padded_vocab_size(arch.vocab_size, cfg.model.make_vocab_size_divisible_by, tp)
    logits = tokens_cp * (v // tp) * 4 + min(tokens_cp, LOGPROB_CHUNK) * (v // tp) * 16
    recompute = cfg.model.recompute_granularity == "full"
    if cfg.model.recompute_granularity == "selective":
        recompute = False  # flash attention: selective recompute saves little; count as none

    rtp = r.num_gpus_per_engine
    free_at_launch = (capacity_gb - CUDA_CONTEXT_GB) * GB
    engine_weights = arch.num_parameters * 2 / rtp
    kv_heads_per_gpu = max(1, arch.num_query_groups // rtp)
    kv_per_token = arch.num_layers * 2 * kv_heads_per_gpu * arch.head_dim * 2
    return MemoryEstimate(
        params_per_gpu=params,
        weights=weights,
        grads=grads,
        optimizer=optimizer,
        activations_no_recompute=full,
        activations_full_recompute=recomputed,
        logits=logits,
        recompute=recompute,
        tokens_per_gpu=tokens,
        engine_weights=engine_weights,
        engine_pool=r.mem_fraction_static * free_at_launch,
        kv_bytes_per_token=kv_per_token,
        capacity=capacity_gb * GB,
        engine_free_at_launch=free_at_launch,
        engine_graphs=sglang_graph_bytes(capacity_gb, rtp),
        graph_max_bs=sglang_graph_max_bs(capacity_gb, rtp),
        mem_fraction_static=r.mem_fraction_static,
    )


def longest_fitting_sequence(cfg: DAPOConfig, arch: ModelArch, capacity_gb: float) -> int:
    """The most tokens one micro-batch (one sequence at the budget) may hold so that the
    training step fits ``capacity_gb`` with ``MARGIN_FRACTION`` left free, at the configured
    TP/PP/CP and recompute (tokens of the whole sequence: CP splits it)."""
    lo, hi = 0, 1 << 22
    while lo < hi:  # the estimate grows with the token budget: bisect it
        mid = (lo + hi + 1) // 2
        probe = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, max_tokens_per_gpu=mid))
        if estimate_memory(probe, arch, capacity_gb).train_peak <= (1 - MARGIN_FRACTION) * capacity_gb * GB:
            lo = mid
        else:
            hi = mid - 1
    return lo


# ----------------------------------------------------------------------------- LR schedule


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    lr: float
    optimizer_steps_per_rollout_step: int
    warmup_optimizer_steps: int
    warmup_rollout_steps: float
    total_rollout_steps: int
    total_optimizer_steps: int


def lr_schedule(cfg: DAPOConfig) -> LRSchedule:
    o, r = cfg.optim, cfg.rollout
    per = (r.rollout_batch_size * r.n_samples_per_prompt) // o.global_batch_size
    warm = lr_warmup_optimizer_steps(cfg)
    return LRSchedule(
        lr=o.lr,
        optimizer_steps_per_rollout_step=per,
        warmup_optimizer_steps=warm,
        warmup_rollout_steps=warm / per if per else float("nan"),
        total_rollout_steps=cfg.run.num_rollout_steps,
        total_optimizer_steps=cfg.run.num_rollout_steps * per,
    )


# ----------------------------------------------------------------------------- report


def _gb(x: float) -> str:
    return f"{x / GB:.1f} GB"


def _target_is_gpu(cfg: DAPOConfig) -> bool:
    p = cfg.parallel
    engine = cfg.rollout.engine
    return bool(cfg.model.bf16 or (engine != AUTO and engine_kind_spec(engine).needs_gpu) or p.sequence_parallel)


def plan_warnings(cfg: DAPOConfig, arch: ModelArch, on_gpu: bool) -> List[str]:
    """Suspicious but valid settings (the report prints them; nothing is refused here)."""
    w: List[str] = []
    p, o, r, a, d = cfg.parallel, cfg.optim, cfg.rollout, cfg.algo, cfg.data
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    dp = data_parallel_size(cfg)
    e = r.num_gpus_per_engine
    seq = d.max_prompt_length + a.max_response_length
    if tp > p.gpus_per_node:
        w.append(f"--tensor-model-parallel-size {tp} > --actor-num-gpus-per-node {p.gpus_per_node}: TP all-reduces cross nodes")
    if e > p.gpus_per_node or p.gpus_per_node % e:
        w.append(
            f"--rollout-num-gpus-per-engine {e} does not divide --actor-num-gpus-per-node {p.gpus_per_node}: "
            "an engine spans two nodes (multi-node SGLang is not set up by this launcher)"
        )
    if arch.is_moe and expert_group_size(cfg) > p.gpus_per_node:
        w.append(
            f"--expert-tensor-parallel-size x --expert-model-parallel-size = {expert_group_size(cfg)} > "
            f"--actor-num-gpus-per-node {p.gpus_per_node}: every MoE layer's token all-to-all (and the weight sync's "
            "expert all-gather) crosses nodes")
    if arch.num_attention_heads % e:
        w.append(f"rollout TP {e} does not divide the {arch.num_attention_heads} attention heads: SGLang refuses it")
    elif arch.num_query_groups % e and e % arch.num_query_groups:
        w.append(f"rollout TP {e} and {arch.num_query_groups} KV heads: uneven KV-head split")
    elif e > arch.num_query_groups:
        w.append(f"rollout TP {e} > {arch.num_query_groups} KV heads: the KV cache is replicated {e // arch.num_query_groups}x")
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
        w.append(f"--sglang-mem-fraction-static {r.mem_fraction_static} leaves little room for activations and CUDA graphs")
    if on_gpu and r.engine != AUTO and not engine_kind_spec(r.engine).needs_gpu:
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


def launch_order_lines(cfg: DAPOConfig, plan: PlacementPlan, engine_kind: str) -> List[str]:
    """The phases of a launch and of one step, in the order the driver runs them
    (driver/cluster.py, hybrid/phases.py)."""
    engine = engine_kind_spec(engine_kind).title or engine_kind
    released = "/".join(MEMORY_TAGS)
    resumed = "/".join(t for t in MEMORY_TAGS if t != WEIGHTS)
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
    ``checks``: the preflight checks (``launch.preflight.Checks``: data, tokenizer, checkpoints,
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
        + (f"; {arch.num_experts} experts of width {arch.moe_ffn_hidden_size}, top-{arch.moe_router_topk}, "
           f"expert parallel EP {p.expert_model_parallel_size} x ETP "
           f"{p.expert_tensor_parallel_size or p.tensor_model_parallel_size}" if arch.is_moe else "")
    )
    if hf_config_source:
        add(f"model shape from: {hf_config_source}")
    add(f"target: {'GPU' if on_gpu else 'CPU'} ({'bf16' if cfg.model.bf16 else 'fp32'}), rollout engine {r.engine}")

    add("")
    unit = "GPUs" if on_gpu else "CPU workers"
    add(f"--- placement (one Ray placement group, one bundle per {unit[:-1]}; trainer and engines colocated) ---")
    add(
        f"{plan.nnodes} nodes x {plan.gpus_per_node} {unit} = {plan.world} {unit}; TP {plan.tp} x PP {plan.pp} x "
        f"CP {plan.cp} x DP {plan.dp}"
    )
    shown = plan.nodes if len(plan.nodes) <= 32 else plan.nodes[:4] + plan.nodes[-4:]
    for i, n in enumerate(shown):
        if len(plan.nodes) > 32 and i == 4:
            add(f"  ... {len(plan.nodes) - 8} more nodes ...")
        add(
            f"  node {n.node:>3}: ranks {_span(n.ranks)}, PP stage {_span(n.pp_stages)}, DP replica "
            f"{_span(n.dp_replicas)}, engines {_span(n.engines)}"
        )
    add(
        f"rollout: {plan.num_engines} engines = {plan.world} GPUs / --rollout-num-gpus-per-engine "
        f"{plan.gpus_per_engine} (engine TP {plan.gpus_per_engine}), colocated with the trainer ranks on the same GPUs"
    )
    shown_e = plan.engines if len(plan.engines) <= 32 else plan.engines[:4] + plan.engines[-4:]
    for i, en in enumerate(shown_e):
        if len(plan.engines) > 32 and i == 4:
            add(f"  ... {len(plan.engines) - 8} more engines ...")
        add(f"  engine {en.index:>3}: GPUs {_span(en.gpus)} (node {_span(en.nodes)})")

    add("")
    engine_kind = resolve_engine_kind(r.engine, on_gpu)
    out.extend(launch_order_lines(cfg, plan, engine_kind))

    add("")
    sp = sync_plan(cfg, arch, engine_kind)
    add("--- weight sync plan (every rank feeds the engine on its own GPUs; docs/hybrid.md) ---")
    add(
        f"each feeder gathers (TP) and receives (PP) every bucket: {_gb(sp.bytes_per_feeder)} per feeder and sync "
        f"({'bf16' if cfg.model.bf16 else 'fp32'}), {sp.num_buckets} buckets of {sp.bucket_bytes / 2**20:.0f} MiB "
        f"(--update-weight-buffer-size), {sp.buffers} bucket buffers per GPU = {_gb(sp.extra_peak_bytes)} extra peak"
    )
    if sp.expert_bytes_per_feeder:
        add(f"experts: {_gb(sp.expert_bytes_per_feeder)} of it per feeder ({arch.num_layers} layers x "
            f"{arch.num_experts} experts), {_gb(sp.expert_gathered_bytes)} all-gathered from the other "
            f"{sp.expert_group - 1} ranks of each stage's ETP x EP group ("
            + (f"{_gb(sp.expert_cross_node_bytes)} of it from other nodes" if sp.expert_cross_node_bytes else
               "within the node") +
            f"); one bucket slot per layer's fc1 / fc2 of all "
            f"experts ({'per-expert' if engine_kind_spec(engine_kind).weight_naming == 'checkpoint' else 'fused'} names for the {engine_kind} engine)")
    add(
        f"engine TP rank j <- feeder rank (first + j) on the same node: one payload of memory handles per feeder "
        f"({'CUDA IPC' if on_gpu else 'shared memory'}); Ray carries one small call per bucket and engine, "
        "no tensor bytes (object store unused)"
    )
    shown_f = sp.feeds if len(sp.feeds) <= 32 else sp.feeds[:4] + sp.feeds[-4:]
    for i, f in enumerate(shown_f):
        if len(sp.feeds) > 32 and i == 4:
            add(f"  ... {len(sp.feeds) - 8} more engines ...")
        where = f"node {f.node}" if f.node is not None else "SPANS NODES (refused at launch)"
        cross = f", {_gb(f.cross_node_bytes)} of it from PP stages on other nodes" if f.cross_node_bytes else ""
        add(f"  engine {f.engine:>3} ({where}) <- ranks {_span(f.feeders)}: {_gb(sp.bytes_per_feeder)} per feeder{cross}")
    add(
        f"expected sync: {sp.seconds:.2f} s for all engines in parallel at {INTRA_NODE_GBPS:.0f} GB/s intra-node "
        f"(NVLink gathers), {INTER_NODE_GBPS:.0f} GB/s between nodes, {ENGINE_COPY_GBPS:.0f} GB/s engine copy (HBM)"
        if on_gpu else
        f"expected sync: {sp.seconds:.2f} s at the GPU figures ({INTRA_NODE_GBPS:.0f} GB/s intra-node); on CPU "
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
    add(f"  weights {wb:<17}{_gb(m.weights):>10}")
    add(f"  grads fp32               {_gb(m.grads):>10}")
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
    add(f"    no recompute           {_gb(m.activations_no_recompute):>10}{mark(not m.recompute)}{sel if not m.recompute else ''}")
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
    packed = o.use_packing or plan.cp > 1
    add(
        f"micro-batches: {'packed (THD, no padding; each sequence padded to the multiple TP/CP need)' if packed else 'THD, consecutive responses, at most --micro-batch-size each (--use-packing packs them by tokens)'}"
        f", up to {m.tokens_per_gpu} tokens; DP shards balanced by tokens (Karmarkar-Karp)"
    )
    for name, cap in GPU_CAPACITY_GB.items():
        fit = longest_fitting_sequence(cfg, arch, cap)
        verdict = (f"a {seq}-token sequence fits at CP {plan.cp}" if fit >= seq else
                   f"a {seq}-token sequence does NOT fit at CP {plan.cp}: raise --context-parallel-size")
        add(f"  {name}: longest sequence whose training step leaves {MARGIN_FRACTION:.0%} free: {fit:,} tokens -> {verdict}")
    if on_gpu:
        h100 = mems["H100 80GB"]
        if longest_fitting_sequence(cfg, arch, h100.capacity / GB) < seq:
            warnings.append(
                f"one {seq}-token sequence does not fit an 80 GB GPU with {MARGIN_FRACTION:.0%} margin at CP {plan.cp}: "
                "raise --context-parallel-size (or TP / recompute)"
            )
        if h100.train_peak > h100.capacity:
            if not h100.recompute and h100.train_peak - h100.activations_no_recompute + h100.activations_full_recompute <= h100.capacity:
                warnings.append("training does not fit an 80 GB GPU without recompute; --recompute-granularity full would fit")
            else:
                warnings.append("training does not fit an 80 GB GPU: raise TP/PP, shard the optimizer or lower --max-tokens-per-gpu")
        if h100.engine_weights > h100.engine_pool:
            warnings.append(
                f"engine weights {_gb(h100.engine_weights)} exceed --sglang-mem-fraction-static x 80 GB: raise "
                "--rollout-num-gpus-per-engine"
            )
        elif h100.kv_tokens < seq:
            warnings.append(f"an engine's KV cache ({h100.kv_tokens} tokens) cannot hold one {seq}-token sequence on 80 GB")

    add("")
    s = lr_schedule(cfg)
    add("--- LR schedule ---")
    add(
        f"AdamW lr {s.lr:g}, constant after linear warm-up; weight decay {o.weight_decay}, clip-grad {o.clip_grad}"
    )
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
