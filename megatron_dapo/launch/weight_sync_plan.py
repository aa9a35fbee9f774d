"""The dry run's weight-sync plan: which trainer ranks feed which rollout engine, how many
bytes and buckets each feeder moves, and the expected seconds of one sync at stated bandwidths.

Pure functions of the config tree and the model shape (no GPU, no Ray); the sync itself is
hybrid/weight_sync.py, and :mod:`megatron_dapo.launch.plan` prints this plan.
"""

from __future__ import annotations

import dataclasses
import math
from typing import List, Optional

from ..config.schema import DAPOConfig
from ..config.validate import world_size
from ..models.hf_config import ModelArch
from ..rollout.engines import engine_kind as engine_kind_spec
from .memory_estimate import GB, stage_params
from .rank_layout import expert_group_size

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
    seconds = (total - net) / (INTRA_NODE_GBPS * GB) + net / (INTER_NODE_GBPS * GB) + total / (ENGINE_COPY_GBPS * GB)
    return SyncPlan(
        feeds,
        total,
        bucket,
        math.ceil(total / bucket),
        buffers,
        seconds,
        expert_bytes_per_feeder=experts,
        expert_gathered_bytes=experts - experts // group,
        expert_group=group,
        expert_cross_node_bytes=expert_cross,
    )
