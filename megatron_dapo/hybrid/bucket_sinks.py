"""Handing the weight sync's buckets to the rollout engines: who feeds which engine, and how.

* who feeds whom: :func:`engine_feeders` (engine ``e`` is fed by the ranks of its own GPUs)
  and :class:`EngineFeeding` (this rank's place in that layout, the gloo groups of the feeders);
* how a feeder hands a bucket over, :class:`BucketSink` and its kinds: :class:`DirectSink`
  (an engine in this process, views of the buffer), :class:`DiscardSink` (take part in the
  collectives only), :class:`PayloadSink` (memory handles gathered on the engine's first
  feeder and sent to the engine in one call, with a ring of buffers acknowledged by the
  engine: docs/hybrid.md "When a buffer may be reused");
* what the feeders of one engine must agree on (:class:`EngineProtocol`: kind, lag, codec)
  and how the first of them reaches the engine (:class:`EngineCalls`); the weight naming of an
  engine (:func:`engine_naming`, :func:`naming_for_kind`).

The sync that drives the sinks is :class:`~.weight_sync.WeightSync` (``weight_sync.py``
re-exports every name of this module).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch
import torch.distributed as dist

from ..rollout.engines import codec_for, engine_kind
from ..rollout.payload import entries_in, serialize_flat, use_shared_memory_files
from .sync_errors import WeightSyncError


# ------------------------------------------------------------------- who feeds whom ----
def engine_feeders(world_size: int, gpus_per_engine: int) -> List[List[int]]:
    """Global ranks feeding each engine: engine ``e`` sits on the GPUs of ranks
    ``e*K .. e*K+K-1`` (K = ``gpus_per_engine``) and is fed by exactly those ranks, rank
    ``e*K + j`` handing over the payload of the engine's TP rank ``j``. Ranks of one node are
    consecutive (launch/placement.py), so with K dividing the GPUs per node an engine's
    feeders share its node."""
    if gpus_per_engine < 1 or world_size % gpus_per_engine:
        raise ValueError(f"--rollout-num-gpus-per-engine {gpus_per_engine} must divide the world size {world_size}")
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
        return PayloadSink(
            calls if self.rank == self.leader else None,
            self.group,
            self.leader,
            protocol=protocol,
            engine_index=self.engine,
        )


# ------------------------------------------------------------------------- sinks ----
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
        names = tuple(
            f"{getattr(x, '__module__', '?')}.{getattr(x, '__qualname__', type(x).__name__)}"
            for x in (self.codec or ())
        )
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

    def __init__(
        self, calls: Optional[EngineCalls], group, leader: int, *, protocol: EngineProtocol, engine_index: int = 0
    ):
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
            detail = "; ".join(
                f"rank {r}: kind {k}, lag {lag}, codec {', '.join(c) or 'default'}"
                for r, (k, lag, c) in zip(ranks, seen)
            )
            raise WeightSyncError(f"the feeders of engine {self.engine_index} disagree on its protocol ({detail})")

    def submit(self, index, views, flat):
        payload = serialize_flat(
            flat, entries_in(flat, views), 1, metadata_cls=self.metadata_cls, serializer=self.serializer
        )[0]
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
