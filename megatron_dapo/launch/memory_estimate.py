"""The dry run's per-GPU memory estimate: the trainer's weights, gradients, optimizer state,
activations and logits, the rollout engine's weights, KV cache and CUDA graphs, and the
longest sequence whose training step fits a GPU.

Pure functions of the config tree and the model shape: no GPU, no Ray, no process group.
:mod:`megatron_dapo.launch.plan` prints what they compute.

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
  the memory saver (rollout/sglang_launch.py ``graph_saver_launch``).
* Colocation: the hybrid engine offloads the trainer's weights, gradients and optimizer
  state during generation and releases the engine's weights and KV cache during training
  (megatron_dapo/hybrid), so the per-GPU peak is the larger of the two phases, plus a
  reserve for the CUDA context, NCCL buffers and the allocator's fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional

from ..config.schema import DAPOConfig
from ..config.validate import data_parallel_size, lora_targets, world_size
from ..models.hf_config import ModelArch, padded_vocab_size
from .rank_layout import expert_group_size

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
    lora_params_per_gpu: int = 0  # LoRA: the trained adapter parameters (the rest is frozen)

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


def stage_params(
    arch: ModelArch, tp: int, pp: int, make_vocab_size_divisible_by: int = 128, expert_group: int = 1
) -> List[int]:
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
    optimizer = (
        (params - experts) / (dp * cp) + experts / edp if p.use_distributed_optimizer else params
    ) * opt_per_param
    lora = lora_params_per_gpu(arch, tp, pp, cfg.model.lora_rank, lora_targets(cfg)) if cfg.model.lora_rank else 0
    if lora:  # the base frozen: gradients and optimizer state of the adapters only
        weights += lora * wbytes
        grads = lora * 4
        optimizer = (lora / (dp * cp) if p.use_distributed_optimizer else lora) * opt_per_param

    tokens = o.max_tokens_per_gpu
    if tokens is None:
        tokens = o.micro_batch_size * (cfg.data.max_prompt_length + cfg.algo.max_response_length)
    tokens_cp = math.ceil(tokens / cp)
    hid, tpp = _act_bytes_per_token_layer(arch, tp, p.sequence_parallel, wbytes, p.expert_tensor_parallel_size or tp)
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
        lora_params_per_gpu=lora,
    )


def lora_params_per_gpu(arch: ModelArch, tp: int, pp: int, rank: int, targets) -> int:
    """Adapter parameters on one GPU of the busiest stage (training/lora.py): a column-parallel
    projection's A whole and its B split by TP, a row-parallel one's A split and its B whole."""
    h, q, kv = arch.hidden_size, arch.num_attention_heads * arch.head_dim, arch.num_query_groups * arch.head_dim
    f = arch.ffn_hidden_size
    column = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "gate_proj": (h, f), "up_proj": (h, f)}
    row = {"o_proj": (q, h), "down_proj": (f, h)}
    per_layer = sum(rank * (i + o / tp) for t, (i, o) in column.items() if t in targets)
    per_layer += sum(rank * (i / tp + o) for t, (i, o) in row.items() if t in targets)
    return int(math.ceil(arch.num_layers / pp) * per_layer)


def smallest_fitting_nodes(cfg: DAPOConfig, arch: ModelArch, capacity_gb: float, most: int = 64) -> Optional[int]:
    """The fewest nodes (of ``--actor-num-gpus-per-node`` GPUs, at this TP x PP x CP) on which the
    colocated trainer and engines fit ``capacity_gb`` GPUs by this estimate, or None up to ``most``."""
    p = cfg.parallel
    for n in range(1, most + 1):
        if (n * p.gpus_per_node) % (
            p.tensor_model_parallel_size * p.pipeline_model_parallel_size * p.context_parallel_size
        ):
            continue
        trial = dataclasses.replace(cfg, parallel=dataclasses.replace(p, nnodes=n))
        m = estimate_memory(trial, arch, capacity_gb)
        if max(m.train_peak, m.rollout_peak) <= m.capacity:
            return n
    return None


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
