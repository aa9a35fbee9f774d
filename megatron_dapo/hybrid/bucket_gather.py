"""Executing the weight sync's plan on the trainer ranks: one bucket's buffer, step by step.

The owner stage's ranks fill a bucket's flat buffer by the plan (``bucket_plan.py``):

1. TP all-gather (``all_gather_into_tensor`` on raw bytes) so that each tensor's slot holds
   the FULL megatron tensor (``mapping.unshard_tp`` of the shards); a layer's experts are
   all-gathered over the stage's expert group (ETP x EP) into their stack's slot;
2. ``mapping.megatron_to_hf`` converts each slot in place (QKV split, gate/up split, vocab
   padding dropped), and the HF tensors are handed out as views of the buffer.

The bucket buffers (a ring, in shared memory where a sink needs it) and the one scratch
tensor (the "largest tensor" of the memory bound) are allocated here too. The PP broadcast,
the order of the buckets and the hand-over to the engines are :class:`~.weight_sync.WeightSync`'s
(see ``weight_sync.py``'s docstring for the whole sequence and the memory bound).

:class:`BucketGather` is a mixin of :class:`~.weight_sync.WeightSync`: its methods read the
sync's attributes ``arch``, ``device``, ``tp_group``, ``tp_size``, ``expert_group``,
``expert_group_size``, ``force_collectives``, ``keep_buffers``, the local parameters
``_local`` and expert coordinates ``_expert_coords`` (set when the plan is built), and keep
the scratch tensor (``_scratch``) and the bucket buffers (``_bufs``) there.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.distributed as dist

from ..checkpoint import mapping
from ..rollout.payload import is_shared_cpu_buffer, shared_cpu_buffer
from .bucket_plan import Bucket, PlannedTensor, align, elem_bytes, numel
from .sync_errors import WeightSyncError


class BucketGather:
    """The gather, conversion and buffers of one bucket (mixin of ``WeightSync``; see the module
    docstring for the attributes it reads)."""

    def _scratch_for(self, nbytes: int) -> torch.Tensor:
        """A reusable temporary of at least ``nbytes`` (the "largest tensor" of the bound)."""
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = None
            self._scratch = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._scratch[:nbytes]

    def _gather_bucket(self, b: Bucket, buf: torch.Tensor, unshard: bool = True, dense: bool = True) -> None:
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
                    works.append(
                        dist.all_gather_into_tensor(
                            out, src[i * half : (i + 1) * half], group=self.tp_group, async_op=True
                        )
                    )
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

    def _gather_stack(self, t: PlannedTensor, slot: torch.Tensor, unshard: bool = True) -> None:
        """One layer's experts (fc1 or fc2) -> ``[E, *full expert]`` in ``slot``: this rank's
        local experts stacked into a contiguous source, all-gathered over the expert group
        (ETP x EP); expert ``e`` is local expert ``e % (E/EP)`` of EP rank ``e // (E/EP)``,
        its ETP shards joined as a dense tensor's TP shards."""
        es = elem_bytes(t.dtype)
        n_local = len(t.experts)
        shard_bytes = numel(t.shard_shape) * es
        group = self.expert_group_size
        full = slot[: numel(t.full_shape) * es]
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
            src[j * shard_bytes : (j + 1) * shard_bytes].copy_(
                self._local[idx].detach().contiguous().view(-1).view(torch.uint8)
            )
        if group == 1 and not self.force_collectives:
            return
        if direct:
            # in place (this rank's part of the output is the input) where NCCL allows it
            dist.all_gather_into_tensor(
                full, src if self.device.type == "cuda" else src.clone(), group=self.expert_group
            )
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

    def _convert_bucket(self, b: Bucket, buf: torch.Tensor) -> None:
        """In place: each slot's full megatron tensor -> its HF tensors (mapping.megatron_to_hf).
        An expert stack needs nothing: its engine tensors are views of it (:meth:`_hf_views`)."""
        for t in b.tensors:
            if t.is_stack:
                continue
            es = elem_bytes(t.dtype)
            slot = buf[t.offset : t.offset + t.nbytes]
            full = slot[: numel(t.full_shape) * es].view(t.dtype).view(t.full_shape)
            converted = mapping.megatron_to_hf(self.arch, t.gname, full)
            if [(n, tuple(x.shape)) for n, x in converted] != [(n, s) for n, s, _ in t.hf]:
                raise WeightSyncError(f"{t.gname}: conversion does not match the plan")
            lo, hi = slot.data_ptr(), slot.data_ptr() + t.nbytes
            moves = []
            for (_name, x), (_, shape, off) in zip(converted, t.hf):
                dest = slot[off : off + x.numel() * es].view(t.dtype).view(shape)
                if x.data_ptr() == dest.data_ptr() and x.is_contiguous():
                    continue  # already in place (a view of the slot)
                if lo <= x.data_ptr() < hi:
                    x = x.clone()  # a view of this slot elsewhere: read it before any write
                moves.append((dest, x))
            for dest, x in moves:
                dest.copy_(x)
            del converted, full, moves

    def _hf_views(self, b: Bucket, buf: torch.Tensor, naming: str = "checkpoint") -> List[Tuple[str, torch.Tensor]]:
        out = []
        for t in b.tensors:
            es = elem_bytes(t.dtype)
            if t.is_stack:
                stacked = buf[t.offset : t.offset + numel(t.full_shape) * es].view(t.dtype).view(t.full_shape)
                out += mapping.expert_stack_to_hf(self.arch, t.gname, stacked, naming)
                continue
            for name, shape, off in t.hf:
                start = t.offset + off
                out.append((name, buf[start : start + numel(shape) * es].view(t.dtype).view(shape)))
        return out

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
                    t = shared_cpu_buffer(align(size))
                else:
                    t = torch.empty(align(size), dtype=torch.uint8, device=self.device)
                have.append(t)
            self._bufs = have
        return have[:n]
