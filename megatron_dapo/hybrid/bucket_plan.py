"""The weight sync's resharding planner: which megatron tensors go in which bucket, at which
byte offsets, under which HF names and shapes.

Pure computation on metadata (names, shard shapes, dtypes, group sizes): no process group, no
collective, no tensor data. Its execution lies elsewhere: :class:`~.weight_sync.WeightSync`
exchanges the stages' lists (the only collectives of planning) and drives the buckets,
``bucket_gather.py`` fills a bucket's buffer by the plan (all-gathers, HF conversion, views)
and ``bucket_sinks.py`` hands it to the engines.

Plan
----
The first sync of a ``WeightSync`` exchanges, once, each stage's list of local parameters
(name, shard shape, dtype) over the PP group; from it every participating rank computes the
same bucket plan (:func:`build_plan`): the tensors of one owning stage in model order, packed
into buckets of at most ``bucket_bytes`` (a tensor larger than a bucket goes alone), with the
HF names, shapes and byte offsets of what each slot holds after conversion (computed with
``mapping.megatron_to_hf`` on meta tensors).

A layer's ``linear_fc1`` of all experts is ONE slot of the plan (likewise ``linear_fc2``):
``[E, *full expert tensor]`` in global expert order (``mapping.expert_stack_name``); its HF
names depend on the engine's naming (:func:`plan_hf_names`). Tied embeddings: the last
stage's copy of the output layer is left out of the plan (the engine ties ``lm_head`` itself).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from ..checkpoint import mapping
from ..checkpoint.model_io import layer_offset, unwrap
from .sync_errors import WeightSyncError

DEFAULT_BUCKET_BYTES = 512 * 1024**2
ALIGN = 256  # byte alignment of every slot and HF tensor inside a bucket


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


DTYPES = {str(d): d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8)}


@dataclasses.dataclass
class PlannedTensor:
    """One megatron tensor in the plan (a slot of a bucket)."""

    gname: str  # megatron full name (global layer index)
    stage: int  # owning PP rank (group rank in the PP group)
    local_index: int  # index among the owner's local tensors (same on its TP ranks)
    shard_shape: Tuple[int, ...]
    dtype: torch.dtype
    tp_dim: Optional[int]  # None: replicated over TP
    full_shape: Tuple[int, ...] = ()
    offset: int = 0  # byte offset of the slot in its bucket
    nbytes: int = 0  # slot bytes (full megatron tensor, aligned)
    hf: List[Tuple[str, Tuple[int, ...], int]] = dataclasses.field(
        default_factory=list
    )  # (name, shape, byte offset in slot)
    # an expert stack (gname = mapping.expert_stack_name): the local experts' indices among the
    # owner's local tensors, in local expert order; shard_shape is one expert's shard
    experts: Optional[Tuple[int, ...]] = None

    @property
    def is_stack(self) -> bool:
        return self.experts is not None


@dataclasses.dataclass
class Bucket:
    """One bucket of the plan: tensors of one owning stage, their slots packed in order."""

    stage: int
    tensors: List[PlannedTensor]
    nbytes: int


def elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def local_params(chunks: Sequence, arch) -> Iterator[Tuple[str, torch.Tensor]]:
    """(global megatron name, local parameter) of this rank, model order, tied copy skipped."""
    for chunk in chunks:
        inner = unwrap(chunk)
        off = layer_offset(inner)
        for local, p in inner.named_parameters():
            if mapping.is_lora_param(local):
                continue  # an adapter: no tensor of the base model (training/lora.py)
            gname = mapping.local_to_global(local, off)
            if gname == "output_layer.weight" and arch.tie_word_embeddings:
                continue  # the tied copy on the last stage
            yield gname, p


class MergedLocal(Sequence):
    """This rank's local parameters as the sync reads them: a LoRA-adapted weight (its module
    holds adapters, ``mapping.LORA_ATTR``: training/lora.py) is read as ``W + (alpha / r) B A``,
    computed when the bucket that holds it is filled (one merged shard at a time in memory);
    every other parameter is itself."""

    def __init__(self, params: Sequence[torch.Tensor], owners: dict):
        self.params, self.owners = list(params), owners  # index -> the linear holding adapters

    def __len__(self) -> int:
        return len(self.params)

    def __getitem__(self, i):  # type: ignore[override]
        p = self.params[i]
        mod = self.owners.get(i)
        if mod is None:
            return p
        with torch.no_grad():
            return (p.float() + getattr(mod, mapping.LORA_ATTR).delta_weight().to(p.device)).to(p.dtype)


def lora_owners(chunks: Sequence, local: Sequence[Tuple[str, torch.Tensor]]) -> dict:
    """Index in ``local`` (:func:`local_params`) -> the module holding the LoRA adapters of that
    weight, for the adapted weights only (empty without LoRA)."""
    by_param = {}
    for chunk in chunks:
        for mod in unwrap(chunk).modules():
            if getattr(mod, mapping.LORA_ATTR, None) is not None and getattr(mod, "weight", None) is not None:
                by_param[id(mod.weight)] = mod
    return {i: by_param[id(p)] for i, (_, p) in enumerate(local) if id(p) in by_param}


def local_entries(local: Sequence[Tuple[str, torch.Tensor]], moe: bool) -> list:
    """This rank's plan entries from its :func:`local_params` (``local``), model order:
    ``(gname, shard shape, dtype, local index, experts)``; a layer's local experts form one
    entry (the expert stack, placed at its first expert) whose ``experts`` are their local
    indices in local expert order (None for other tensors)."""
    out, stacks = [], {}
    for i, (g, p) in enumerate(local):
        stack = mapping.stack_of(g) if moe else None
        if stack is None:
            out.append([g, tuple(p.shape), str(p.dtype), i, None])
            continue
        if stack not in stacks:
            stacks[stack] = {}
            out.append([stack, tuple(p.shape), str(p.dtype), i, stacks[stack]])
        stacks[stack][mapping.expert_index(g)] = i
    for e in out:
        if e[4] is not None:
            e[4] = tuple(e[4][j] for j in sorted(e[4]))
    return [tuple(e) for e in out]


def build_plan(
    per_stage: Sequence[list], arch, *, tp_size: int, etp: int, expert_group_size: int, bucket_bytes: int
) -> List[Bucket]:
    """The bucket plan from every stage's :func:`local_entries` (``per_stage``, PP group rank
    order). ``tp_size``: the TP group's size (dense tensors' shards); ``etp`` and
    ``expert_group_size``: the expert-tensor-parallel size and the size of the ETP x EP group
    (expert stacks; 1 and 1 without experts). The same on every rank given the same input."""
    buckets: List[Bucket] = []
    seen = set()
    for stage, entries in enumerate(per_stage):
        cur: List[PlannedTensor] = []
        cur_bytes = 0
        for gname, shard_shape, dtype_s, i, experts in entries:
            if gname in seen:
                raise WeightSyncError(f"{gname} is held by two pipeline stages")
            seen.add(gname)
            if experts is not None:
                t = PlannedTensor(
                    gname,
                    stage,
                    experts[0],
                    shard_shape,
                    DTYPES[dtype_s],
                    mapping.tp_partition_dim(mapping.stack_member(gname, 0)),
                    experts=tuple(experts),
                )
                full = list(shard_shape)
                if t.tp_dim is not None:
                    full[t.tp_dim] *= etp
                if len(experts) * expert_group_size // etp != arch.num_experts:
                    raise WeightSyncError(
                        f"{gname}: {len(experts)} local experts x EP "
                        f"{expert_group_size // etp} != {arch.num_experts} experts"
                    )
                t.full_shape = (arch.num_experts, *full)
                es = elem_bytes(t.dtype)
                t.nbytes = align(numel(t.full_shape) * es)
            else:
                t = PlannedTensor(gname, stage, i, shard_shape, DTYPES[dtype_s], mapping.tp_partition_dim(gname))
                full = list(shard_shape)
                if t.tp_dim is not None:
                    full[t.tp_dim] *= tp_size
                t.full_shape = tuple(full)
                es = elem_bytes(t.dtype)
                hf = mapping.megatron_to_hf(arch, gname, torch.empty(t.full_shape, dtype=t.dtype, device="meta"))
                pos = 0
                for name, ht in hf:
                    t.hf.append((name, tuple(ht.shape), pos))
                    pos = align(pos + ht.numel() * es)
                t.nbytes = max(align(numel(t.full_shape) * es), pos)
            if cur and cur_bytes + t.nbytes > bucket_bytes:
                buckets.append(Bucket(stage, cur, cur_bytes))
                cur, cur_bytes = [], 0
            t.offset = cur_bytes
            cur.append(t)
            cur_bytes += t.nbytes
        if cur:
            buckets.append(Bucket(stage, cur, cur_bytes))
    return buckets


def plan_hf_names(plan: Sequence[Bucket], arch, naming: str = "checkpoint") -> List[str]:
    """HF names a full sync by ``plan`` delivers to an engine of ``naming``."""
    out = []
    for b in plan:
        for t in b.tensors:
            if t.is_stack:
                meta = torch.empty(t.full_shape, dtype=t.dtype, device="meta")
                out += [n for n, _ in mapping.expert_stack_to_hf(arch, t.gname, meta, naming)]
            else:
                out += [h[0] for h in t.hf]
    return out
