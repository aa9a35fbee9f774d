"""Process groups: the default group, megatron's model-parallel groups, and their teardown.

Everything distributed in this package takes process groups as arguments; this module is
the one place that creates them (from torchrun/Ray environment variables or explicit ranks).
"""

from __future__ import annotations

import datetime
import gc
import os
from typing import Optional

import torch
import torch.distributed as dist

from . import platform
from .ports import PORT_RANGE_LOW, ephemeral_port_range, free_port  # noqa: F401  (re-exported)


def collective_device(group=None) -> torch.device:
    """Where a tensor must live to be reduced over ``group``: the current CUDA device for an
    NCCL group, the host for gloo (a host tensor handed to NCCL fails; a CUDA one to gloo too).

    In the strict-collectives test mode on CPU (``platform.strict_collectives``) the group's
    production kind decides: ``cpu:0`` (the mode's mark of an accelerator tensor) for a group
    that is NCCL in production, ``cpu`` for a host group."""
    if platform.strict_installed() and not platform.cuda_available():
        return platform.ACCELERATOR_MARK if platform.group_kind(group) == platform.ACCELERATOR else torch.device("cpu")
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def dp_token_counts(values, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``values`` summed (or reduced by ``op``) over the data-parallel ``group`` (float64),
    created on the device that group's backend reduces on (CUDA for NCCL, host for gloo)."""
    from megatron.core import parallel_state as ps

    g = group if group is not None else ps.get_data_parallel_group()
    t = torch.tensor(list(values), dtype=torch.float64, device=collective_device(g))
    if dist.get_world_size(g) > 1:
        if op == dist.ReduceOp.SUM:
            dist.all_reduce(t, group=g)
        else:
            dist.all_reduce(t, op=op, group=g)
    return t


def init_distributed(
    rank: Optional[int] = None,
    world_size: Optional[int] = None,
    master_addr: Optional[str] = None,
    master_port: Optional[int] = None,
    backend: Optional[str] = None,
    timeout_s: float = 600.0,
) -> None:
    """Initialise the default process group (gloo on CPU, nccl on GPU) once per process."""
    platform.apply_cpu_patches()
    if dist.is_initialized():
        return
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    os.environ["MASTER_ADDR"] = master_addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(master_port or os.environ.get("MASTER_PORT", "29500"))
    if platform.cuda_available():
        local_rank = int(os.environ.get("LOCAL_RANK", rank % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local_rank)
    platform.install_strict_collectives(default_backend=backend)  # a no-op unless the test mode is on
    dist.init_process_group(
        backend or platform.dist_backend(),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_parallel(
    tensor_model_parallel_size: int = 1,
    pipeline_model_parallel_size: int = 1,
    context_parallel_size: int = 1,
    seed: int = 1234,
    expert_model_parallel_size: int = 1,
    expert_tensor_parallel_size: Optional[int] = None,
) -> None:
    """(Re)initialise megatron's model-parallel groups over the default group and seed RNGs.

    Experts (mixture-of-experts models) are laid out by megatron's second decomposition of
    the same ranks: per pipeline stage, ``expert_tensor_parallel_size`` (default: the TP size)
    x ``expert_model_parallel_size`` x the expert-data-parallel rest; the EP group of a rank is
    drawn from its TP x CP x DP ranks (docs/moe.md)."""
    from megatron.core import parallel_state as ps

    if not dist.is_initialized():
        init_distributed()
    world = dist.get_world_size()
    mp = tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size
    if world % mp:
        raise ValueError(
            f"world size {world} is not divisible by --tensor-model-parallel-size {tensor_model_parallel_size} x "
            f"--pipeline-model-parallel-size {pipeline_model_parallel_size} x --context-parallel-size {context_parallel_size}"
        )
    etp = expert_tensor_parallel_size or tensor_model_parallel_size
    emp = etp * expert_model_parallel_size * pipeline_model_parallel_size
    if world % emp:
        raise ValueError(
            f"world size {world} is not divisible by --expert-tensor-parallel-size {etp} x "
            f"--expert-model-parallel-size {expert_model_parallel_size} x --pipeline-model-parallel-size "
            f"{pipeline_model_parallel_size}"
        )
    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tensor_model_parallel_size,
        pipeline_model_parallel_size=pipeline_model_parallel_size,
        context_parallel_size=context_parallel_size,
        expert_model_parallel_size=expert_model_parallel_size,
        expert_tensor_parallel_size=etp,
    )
    platform.manual_seed(seed)


def destroy_parallel() -> None:
    """Tear down megatron's model-parallel state AND its process groups.

    ``destroy_model_parallel`` only forgets megatron's handles; the groups stay registered in
    torch's c10d maps, and every gloo group keeps its TCP loop threads polling. A process
    that re-initialises parallel state many times (the test pools, a long-lived actor) would
    pile up thousands of such threads, so every group but the default one is destroyed here.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    if ps.model_parallel_is_initialized():
        ps.destroy_model_parallel()
    if not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d as c10d

    # What still holds a group after that (a held group is never freed, whatever torch's maps say;
    # measured on megatron-core 0.16.1: one body of tests/foundation left 17 of these threads):
    # globals that destroy_model_parallel leaves set (_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP),
    # and RotaryEmbedding.forward's lru_cache, which keeps the last models' rotary modules (and
    # their cp_group) alive.
    for name, value in list(vars(ps).items()):
        if isinstance(value, dist.ProcessGroup):
            setattr(ps, name, None)
    cache_clear = getattr(RotaryEmbedding.forward, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
    default = c10d._get_default_group()
    for pg in list(c10d._world.pg_map):
        if pg is not default:
            try:
                dist.destroy_process_group(pg)
            except Exception:  # a group torch already tore down
                pass
    gc.collect()  # the groups' last references may sit in cycles (modules, closures)


def barrier(group=None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)
