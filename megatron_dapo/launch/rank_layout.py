"""Where the trainer ranks and the rollout engines sit: megatron's rank order over
TP/CP/DP/PP, the nodes each rank and engine land on, and the size of a MoE layer's expert group.

Pure functions of the config tree (no GPU, no Ray): the dry-run report
(:mod:`megatron_dapo.launch.plan`) prints the layout, the memory estimate
(:mod:`megatron_dapo.launch.memory_estimate`) and the weight-sync plan
(:mod:`megatron_dapo.launch.weight_sync_plan`) build on it.
"""

from __future__ import annotations

import dataclasses
from typing import List

from ..config.schema import DAPOConfig
from ..config.validate import data_parallel_size, world_size


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


def expert_group_size(cfg: DAPOConfig) -> int:
    """ETP x EP: the ranks of one pipeline stage among which a layer's experts are split."""
    p = cfg.parallel
    return (p.expert_tensor_parallel_size or p.tensor_model_parallel_size) * p.expert_model_parallel_size
