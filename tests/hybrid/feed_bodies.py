"""Gloo bodies of the per-engine feeding tests (module-level so they pickle; see test_transport.py)."""

from __future__ import annotations

import torch

from tests.hybrid.bodies import build_trained_policy, reference_hf_weights


def feed_engines(hf_cfg: dict, tp: int, pp: int, gpus_per_engine: int, bucket_sizes, threshold: float):
    """Every rank feeds the engine of its group (an HFEngine in its own OS process) by memory
    handles; after each sync the probe runs on every engine. Returns per rank: the stats, the
    probe, what crossed into the engine process, the engine's weights (leaders) and the
    independent reference weights."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import EngineFeeding, EngineProtocol, WeightSync
    from tests.hybrid.engine_proc import EngineProcess
    from tests.hybrid.probe_helpers import check_weight_sync, default_probe_tokens

    policy = build_trained_policy(hf_cfg, tp, pp)
    feeding = EngineFeeding(gpus_per_engine)
    rank = dist.get_rank()
    proc = EngineProcess(hf_cfg) if rank == feeding.leader else None
    probe = default_probe_tokens(policy.arch.vocab_size, length=16, batch=2)
    res = {
        "rank": rank,
        "engine": feeding.engine,
        "leader": feeding.leader,
        "ref": reference_hf_weights(policy),
        "syncs": [],
    }
    try:
        for bs in bucket_sizes:
            ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=bs)
            before = proc.bytes_sent if proc else 0
            st = ws.sync(feeding.sink(proc.calls() if proc else None, EngineProtocol.for_engine("hf")))
            diff = check_weight_sync(policy.model, policy.arch, proc, probe, threshold)
            res["syncs"].append(
                {
                    "bucket_bytes": bs,
                    "buckets": st.buckets,
                    "bytes": st.bytes,
                    "diff": diff,
                    "crossed": (proc.bytes_sent - before) if proc else None,
                }
            )
        res["weights"] = proc.weights() if proc else None
    finally:
        if proc is not None:
            proc.close()
    return res


class RecordingCalls:
    """EngineCalls of a fake engine in this process that maps each payload (no copy) and checks,
    at every call, that no bucket whose memory it may still read has been overwritten: bucket
    ``j`` must stay intact until the acknowledgement of bucket ``j + lag`` has been awaited."""

    def __init__(self, lag: int):
        from megatron_dapo.hybrid.weight_sync import EngineCalls, EngineProtocol

        self.lag = lag
        self.live = {}  # bucket -> (mapped views, snapshot)
        self.resolved = -1
        self.sent = 0
        self.violations = []
        self.max_in_flight = 0
        self.finished = False
        self.calls = EngineCalls(self.send, self.resolve, self.finish)
        self.protocol = EngineProtocol(lag=lag)

    def _check(self, when: str):
        for j, (views, snap) in self.live.items():
            if j + self.lag > self.resolved and not all(torch.equal(v, s) for v, s in zip(views, snap)):
                self.violations.append((when, j))

    def send(self, payloads):
        from megatron_dapo.rollout.payload import load_payload, reconstruct_bucket

        self._check(f"send {self.sent}")
        # buckets still unacknowledged when this one was written: the feeder overlapped them
        self.max_in_flight = max(self.max_in_flight, self.sent - 1 - self.resolved)
        flat, meta = load_payload(payloads[0])
        views = [t for _, t in reconstruct_bucket(flat, meta)]
        self.live[self.sent] = (views, [v.clone() for v in views])
        self.sent += 1
        return self.sent - 1

    def resolve(self, token):
        self._check(f"resolve {token}")
        self.resolved = token

    def finish(self):
        self._check("finish")
        self.finished = True


def buffer_lifetime(hf_cfg: dict, lag: int, bucket_bytes: int):
    """One rank, many buckets: the feeder's buffer ring honours the receiver's lag."""
    from megatron_dapo.hybrid.weight_sync import EngineFeeding, WeightSync

    policy = build_trained_policy(hf_cfg, 1, 1)
    feeding = EngineFeeding(1)
    rec = RecordingCalls(lag)
    ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=bucket_bytes)
    st = ws.sync(feeding.sink(rec.calls, rec.protocol))
    return {
        "violations": rec.violations,
        "max_in_flight": rec.max_in_flight,
        "sent": rec.sent,
        "buckets": st.buckets,
        "finished": rec.finished,
        "resolved": rec.resolved,
    }


class FailingCalls(RecordingCalls):
    def __init__(self, fail_at: int):
        super().__init__(0)
        self.fail_at = fail_at

    def resolve(self, token):
        if token == self.fail_at:
            raise RuntimeError(f"engine refused bucket {token}")
        super().resolve(token)


def failing_engine(hf_cfg: dict, tp: int, pp: int):
    """Engine 0 (fed by ranks 0, 1) fails on bucket 1: every rank raises, none hangs."""
    import torch.distributed as dist

    from megatron_dapo.hybrid.weight_sync import EngineFeeding, EngineProtocol, WeightSync, WeightSyncError

    policy = build_trained_policy(hf_cfg, tp, pp)
    feeding = EngineFeeding(2)
    rank = dist.get_rank()
    rec = (FailingCalls(1) if feeding.engine == 0 else RecordingCalls(0)) if rank == feeding.leader else None
    ws = WeightSync(policy.model, policy.arch, feeder_ranks=feeding.feeder_ranks, bucket_bytes=1024)
    try:
        ws.sync(feeding.sink(rec.calls if rec else None, EngineProtocol()))
        return None
    except WeightSyncError as e:
        return str(e)
