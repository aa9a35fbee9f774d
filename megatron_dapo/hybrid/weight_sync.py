"""Weight sync: megatron-core TP/PP shards -> full HF tensors -> rollout engine(s), in buckets.

Who feeds an engine
-------------------
``feeder_ranks`` (global ranks, default ``(0,)``) are the ranks that hold an engine handle
and call ``engine.update_weights`` / ``finish_weight_update``: for one engine, rank 0; for
several engines, the first rank of each engine's group of GPUs. Every feeder ends up with the
full HF tensors of every bucket. The other ranks only take part in collectives:

* a model-parallel replica (the TP x PP ranks of one DP rank) that contains no feeder does
  nothing at all (no collective, no memory);
* in a replica with a feeder, the ranks of the stage that owns a bucket all-gather its TP
  shards in their TP group; the PP group that contains a feeder then receives the bucket by a
  broadcast from the owning stage. Ranks that are neither feeder nor broadcast source drop
  the bucket as soon as the collective returns.

Plan
----
The first sync of a ``WeightSync`` exchanges, once, each stage's list of local parameters
(name, shard shape, dtype) over the PP group; from it every participating rank computes the
same bucket plan: the tensors of one owning stage in model order, packed into buckets of at
most ``bucket_bytes`` (a tensor larger than a bucket goes alone), with the HF names, shapes
and byte offsets of what each slot holds after conversion (computed with
``mapping.megatron_to_hf`` on meta tensors).

One bucket, step by step (owner stage, per tensor of the bucket)
-----------------------------------------------------------------
1. TP all-gather (``all_gather_into_tensor`` on raw bytes) so that the tensor's slot of
   the flat bucket buffer holds the FULL megatron tensor, i.e. ``mapping.unshard_tp`` of
   the shards: dim-0 splits and the gate/up halves of ``linear_fc1`` land there directly
   (no copy); row-parallel (dim-1) weights go through the scratch tensor and one
   concatenation; replicated tensors are copied. Dim-0 gathers are asynchronous and waited
   per bucket.
2. ``mapping.megatron_to_hf`` converts it (QKV split, gate/up split, vocab padding dropped);
   the HF tensors are written back into the tensor's own slot (most are already views of
   it: only the QKV split copies) and handed out as views of it.
3. The whole bucket buffer (HF layout) is broadcast from the owning stage over the PP group
   (only when that group holds a feeder that is not the owner).
4. Feeders call ``engine.update_weights(bucket)`` (list of ``(hf_name, view)``); after the
   last bucket, ``engine.finish_weight_update()``.

Experts (mixture of experts, docs/moe.md)
-----------------------------------------
A layer's ``linear_fc1`` of all experts is ONE slot of the plan (likewise ``linear_fc2``):
``[E, *full expert tensor]`` in global expert order (``mapping.expert_stack_name``). Each
rank of the owner stage's expert group (megatron's expert-tensor-and-model-parallel group,
ETP x EP ranks) stacks its local experts' shards and the group all-gathers them: with ETP 1
straight into the slot (EP rank order is expert order), otherwise into a scratch tensor from
which each expert's ETP shards are joined (``mapping.unshard_tp``). The engine's tensors are
views of the slot, no conversion: per expert (``checkpoint`` naming: SGLang, the HF files) or
the layer's fused ``gate_up_proj`` / ``down_proj`` (``transformers`` naming: HFEngine); each
sink says which (``BucketSink.naming``; an in-process engine by the names it expects, a
:class:`PayloadSink` by its engine kind). The EP ranks of an expert group sit in different
data-parallel replicas, so a replica without a feeder still takes part in the expert
all-gathers of a group that holds a rank of a participating replica (and in nothing else).

Extra peak memory per rank: one bucket buffer plus one temporary of the largest tensor (the
scratch of a row-parallel gather, or the q/k/v copies of the QKV split). The bucket buffer
and the scratch are allocated once per sync and reused by every bucket, so a bucket's
tensors are valid only until the next bucket is requested: an engine's ``update_weights``
must have copied (or loaded) them when it returns (HFEngine copies; SGLangEngine flattens). Buffers live on the
parameters' device: gloo on CPU, NCCL on GPU, the same code. Collectives move raw bytes
(``uint8`` views), so any parameter dtype is exact. Tied embeddings: the last stage's copy
of the output layer is skipped (the engine ties ``lm_head`` itself).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..checkpoint import mapping
from ..checkpoint.model_io import layer_offset, unwrap
from ..rollout.checksum import tensor_checksum
from ..rollout.engines import codec_for, engine_kind
from ..rollout.payload import (
    entries_in,
    is_shared_cpu_buffer,
    serialize_flat,
    shared_cpu_buffer,
    use_shared_memory_files,
)

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 512 * 1024**2
_ALIGN = 256  # byte alignment of every slot and HF tensor inside a bucket


class WeightSyncError(RuntimeError):
    """A weight sync (or its probe) failed: the engine's weights cannot be trusted."""


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


_DTYPES = {
    str(d): d
    for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int8, torch.uint8)
}


@dataclasses.dataclass
class _Tensor:
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
    hf: List[Tuple[str, Tuple[int, ...], int]] = dataclasses.field(default_factory=list)  # (name, shape, byte offset in slot)
    # an expert stack (gname = mapping.expert_stack_name): the local experts' indices among the
    # owner's local tensors, in local expert order; shard_shape is one expert's shard
    experts: Optional[Tuple[int, ...]] = None

    @property
    def is_stack(self) -> bool:
        return self.experts is not None


@dataclasses.dataclass
class _Bucket:
    stage: int
    tensors: List[_Tensor]
    nbytes: int


@dataclasses.dataclass
class SyncStats:
    bytes: int = 0  # HF bytes delivered to each engine
    buckets: int = 0
    tensors: int = 0  # HF tensors delivered
    max_bucket_bytes: int = 0
    seconds: float = 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("nan")


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class WeightSync:
    """Bucketed megatron -> HF weight sync of one model (see the module docstring).

    Every rank of the job constructs it with the same arguments and calls :meth:`sync` at
    the same point; only ``feeder_ranks`` pass engines.
    """

    def __init__(
        self,
        model,
        arch,
        *,
        feeder_ranks: Sequence[int] = (0,),
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        tp_group=None,
        pp_group=None,
        mp_group=None,
    ):
        from megatron.core import parallel_state as ps  # megatron-core: train.py imports this module, stays light

        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        self.arch = arch
        self.feeder_ranks = sorted(set(int(r) for r in feeder_ranks))
        if not self.feeder_ranks:
            raise ValueError("feeder_ranks is empty")
        self.bucket_bytes = int(bucket_bytes)
        self.tp_group = tp_group if tp_group is not None else ps.get_tensor_model_parallel_group()
        self.pp_group = pp_group if pp_group is not None else ps.get_pipeline_model_parallel_group()
        self.mp_group = mp_group if mp_group is not None else ps.get_model_parallel_group()
        self.rank = dist.get_rank()
        self.tp_size = dist.get_world_size(self.tp_group)
        self.pp_size = dist.get_world_size(self.pp_group)
        self.stage = dist.get_rank(self.pp_group)
        pp_ranks = dist.get_process_group_ranks(self.pp_group)
        mp_ranks = set(dist.get_process_group_ranks(self.mp_group))
        self.pp_ranks = pp_ranks
        self.is_feeder = self.rank in self.feeder_ranks
        # A replica without a feeder sits the sync out entirely.
        self.participates = any(r in mp_ranks for r in self.feeder_ranks)
        self.mp_ranks = mp_ranks
        # Does this rank's PP group receive buckets (it holds a feeder)?
        self.pp_feeders = [r for r in pp_ranks if r in self.feeder_ranks]
        # Experts: the group that all-gathers a stage's experts (ETP x EP ranks of the stage)
        self.moe = bool(getattr(arch, "is_moe", False))
        self.expert_group = ps.get_expert_tensor_and_model_parallel_group() if self.moe else None
        self.expert_group_size = dist.get_world_size(self.expert_group) if self.moe else 1
        self._replicas: Optional[List[frozenset]] = None  # rank -> its model-parallel replica
        self._expert_coords: Optional[list] = None  # expert group rank -> (ep rank, etp rank)
        self.device = next(iter(self._local_params()))[1].device if self._has_params() else torch.device("cpu")
        self._plan: Optional[List[_Bucket]] = None
        self._local: Optional[List[torch.Tensor]] = None
        self._scratch: Optional[torch.Tensor] = None
        self._bufs: List[torch.Tensor] = []
        # Keep the bucket buffers between syncs (saves allocating and first-touching them each
        # sync; costs their memory while training: only where memory is plentiful, e.g. CPU).
        self.keep_buffers = False
        # Checks only (benchmarks/gpu_check.py): run every collective even at TP1 / PP1, so
        # that a world of one exercises the same NCCL calls on device tensors.
        self.force_collectives = False

    # ------------------------------------------------------------------ plan ----
    def _has_params(self) -> bool:
        return any(True for _ in self._local_params())

    def _local_params(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """(global megatron name, local parameter) of this rank, model order, tied copy skipped."""
        for chunk in self.chunks:
            inner = unwrap(chunk)
            off = layer_offset(inner)
            for local, p in inner.named_parameters():
                gname = mapping.local_to_global(local, off)
                if gname == "output_layer.weight" and self.arch.tie_word_embeddings:
                    continue  # the tied copy on the last stage
                yield gname, p

    def _local_entries(self) -> list:
        """This rank's plan entries, model order: ``(gname, shard shape, dtype, local index,
        experts)``; a layer's local experts form one entry (the expert stack, placed at its
        first expert) whose ``experts`` are their local indices in local expert order (None
        for other tensors)."""
        local = list(self._local_params())
        self._local = [p for _, p in local]
        out, stacks = [], {}
        for i, (g, p) in enumerate(local):
            stack = mapping.stack_of(g) if self.moe else None
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

    def _build_plan(self) -> List[_Bucket]:
        meta = self._local_entries()
        per_stage: list = [None] * self.pp_size
        if self.pp_size > 1:
            dist.all_gather_object(per_stage, meta, group=self.pp_group)
        else:
            per_stage[0] = meta
        etp = 1
        if self.moe:
            from megatron.core import parallel_state as ps  # megatron-core: as above

            etp = ps.get_expert_tensor_parallel_world_size()
            self._expert_coords = [None] * self.expert_group_size
            dist.all_gather_object(self._expert_coords, (ps.get_expert_model_parallel_rank(),
                                                         ps.get_expert_tensor_parallel_rank()), group=self.expert_group)
        buckets: List[_Bucket] = []
        seen = set()
        for stage, entries in enumerate(per_stage):
            cur: List[_Tensor] = []
            cur_bytes = 0
            for gname, shard_shape, dtype_s, i, experts in entries:
                if gname in seen:
                    raise WeightSyncError(f"{gname} is held by two pipeline stages")
                seen.add(gname)
                if experts is not None:
                    t = _Tensor(gname, stage, experts[0], shard_shape, _DTYPES[dtype_s],
                                mapping.tp_partition_dim(mapping.stack_member(gname, 0)), experts=tuple(experts))
                    full = list(shard_shape)
                    if t.tp_dim is not None:
                        full[t.tp_dim] *= etp
                    if len(experts) * self.expert_group_size // etp != self.arch.num_experts:
                        raise WeightSyncError(f"{gname}: {len(experts)} local experts x EP "
                                              f"{self.expert_group_size // etp} != {self.arch.num_experts} experts")
                    t.full_shape = (self.arch.num_experts, *full)
                    es = _elem_bytes(t.dtype)
                    t.nbytes = _align(_numel(t.full_shape) * es)
                else:
                    t = _Tensor(gname, stage, i, shard_shape, _DTYPES[dtype_s], mapping.tp_partition_dim(gname))
                    full = list(shard_shape)
                    if t.tp_dim is not None:
                        full[t.tp_dim] *= self.tp_size
                    t.full_shape = tuple(full)
                    es = _elem_bytes(t.dtype)
                    hf = mapping.megatron_to_hf(self.arch, gname, torch.empty(t.full_shape, dtype=t.dtype, device="meta"))
                    pos = 0
                    for name, ht in hf:
                        t.hf.append((name, tuple(ht.shape), pos))
                        pos = _align(pos + ht.numel() * es)
                    t.nbytes = max(_align(_numel(t.full_shape) * es), pos)
                if cur and cur_bytes + t.nbytes > self.bucket_bytes:
                    buckets.append(_Bucket(stage, cur, cur_bytes))
                    cur, cur_bytes = [], 0
                t.offset = cur_bytes
                cur.append(t)
                cur_bytes += t.nbytes
            if cur:
                buckets.append(_Bucket(stage, cur, cur_bytes))
        return buckets

    @property
    def plan(self) -> List[_Bucket]:
        if self._plan is None:
            self._plan = self._build_plan()
        return self._plan

    def hf_names(self, naming: str = "checkpoint") -> List[str]:
        """HF names a full sync delivers to an engine of ``naming`` (collective on first use:
        builds the plan)."""
        out = []
        for b in self.plan:
            for t in b.tensors:
                if t.is_stack:
                    meta = torch.empty(t.full_shape, dtype=t.dtype, device="meta")
                    out += [n for n, _ in mapping.expert_stack_to_hf(self.arch, t.gname, meta, naming)]
                else:
                    out += [h[0] for h in t.hf]
        return out

    # ----------------------------------------------------------------- buckets ----
    def _scratch_for(self, nbytes: int) -> torch.Tensor:
        """A reusable temporary of at least ``nbytes`` (the "largest tensor" of the bound)."""
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = None
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._scratch[:nbytes]

    def _gather_bucket(self, b: _Bucket, buf: torch.Tensor, unshard: bool = True, dense: bool = True) -> None:
        """Owner stage: fill ``buf`` with the bucket's FULL megatron tensors (TP all-gather).

        The result in each slot is ``mapping.unshard_tp`` of the TP shards, produced by the
        collectives themselves where the layout allows (no copy):

        * split along dim 0: ``all_gather_into_tensor`` concatenates in rank order;
        * gated ``linear_fc1`` (each rank holds ``[gate_r; up_r]``): the gate halves and the
          up halves are all-gathered separately into the two halves of the slot;
        * split along dim 1 (row-parallel weights): gathered into the scratch tensor, then
          concatenated along dim 1 into the slot (one copy);
        * replicated: the local copy.

        * an expert stack: all-gathered over the expert group (:meth:`_gather_stack`).

        ``unshard=False`` (benchmark baseline) runs the same collectives, no copies after them.
        ``dense=False``: the expert stacks only (a rank of a replica without a feeder).
        """
        works = []
        row_parallel = []
        stacks = []
        for t in b.tensors:
            if t.is_stack:
                stacks.append(t)
                continue
            if not dense:
                continue
            p = self._local[t.local_index].detach()
            src = p.contiguous().view(-1).view(torch.uint8)
            n = src.numel()
            slot = buf[t.offset : t.offset + n * (1 if t.tp_dim is None else self.tp_size)]
            if t.tp_dim is None or (self.tp_size == 1 and not self.force_collectives):
                slot.copy_(src)
            elif t.tp_dim == 0 and mapping.is_gated_fc1(t.gname):
                half = n // 2
                for i in range(2):  # gate, then up
                    out = slot[i * half * self.tp_size : (i + 1) * half * self.tp_size]
                    works.append(dist.all_gather_into_tensor(out, src[i * half : (i + 1) * half], group=self.tp_group, async_op=True))
            elif t.tp_dim == 0:
                works.append(dist.all_gather_into_tensor(slot, src, group=self.tp_group, async_op=True))
            else:
                row_parallel.append((t, src, slot))
        for t, src, slot in row_parallel:  # one scratch at a time: synchronous
            tmp = self._scratch_for(slot.numel())
            dist.all_gather_into_tensor(tmp, src, group=self.tp_group)
            if unshard:
                shards = list(tmp.view(t.dtype).view(self.tp_size, *t.shard_shape).unbind(0))
                if t.tp_dim == 1 and len(t.shard_shape) == 2:
                    torch.cat(shards, dim=1, out=slot.view(t.dtype).view(t.full_shape))  # == unshard_tp
                else:
                    slot.view(t.dtype).view(t.full_shape).copy_(mapping.unshard_tp(t.gname, shards))
        for t in stacks:  # synchronous, one scratch at a time
            self._gather_stack(t, buf[t.offset : t.offset + t.nbytes], unshard)
        for w in works:
            w.wait()

    def _gather_stack(self, t: _Tensor, slot: torch.Tensor, unshard: bool = True) -> None:
        """One layer's experts (fc1 or fc2) -> ``[E, *full expert]`` in ``slot``: this rank's
        local experts stacked into a contiguous source, all-gathered over the expert group
        (ETP x EP); expert ``e`` is local expert ``e % (E/EP)`` of EP rank ``e // (E/EP)``,
        its ETP shards joined as a dense tensor's TP shards."""
        es = _elem_bytes(t.dtype)
        n_local = len(t.experts)
        shard_bytes = _numel(t.shard_shape) * es
        group = self.expert_group_size
        full = slot[: _numel(t.full_shape) * es]
        coords = self._expert_coords
        etp = max(c[1] for c in coords) + 1
        direct = etp == 1 and [c[0] for c in coords] == list(range(group))  # group order = expert order
        # the local stack: straight into the slot when this rank's experts sit there
        ep_rank, _ = coords[dist.get_rank(self.expert_group)]
        if direct:
            src = full[ep_rank * n_local * shard_bytes : (ep_rank + 1) * n_local * shard_bytes]
        else:
            src = self._scratch_for(n_local * shard_bytes * (group + 1))[group * n_local * shard_bytes :]
        for j, idx in enumerate(t.experts):
            src[j * shard_bytes : (j + 1) * shard_bytes].copy_(self._local[idx].detach().contiguous().view(-1).view(torch.uint8))
        if group == 1 and not self.force_collectives:
            return
        if direct:
            # in place (this rank's part of the output is the input) where NCCL allows it
            dist.all_gather_into_tensor(full, src if self.device.type == "cuda" else src.clone(), group=self.expert_group)
            return
        tmp = self._scratch_for(n_local * shard_bytes * (group + 1))[: group * n_local * shard_bytes]
        dist.all_gather_into_tensor(tmp, src, group=self.expert_group)
        if not unshard:
            return
        parts = tmp.view(t.dtype).view(group, n_local, *t.shard_shape)
        by_coord = {c: g for g, c in enumerate(coords)}
        out = full.view(t.dtype).view(t.full_shape)
        name = mapping.stack_member(t.gname, 0)
        for ep in range(group // etp):
            for j in range(n_local):
                shards = [parts[by_coord[(ep, r)], j] for r in range(etp)]
                out[ep * n_local + j].copy_(mapping.unshard_tp(name, shards))

    def _convert_bucket(self, b: _Bucket, buf: torch.Tensor) -> None:
        """In place: each slot's full megatron tensor -> its HF tensors (mapping.megatron_to_hf).
        An expert stack needs nothing: its engine tensors are views of it (:meth:`_hf_views`)."""
        for t in b.tensors:
            if t.is_stack:
                continue
            es = _elem_bytes(t.dtype)
            slot = buf[t.offset : t.offset + t.nbytes]
            full = slot[: _numel(t.full_shape) * es].view(t.dtype).view(t.full_shape)
            converted = mapping.megatron_to_hf(self.arch, t.gname, full)
            if [(n, tuple(x.shape)) for n, x in converted] != [(n, s) for n, s, _ in t.hf]:
                raise WeightSyncError(f"{t.gname}: conversion does not match the plan")
            lo, hi = slot.data_ptr(), slot.data_ptr() + t.nbytes
            moves = []
            for (name, x), (_, shape, off) in zip(converted, t.hf):
                dest = slot[off : off + x.numel() * es].view(t.dtype).view(shape)
                if x.data_ptr() == dest.data_ptr() and x.is_contiguous():
                    continue  # already in place (a view of the slot)
                if lo <= x.data_ptr() < hi:
                    x = x.clone()  # a view of this slot elsewhere: read it before any write
                moves.append((dest, x))
            for dest, x in moves:
                dest.copy_(x)
            del converted, full, moves

    def _hf_views(self, b: _Bucket, buf: torch.Tensor, naming: str = "checkpoint") -> List[Tuple[str, torch.Tensor]]:
        out = []
        for t in b.tensors:
            es = _elem_bytes(t.dtype)
            if t.is_stack:
                stacked = buf[t.offset : t.offset + _numel(t.full_shape) * es].view(t.dtype).view(t.full_shape)
                out += mapping.expert_stack_to_hf(self.arch, t.gname, stacked, naming)
                continue
            for name, shape, off in t.hf:
                start = t.offset + off
                out.append((name, buf[start : start + _numel(shape) * es].view(t.dtype).view(shape)))
        return out

    def iter_buckets(self, convert: bool = True, naming: str = "checkpoint") -> Iterator[List[Tuple[str, torch.Tensor]]]:
        """Drive the collectives of a full sync; yields each bucket (HF names of ``naming``,
        views) on feeders.

        Collective: every rank must exhaust the iterator (ranks with no part return at once).
        ``convert=False`` runs the same collectives without conversion (a benchmark
        baseline); the yielded tensors are then meaningless. One buffer: a bucket's views are
        valid until the next bucket is asked for.
        """
        try:
            for _, b, buf in self._buckets(convert, 1, []):
                yield self._hf_views(b, buf, naming)
        finally:
            self._free_buffers()

    def _ensure_replicas(self) -> None:
        """Once, collectively over the world: every rank's model-parallel replica (to know
        which expert groups hold a rank of a replica that takes part in a sync)."""
        if self._replicas is not None or not self.moe or self.expert_group_size == 1:
            return
        reps: list = [None] * dist.get_world_size()
        dist.all_gather_object(reps, sorted(self.mp_ranks))
        self._replicas = [frozenset(r) for r in reps]

    def _experts_only(self, active: Optional[Sequence[int]]) -> bool:
        """This rank's replica has no active feeder, yet its expert group holds a rank of a
        replica that has one: it takes part in the expert all-gathers only."""
        if self._replicas is None:
            return False
        active = set(self.feeder_ranks if active is None else (int(r) for r in active))
        if any(r in self.mp_ranks for r in active):
            return False
        return any(self._replicas[r] & active for r in dist.get_process_group_ranks(self.expert_group))

    def _buckets(self, convert: bool, num_buffers: int, sinks: Sequence["BucketSink"], shared: bool = False,
                 participates: Optional[bool] = None, active_feeders: Optional[Sequence[int]] = None):
        """Yields (index, bucket, flat buffer) per bucket on feeders; bucket i is written into
        buffer ``i % num_buffers`` after every sink said the bucket that held it before is free."""
        self._ensure_replicas()
        participates = self.participates if participates is None else participates
        experts_only = not participates and self._experts_only(active_feeders)
        if not (participates or experts_only):
            return
        plan = self.plan
        if experts_only:
            todo = [(b, True, False) for b in plan if b.stage == self.stage and any(t.is_stack for t in b.tensors)]
        else:
            todo = [(b, *self._role(b)) for b in plan]
            todo = [x for x in todo if x[1] or x[2]]
        if not todo:
            return
        # Bucket buffers and one scratch tensor, reused for every bucket of this sync; the
        # caller frees the buffers (_free_buffers) once the receivers are done with them.
        size = max(b.nbytes for b, _, _ in todo)
        bufs = self._buffers(size, num_buffers, shared)
        try:
            for i, (b, owner, need_bcast) in enumerate(todo):
                if i >= num_buffers:
                    for s in sinks:
                        s.wait_free(i - num_buffers)
                buf = bufs[i % num_buffers][: b.nbytes]
                if owner:
                    self._gather_bucket(b, buf, unshard=convert, dense=not experts_only)
                    if convert and (self.is_feeder or need_bcast):
                        self._convert_bucket(b, buf)
                if need_bcast:
                    dist.broadcast(buf, src=self.pp_ranks[b.stage], group=self.pp_group)
                if self.is_feeder:
                    yield i, b, buf
                del buf
        finally:
            del bufs
            self._scratch = None

    def _free_buffers(self) -> None:
        if not self.keep_buffers:
            self._bufs = []

    def _buffers(self, size: int, n: int, shared: bool) -> List[torch.Tensor]:
        have = [t for t in self._bufs if t.numel() >= size]
        cpu_shared = shared and self.device.type == "cpu"
        if len(have) < n or (cpu_shared and not all(is_shared_cpu_buffer(t) for t in have)):
            self._bufs = []  # free the old ones before allocating
            have = []
            for _ in range(n):
                if cpu_shared:  # a named /dev/shm file the engine process maps (rollout/payload.py)
                    t = shared_cpu_buffer(_align(size))
                else:
                    t = torch.empty(_align(size), dtype=torch.uint8, device=self.device)
                have.append(t)
            self._bufs = have
        return have[:n]

    def _role(self, b: _Bucket) -> Tuple[bool, bool]:
        """(this rank's stage owns the bucket, this rank's PP group broadcasts it)."""
        owner = b.stage == self.stage
        # Broadcast when this PP group holds a feeder other than the owner stage's rank.
        src = self.pp_ranks[b.stage]
        if self.force_collectives:
            return owner, bool(self.pp_feeders)
        return owner, self.pp_size > 1 and any(r != src for r in self.pp_feeders)

    def sync(self, engines=None, *, active_feeders: Optional[Sequence[int]] = None) -> SyncStats:
        """One full weight sync. ``engines`` (feeder ranks only, None elsewhere): an engine, a
        :class:`BucketSink`, or a list of them. An engine (``update_weights`` /
        ``finish_weight_update``, e.g. an in-process ``RolloutEngine``) gets the bucket's views
        and must have copied them when it returns; a sink gets handles to this rank's buffer
        and may acknowledge later (double buffering). Returns the stats (bytes delivered per
        engine on feeders). ``active_feeders`` (the same on every rank): the feeder ranks whose
        engines are synced this time; a model-parallel replica without one sits this sync out
        (e.g. re-syncing one restarted engine). Default: every feeder rank."""
        participates = self.participates if active_feeders is None else any(
            int(r) in self.mp_ranks for r in active_feeders)
        if engines is None:
            engines = []
        elif not isinstance(engines, (list, tuple)):
            engines = [engines]
        if engines and not self.is_feeder:
            raise WeightSyncError(
                f"rank {self.rank} got an engine but is not a feeder rank ({self.feeder_ranks})"
            )
        if self.is_feeder and not engines:
            raise WeightSyncError(f"rank {self.rank} is a feeder rank but was given no engine")
        sinks = [e if isinstance(e, BucketSink) else DirectSink(e) for e in engines]
        # buffers: the receiver's lag + the one being written, + 1 to overlap with the receiver
        num_buffers = max([s.lag + 1 + int(s.asynchronous) for s in sinks] or [1])
        shared = any(s.shared_memory for s in sinks)
        stats = SyncStats()
        t0 = time.perf_counter()
        # An engine error on a feeder must not leave the other ranks blocked in the next
        # bucket's collectives: the feeder keeps driving them (sinks record errors and keep
        # their own collectives going), and one flag all-reduced over the replica at the end
        # makes every rank raise together.
        error: Optional[BaseException] = None
        try:
            tap = CHECKSUM_TAP.start(self.is_feeder)
            namings = [s.naming or "checkpoint" for s in sinks]
            for i, b, flat in self._buckets(True, num_buffers, sinks, shared, participates, active_feeders):
                views = {n: self._hf_views(b, flat, n) for n in dict.fromkeys(namings)}
                for s, naming in zip(sinks, namings):
                    try:
                        s.submit(i, views[naming], flat)
                    except Exception as exc:  # noqa: BLE001 - re-raised below, on every rank
                        error = error or exc
                bucket = views[namings[0]] if namings else self._hf_views(b, flat)
                if tap is not None:  # a probe sync: checksums of what the sinks were handed
                    tap.observe(bucket)
                nbytes = sum(x.numel() * x.element_size() for _, x in bucket)
                stats.bytes += nbytes
                stats.buckets += 1
                stats.tensors += len(bucket)
                stats.max_bucket_bytes = max(stats.max_bucket_bytes, nbytes)
                del bucket, views, flat
            # The buffers stay allocated until every receiver has finished (a receiver with
            # lag may read the last buckets until its update session ends).
            for s in sinks:
                try:
                    s.finish()
                except Exception as exc:  # noqa: BLE001
                    error = error or exc
        finally:
            self._free_buffers()
        if participates and dist.get_world_size(self.mp_group) > 1:
            flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.mp_group)
            failed_elsewhere = bool(flag.item()) and error is None
        else:
            failed_elsewhere = False
        if error is not None:
            if isinstance(error, WeightSyncError):
                raise error
            raise WeightSyncError(f"weight sync failed on rank {self.rank}: {type(error).__name__}: {error}") from error
        if failed_elsewhere:
            raise WeightSyncError(f"weight sync failed on another rank of rank {self.rank}'s model-parallel group")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        stats.seconds = time.perf_counter() - t0
        if self.is_feeder:
            log.info(
                "weight sync: %d tensors, %d buckets, %.1f MiB in %.3f s (%.2f GB/s)",
                stats.tensors, stats.buckets, stats.bytes / 2**20, stats.seconds, stats.bytes_per_s / 1e9,
            )
        return stats


class ChecksumTap:
    """Per-HF-tensor checksums (``rollout.checksum``) of what this process's feeders hand to
    their sinks, recorded during ONE sync after :meth:`arm` (the weight-sync check's probe
    syncs; ``hybrid.probe``), read back with :meth:`take`. One per process
    (:data:`CHECKSUM_TAP`): a trainer rank runs one :class:`WeightSync` at a time."""

    def __init__(self):
        self.armed = False
        self.sums: Optional[dict] = None  # HF name -> checksum of the last armed sync

    def arm(self) -> None:
        self.armed, self.sums = True, None

    def start(self, is_feeder: bool) -> Optional["ChecksumTap"]:
        """Called by every sync: the tap if it records this one (it disarms itself)."""
        if not self.armed:
            return None
        self.armed, self.sums = False, {}
        return self if is_feeder else None

    def observe(self, views) -> None:
        for name, t in views:
            self.sums[name] = tensor_checksum(t)

    def take(self) -> Optional[dict]:
        out, self.sums = self.sums, None
        return out


CHECKSUM_TAP = ChecksumTap()


# ------------------------------------------------------------------- who feeds whom ----
def engine_feeders(world_size: int, gpus_per_engine: int) -> List[List[int]]:
    """Global ranks feeding each engine: engine ``e`` sits on the GPUs of ranks
    ``e*K .. e*K+K-1`` (K = ``gpus_per_engine``) and is fed by exactly those ranks, rank
    ``e*K + j`` handing over the payload of the engine's TP rank ``j``. Ranks of one node are
    consecutive (launch/placement.py), so with K dividing the GPUs per node an engine's
    feeders share its node."""
    if gpus_per_engine < 1 or world_size % gpus_per_engine:
        raise ValueError(
            f"--rollout-num-gpus-per-engine {gpus_per_engine} must divide the world size {world_size}"
        )
    k = gpus_per_engine
    return [list(range(e * k, (e + 1) * k)) for e in range(world_size // k)]


class EngineFeeding:
    """This rank's place in :func:`engine_feeders` and the gloo groups of the feeders.

    Collective: every rank of the job constructs it (one ``new_group`` per engine of more than
    one GPU, all ranks, same order). :meth:`sink` gives this rank's :class:`PayloadSink`.
    """

    def __init__(self, gpus_per_engine: int):
        world = dist.get_world_size()
        self.rank = dist.get_rank()
        self.layout = engine_feeders(world, gpus_per_engine)
        groups = [dist.new_group(r, backend="gloo") if len(r) > 1 else None for r in self.layout]
        self.engine = self.rank // gpus_per_engine
        self.group = groups[self.engine]
        self.leader = self.layout[self.engine][0]
        self.engine_tp_rank = self.rank - self.leader
        self.feeder_ranks = list(range(world))  # every rank feeds its own engine

    def sink(self, calls: Optional["EngineCalls"], protocol: "EngineProtocol") -> "PayloadSink":
        """This rank's sink. ``calls``: the engine's calls, used on the leader only; ``protocol``:
        the engine's :class:`EngineProtocol`, the same on EVERY feeder of the engine."""
        return PayloadSink(calls if self.rank == self.leader else None, self.group, self.leader,
                           protocol=protocol, engine_index=self.engine)


class BucketSink:
    """Where a feeding rank hands its buckets (see :meth:`WeightSync.sync`).

    ``submit(i, views, flat)`` hands over bucket ``i`` (``views``: HF names and tensors inside
    ``flat``, this rank's bucket buffer); ``wait_free(j)`` returns once the receiver no longer
    reads bucket ``j``'s memory (the buffer is about to be overwritten); ``finish()`` ends the
    update. ``lag``: buckets the receiver may still read after acknowledging one (0: it copied
    before acknowledging). ``asynchronous``: ``submit`` returns before the acknowledgement (a
    second buffer then overlaps the next bucket's collectives with the receiver's copy).
    ``shared_memory``: CPU buffers must be in shared memory (another process maps them).
    A sink must not raise from ``submit``/``wait_free`` in a way that skips collectives of its
    own; it may raise from ``finish``.
    """

    lag = 0
    asynchronous = False
    shared_memory = False
    #: the engine's weight naming (``mapping.NAMINGS``; None: ``checkpoint``): how a layer's
    #: experts are handed over (per expert, or transformers' fused tensors)
    naming: Optional[str] = None

    def submit(self, index: int, views, flat: torch.Tensor) -> None:
        raise NotImplementedError

    def wait_free(self, index: int) -> None:
        pass

    def finish(self) -> None:
        pass


class DirectSink(BucketSink):
    """An engine in this process: ``update_weights(views)`` copies before it returns."""

    def __init__(self, engine):
        self.engine = engine
        self.error: Optional[BaseException] = None
        self.naming = engine_naming(engine)

    def submit(self, index, views, flat):
        if self.error is None:
            try:
                self.engine.update_weights(views)
            except Exception as exc:  # noqa: BLE001 - reported by finish
                self.error = exc

    def finish(self):
        if self.error is not None:
            raise self.error
        self.engine.finish_weight_update()


def engine_naming(engine) -> str:
    """The weight naming of an in-process engine (``mapping.NAMINGS``): its own
    ``weight_naming`` when it says, else by the names it expects: a transformers model's fused
    experts (``mlp.experts.gate_up_proj``, HFEngine) or the checkpoint's (SGLang)."""
    naming = getattr(engine, "weight_naming", None)
    if naming:
        return naming
    try:
        names = engine.expected_weight_names()
    except Exception:  # noqa: BLE001 - an engine that cannot say takes the checkpoint's names
        return "checkpoint"
    return "transformers" if any(n.endswith(".mlp.experts.gate_up_proj") for n in names) else "checkpoint"


def naming_for_kind(kind: str) -> str:
    """The weight naming of an engine kind (``--rollout-engine``): HFEngine loads a
    transformers model (fused experts), SGLang the checkpoint's names."""
    return engine_kind(kind).weight_naming


class DiscardSink(BucketSink):
    """A feeder whose engine is not synced this time (e.g. another engine was restarted): it
    takes part in the collectives and hands nothing over."""

    def submit(self, index, views, flat):
        pass


class EngineCalls:
    """How the leader of an engine's feeders reaches the engine (the driver builds it, e.g.
    over Ray): ``send(payloads) -> future`` (one payload per engine TP rank, in TP order),
    ``resolve(future)`` (waits; raises the engine's error), ``finish()`` (ends the engine's
    weight update: ``finish_weight_update``). Only the leader holds one; what every feeder
    must know about the engine is its :class:`EngineProtocol`."""

    def __init__(self, send, resolve, finish):
        self.send, self.resolve, self.finish = send, resolve, finish


@dataclasses.dataclass(frozen=True)
class EngineProtocol:
    """What EVERY feeder of one engine must agree on, leader or not.

    ``kind``: the engine kind (``hf``, ``sglang``). ``lag``: buckets the engine may still read
    after acknowledging one (1 for SGLang, whose call returns once its copy is enqueued; 0
    for HFEngine, which copies before it returns); it sizes the feeder's buffer ring
    (``lag + 2``) and so the order of the group's collectives. ``codec``: (serializer,
    metadata class) of the payloads: each engine TP rank unpickles its own feeder's payload
    (SGLang: its ``SafeUnpickler``, which admits only its own ``FlattenedTensorMetadata``; on
    a GPU the feeder must also have SGLang's patched CUDA reductions, which name the device by
    UUID). A feeder that disagreed would hang the group's collectives or make the engine's TP
    rank refuse its payload, so :class:`PayloadSink` checks the agreement once per sync."""

    kind: str = "hf"
    lag: int = 0
    codec: Optional[tuple] = None

    @classmethod
    def for_engine(cls, kind: str) -> "EngineProtocol":
        """The protocol of an engine of ``kind``; for SGLang this imports SGLang and patches
        this process's tensor reductions (``rollout.payload.sglang_codec``): call it in every
        feeder process."""
        return cls(kind=kind, lag=engine_kind(kind).lag, codec=codec_for(kind))

    def describe(self) -> tuple:
        """What the feeders compare: kind, lag and the codec's qualified names."""
        names = tuple(f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__name__)}"
                      for x in (self.codec or ()))
        return (self.kind, self.lag, names)


class PayloadSink(BucketSink):
    """Feed one engine from the ranks of its group (:func:`engine_feeders`), by memory handles.

    Every feeder serializes a payload of its OWN bucket buffer (``rollout/payload.py``: CUDA
    IPC handles on GPU, shared-memory handles on CPU; no tensor bytes), the payloads are
    gathered on the group's first rank (``group``: a gloo group of the feeders, in engine TP
    order; None for a group of one), which sends them to the engine in one small message and
    keeps the future. ``wait_free(j)``: the leader waits for the acknowledgement of bucket
    ``j + lag`` and broadcasts it to the group (``lag`` 1 for SGLang, whose call returns after
    enqueueing its copy: a bucket is free once the NEXT call has returned; 0 for HFEngine,
    which copies before it returns). ``protocol`` (:class:`EngineProtocol`: lag and codec) is
    the same on every rank of the group, checked when the sink is made; ``calls`` only on the
    leader. Engine errors are recorded, the collectives continue, and ``finish`` raises on
    every rank of the group.
    """

    asynchronous = True
    shared_memory = True

    def __init__(self, calls: Optional[EngineCalls], group, leader: int, *, protocol: EngineProtocol,
                 engine_index: int = 0):
        self.group = group
        self.leader = int(leader)
        self.rank = dist.get_rank()
        self.is_leader = self.rank == self.leader
        self.size = dist.get_world_size(group) if group is not None else 1
        if self.is_leader and calls is None:
            raise ValueError("the leader of an engine's feeders needs its EngineCalls")
        if not isinstance(protocol, EngineProtocol):
            raise TypeError(f"PayloadSink needs the engine's EngineProtocol on every feeder, got {protocol!r}")
        self.calls = calls
        self.protocol = protocol
        self.lag = protocol.lag
        self.naming = naming_for_kind(protocol.kind)
        self.engine_index = engine_index
        self.serializer, self.metadata_cls = protocol.codec or codec_for(protocol.kind)
        use_shared_memory_files()
        self._check_agreement()
        self.futures: dict = {}
        self.acked = -1  # highest bucket index acknowledged (known to the whole group)
        self.submitted = -1
        self.error: Optional[BaseException] = None
        self.failed = False  # the group knows the engine failed

    def _check_agreement(self) -> None:
        """Every feeder of the engine holds the same protocol (one small all-gather over the
        group per sync): a feeder with another lag would wait in another collective from the
        ring's first reuse on (a hang), one with another codec would send a payload the
        engine's TP rank refuses."""
        if self.size == 1:
            return
        mine = self.protocol.describe()
        seen = [None] * self.size
        dist.all_gather_object(seen, mine, group=self.group)
        if any(x != seen[0] for x in seen):
            ranks = dist.get_process_group_ranks(self.group)
            detail = "; ".join(f"rank {r}: kind {k}, lag {lag}, codec {', '.join(c) or 'default'}"
                               for r, (k, lag, c) in zip(ranks, seen))
            raise WeightSyncError(f"the feeders of engine {self.engine_index} disagree on its protocol ({detail})")

    def submit(self, index, views, flat):
        payload = serialize_flat(flat, entries_in(flat, views), 1, metadata_cls=self.metadata_cls,
                                 serializer=self.serializer)[0]
        if self.size > 1:
            gathered = [None] * self.size if self.is_leader else None
            dist.gather_object(payload, gathered, dst=self.leader, group=self.group)
        else:
            gathered = [payload]
        if self.is_leader and self.error is None:
            try:
                self.futures[index] = self.calls.send(gathered)
            except Exception as exc:  # noqa: BLE001 - reported by finish, on every rank
                self.error = exc
        self.submitted = index

    def _resolve_through(self, index: int) -> None:
        """Leader: wait for every sent bucket up to ``index``; then tell the group."""
        if self.is_leader:
            for j in sorted(k for k in self.futures if k <= index):
                fut = self.futures.pop(j)
                if self.error is None:
                    try:
                        self.calls.resolve(fut)
                    except Exception as exc:  # noqa: BLE001
                        self.error = exc
        state = torch.tensor([index, 0 if self.error is None else 1], dtype=torch.int64)
        if self.size > 1:
            dist.broadcast(state, src=self.leader, group=self.group)
        self.acked = max(self.acked, int(state[0]))
        self.failed = self.failed or bool(state[1])

    def wait_free(self, index):
        need = min(index + self.lag, self.submitted)
        if need > self.acked:
            self._resolve_through(need)

    def finish(self):
        self._resolve_through(self.submitted)
        if self.is_leader and self.error is None and not self.failed:
            try:
                self.calls.finish()
            except Exception as exc:  # noqa: BLE001
                self.error = exc
        state = torch.tensor([0 if self.error is None else 1], dtype=torch.int64)
        if self.size > 1:
            dist.broadcast(state, src=self.leader, group=self.group)
        why = f"{type(self.error).__name__}: {self.error}" if self.error is not None else None
        if (state.item() or self.failed) and self.size > 1:
            # every feeder names the engine's own error (a launcher may stop the leader before it prints)
            box = [why]
            dist.broadcast_object_list(box, src=self.leader, group=self.group)
            why = why or box[0]
        if self.error is not None:
            raise WeightSyncError(f"engine {self.engine_index} failed to load the weights: {why}") from self.error
        if state.item() or self.failed:
            raise WeightSyncError(
                f"engine {self.engine_index} failed to load the weights (feeder rank {self.leader} reports: {why})"
            )


def sync_weights(
    model,
    arch,
    engines=None,
    *,
    feeder_ranks: Sequence[int] = (0,),
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    tp_group=None,
    pp_group=None,
    mp_group=None,
) -> SyncStats:
    """One-shot :class:`WeightSync` (builds the plan each call; keep a WeightSync to reuse it)."""
    ws = WeightSync(
        model, arch, feeder_ranks=feeder_ranks, bucket_bytes=bucket_bytes,
        tp_group=tp_group, pp_group=pp_group, mp_group=mp_group,
    )
    return ws.sync(engines)
