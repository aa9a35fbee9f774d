"""Gloo bodies: a TP-2 SGLang engine fed by two trainer ranks, decoded by the pinned wheel's code.

Every feeder of the engine runs the product's own path: ``EngineProtocol.for_engine("sglang")``
(which imports SGLang's serializer, metadata class and reduction patch: here the wheel's
``MultiprocessingSerializer`` and ``FlattenedTensorMetadata``, and a recording stand-in for
``monkey_patch_torch_reductions``, whose real body needs CUDA), ``EngineFeeding.sink`` and
``WeightSync.sync``. The leader's ``EngineCalls`` reach :class:`WheelTP2Engine`, which does what
SGLang 0.5.23 does with a ``flattened_bucket`` update: the Engine/TokenizerManager's payload
normalisation, then per TP rank the wheel's ``tp_worker.deserialize_own_rank`` (its
``SafeUnpickler``) and ``FlattenedTensorBucket.reconstruct_tensors``. Like SGLang it
acknowledges a bucket once its copy is enqueued (lag 1): the copy runs at the engine's next
call, reading the feeder's buffer then, and a buffer rewritten too early is detected.
"""

from __future__ import annotations

import sys
import types

import torch

from tests.hybrid.bodies import build_trained_policy, reference_hf_weights

_MODULES = (
    "sglang",
    "sglang.srt",
    "sglang.srt.utils",
    "sglang.srt.utils.common",
    "sglang.srt.utils.patch_torch",
    "sglang.srt.weight_sync",
    "sglang.srt.weight_sync.tensor_bucket",
)


class WheelModules:
    """The wheel's pieces importable under SGLang's module names in this process (a pool
    process is reused by other tests: :meth:`remove` puts sys.modules back)."""

    def __init__(self):
        from tests.rollout import sglang_wheel as sw

        src = sw.wheel()
        self.saved = {n: sys.modules.get(n) for n in _MODULES}
        self.patched = []  # monkey_patch_torch_reductions calls in this process
        for n in _MODULES:
            sys.modules[n] = types.ModuleType(n)
        tb = sys.modules["sglang.srt.weight_sync.tensor_bucket"]
        tb.__dict__.update(vars(sw.exec_module(src, "sglang.srt.weight_sync.tensor_bucket")))
        for cls in (tb.FlattenedTensorMetadata, tb.FlattenedTensorBucket):
            cls.__module__ = tb.__name__
        self.tensor_bucket = tb
        self.ser = sw.serializer_namespace(src)
        sys.modules["sglang.srt.utils.common"].MultiprocessingSerializer = self.ser["MultiprocessingSerializer"]
        sys.modules["sglang.srt.utils.patch_torch"].monkey_patch_torch_reductions = lambda: self.patched.append(1)
        self.own_rank = [sw.deserialize_own_rank_function(src, self.ser, r, 2) for r in range(2)]

    def remove(self):
        for n, m in self.saved.items():
            if m is None:
                sys.modules.pop(n, None)
            else:
                sys.modules[n] = m


class WheelTP2Engine:
    """The engine side of a TP-2 SGLang engine, built from the wheel's code (see module doc)."""

    def __init__(self, wheel: WheelModules):
        from megatron_dapo.hybrid.weight_sync import EngineCalls

        self.w = wheel
        self.weights = [{}, {}]  # per TP rank: HF name -> full tensor (SGLang shards it itself)
        self.pending = []  # copies enqueued, not yet run: (tp rank, name, view of the feeder's buffer, snapshot)
        self.sent = 0
        self.metadata_types = set()
        self.torn = []  # tensors whose source changed between the call and the copy
        self.finished = False
        self.calls = EngineCalls(self.send, self.resolve, self.finish)

    def _run_pending(self):
        for r, name, view, snap in self.pending:
            if not torch.equal(view, snap):
                self.torn.append(name)
            self.weights[r][name] = view.clone()
        self.pending = []

    def send(self, payloads):
        self._run_pending()  # SGLang runs the previous bucket's copies before this call returns
        assert len(payloads) == 2, f"a TP-2 engine takes 2 payloads, got {len(payloads)}"
        raw = self.w.ser["normalize_serialized_named_tensor_payloads"](list(payloads))
        for r in range(2):
            own = self.w.own_rank[r](None, raw)  # the wheel's SafeUnpickler: refuses any foreign class
            self.metadata_types.update(type(m).__name__ for m in own["metadata"])
            bucket = self.w.tensor_bucket.FlattenedTensorBucket(
                flattened_tensor=own["flattened_tensor"], metadata=own["metadata"]
            )
            for name, t in bucket.reconstruct_tensors():
                self.pending.append((r, name, t, t.clone()))
        self.sent += 1
        return self.sent - 1

    def resolve(self, token):
        return token

    def finish(self):
        self._run_pending()
        self.finished = True


def sglang_tp2_feed(hf_cfg: dict, tp: int, bucket_bytes: int, syncs: int = 2):
    """World 2: ranks 0 and 1 feed one TP-2 SGLang engine (engine TP rank j <- trainer rank j)."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import EngineFeeding, EngineProtocol, WeightSync

    wheel = WheelModules()
    try:
        policy = build_trained_policy(hf_cfg, tp, 1)
        feeding = EngineFeeding(2)
        rank = dist.get_rank()
        engine = WheelTP2Engine(wheel) if rank == feeding.leader else None
        ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=bucket_bytes)
        protocols, stats = [], []
        for _ in range(syncs):
            protocol = EngineProtocol.for_engine("sglang")  # what PolicyActor.sync_to gives every rank
            protocols.append(protocol.describe())
            st = ws.sync(feeding.sink(engine.calls if engine else None, protocol))
            stats.append({"buckets": st.buckets, "bytes": st.bytes})
        out = {
            "rank": rank,
            "protocols": protocols,
            "stats": stats,
            "patched": len(wheel.patched),
            "ref": reference_hf_weights(policy),
        }
        if engine is not None:
            out.update(
                weights=engine.weights,
                sent=engine.sent,
                torn=engine.torn,
                finished=engine.finished,
                metadata_types=sorted(engine.metadata_types),
            )
        return out
    finally:
        wheel.remove()


def disagreeing_feeders(hf_cfg: dict, bucket_bytes: int):
    """Rank 0 feeds with SGLang's lag, rank 1 with HFEngine's (the old non-leader default):
    the sink refuses before any bucket instead of hanging at the ring's first reuse."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import EngineFeeding, EngineProtocol, WeightSync, WeightSyncError

    policy = build_trained_policy(hf_cfg, 1, 1)
    feeding = EngineFeeding(2)
    rank = dist.get_rank()
    rec = None
    if rank == feeding.leader:
        from tests.hybrid.feed_bodies import RecordingCalls

        rec = RecordingCalls(1)
    ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=bucket_bytes)
    try:
        ws.sync(feeding.sink(rec.calls if rec else None, EngineProtocol(lag=1 if rank == 0 else 0)))
        return None
    except WeightSyncError as e:
        return str(e)
