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
Once per ``WeightSync`` (its first sync) the stages' parameter lists are exchanged and every
participating rank computes the same bucket plan: see ``bucket_plan.py`` (the resharding
planner, no collectives), which this module only feeds and follows.

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

Modules
-------
* ``bucket_plan.py``: the resharding planner (which tensors in which bucket, HF names, sizes,
  offsets), pure computation;
* ``bucket_gather.py``: the execution of one bucket on the owner stage (TP / expert
  all-gathers into the bucket buffer, HF conversion in place, views), buffers and scratch;
* ``bucket_sinks.py``: who feeds which engine and how a bucket is handed over (sinks, payloads,
  the engine protocol);
* this module: :class:`WeightSync` (the plan's exchange, the order of the buckets, the PP
  broadcast, the sinks, one error for the whole replica), :class:`ChecksumTap` and
  :func:`sync_weights`; it re-exports the public names of the others.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..rollout.checksum import tensor_checksum
from .bucket_gather import BucketGather
from .bucket_plan import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    MergedLocal,
    build_plan,
    local_entries,
    local_params,
    lora_owners,
    plan_hf_names,
)
from .bucket_sinks import (
    BucketSink,
    DirectSink,
    DiscardSink,
    EngineCalls,
    EngineFeeding,
    EngineProtocol,
    PayloadSink,
    engine_feeders,
    engine_naming,
    naming_for_kind,
)
from .sync_errors import WeightSyncError

__all__ = [
    "CHECKSUM_TAP",
    "DEFAULT_BUCKET_BYTES",
    "BucketSink",
    "ChecksumTap",
    "DirectSink",
    "DiscardSink",
    "EngineCalls",
    "EngineFeeding",
    "EngineProtocol",
    "PayloadSink",
    "SyncStats",
    "WeightSync",
    "WeightSyncError",
    "engine_feeders",
    "engine_naming",
    "naming_for_kind",
    "sync_weights",
]

log = logging.getLogger(__name__)


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


class WeightSync(BucketGather):
    """Bucketed megatron -> HF weight sync of one model (see the module docstring); the
    gather, conversion and buffers of a bucket are :class:`~.bucket_gather.BucketGather`'s.

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
        merge_lora: bool = True,
    ):
        from megatron.core import parallel_state as ps  # megatron-core: train.py imports this module, stays light

        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.chunks = list(model) if isinstance(model, (list, tuple)) else [model]
        self.arch = arch
        # LoRA: the adapted weights sent merged (W + (alpha/r) B A; --lora-sync merged), or the frozen
        # base as it is (the adapters go separately: --lora-sync adapter)
        self.merge_lora = merge_lora
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
        self._plan: Optional[List[Bucket]] = None
        self._local: Optional[Sequence[torch.Tensor]] = None
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
        return local_params(self.chunks, self.arch)

    def _local_entries(self) -> list:
        """This rank's plan entries (``bucket_plan.local_entries``); keeps its local parameters
        (``_local``, indexed by the entries)."""
        local = list(self._local_params())
        owners = lora_owners(self.chunks, local) if self.merge_lora else {}  # LoRA: adapted weights merged
        self._local = MergedLocal([p for _, p in local], owners) if owners else [p for _, p in local]
        return local_entries(local, self.moe)

    def _build_plan(self) -> List[Bucket]:
        """Collective (PP group; with experts also the expert group): exchange the stages'
        entries and the expert coordinates, then plan (``bucket_plan.build_plan``)."""
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
            dist.all_gather_object(
                self._expert_coords,
                (ps.get_expert_model_parallel_rank(), ps.get_expert_tensor_parallel_rank()),
                group=self.expert_group,
            )
        return build_plan(
            per_stage,
            self.arch,
            tp_size=self.tp_size,
            etp=etp,
            expert_group_size=self.expert_group_size,
            bucket_bytes=self.bucket_bytes,
        )

    @property
    def plan(self) -> List[Bucket]:
        if self._plan is None:
            self._plan = self._build_plan()
        return self._plan

    def hf_names(self, naming: str = "checkpoint") -> List[str]:
        """HF names a full sync delivers to an engine of ``naming`` (collective on first use:
        builds the plan)."""
        return plan_hf_names(self.plan, self.arch, naming)

    # ----------------------------------------------------------------- buckets ----

    def iter_buckets(
        self, convert: bool = True, naming: str = "checkpoint"
    ) -> Iterator[List[Tuple[str, torch.Tensor]]]:
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

    def _buckets(
        self,
        convert: bool,
        num_buffers: int,
        sinks: Sequence["BucketSink"],
        shared: bool = False,
        participates: Optional[bool] = None,
        active_feeders: Optional[Sequence[int]] = None,
    ):
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

    def _role(self, b: Bucket) -> Tuple[bool, bool]:
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
        participates = (
            self.participates if active_feeders is None else any(int(r) in self.mp_ranks for r in active_feeders)
        )
        if engines is None:
            engines = []
        elif not isinstance(engines, (list, tuple)):
            engines = [engines]
        if engines and not self.is_feeder:
            raise WeightSyncError(f"rank {self.rank} got an engine but is not a feeder rank ({self.feeder_ranks})")
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
                stats.tensors,
                stats.buckets,
                stats.bytes / 2**20,
                stats.seconds,
                stats.bytes_per_s / 1e9,
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
        model,
        arch,
        feeder_ranks=feeder_ranks,
        bucket_bytes=bucket_bytes,
        tp_group=tp_group,
        pp_group=pp_group,
        mp_group=mp_group,
    )
    return ws.sync(engines)
