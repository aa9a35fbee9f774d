"""Ray actors: trainer ranks and rollout engines, colocated on the same placement-group bundles.

``PolicyActor`` hosts one :class:`~megatron_dapo.training.worker.PolicyWorker` (one trainer
rank). ``EngineActor`` hosts one rollout engine (HFEngine on CPU, SGLangEngine on GPU) in its
own process, so that an engine that dies or hangs can be killed and restarted without
touching the trainer. Weight sync: the ranks on an engine's GPUs feed it; each hands over a
payload referring to its own bucket buffer (``rollout/payload.py``: CUDA IPC or shared-memory
handles, no tensor bytes); the group's first rank sends the engine's payloads in one small
Ray call (:func:`engine_calls`) and waits for the acknowledgement before the buffer is reused
(docs/hybrid.md).
"""

from __future__ import annotations

import os
from typing import Optional

import ray
import torch

from ..hybrid.weight_sync import EngineCalls, EngineProtocol
from ..known_warnings import quiet_known_warnings
from ..rollout.engines import engine_kind


def _threads(n: Optional[int]):
    if n:
        torch.set_num_threads(max(1, int(n)))


@ray.remote
class PolicyActor:
    def __init__(self, rank, world_size, master_addr, master_port, cfg, hf_config_path, num_threads=None):
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads or 1))
        quiet_known_warnings()
        _threads(num_threads)
        from ..training.worker import PolicyWorker  # megatron-core: only inside the trainer's actor process

        self.w = PolicyWorker(rank, world_size, master_addr, master_port, cfg, hf_config_path)

    # one typed method per PolicyWorker call the driver makes (driver/trainer_group.py)
    def info(self) -> dict:
        return self.w.info()

    def load_initial_weights(self) -> str:
        return self.w.load_initial_weights()

    def build_reference(self) -> str:
        return self.w.build_reference()

    def save(self, directory: str, metadata: dict) -> None:
        self.w.save(directory, metadata)

    def load(self, directory: str) -> None:
        self.w.load(directory)

    def export_hf(self, directory: str) -> list:
        return self.w.export_hf(directory)

    def export_peft(self, directory: str) -> list:
        return self.w.export_peft(directory)

    def adapter_payload(self):
        return self.w.adapter_payload()

    def full_weights(self) -> dict:
        return self.w.full_weights()

    def rng_state(self) -> dict:
        return self.w.rng_state()

    def set_rng_state(self, state: dict) -> None:
        self.w.set_rng_state(state)

    def derive_rng_state(self, step: int) -> int:
        return self.w.derive_rng_state(step)

    def compute_logprobs(self, items: list):
        return self.w.compute_logprobs(items)

    def compute_ref_logprobs(self, items: list):
        return self.w.compute_ref_logprobs(items)

    def train(self, shards: list, inject_nan: bool = False) -> list:
        return self.w.train(shards, inject_nan=inject_nan)

    def onload(self) -> int:
        return self.w.onload()

    def offload(self) -> int:
        return self.w.offload()

    def probe_logprobs(self, sequences: list):
        return self.w.probe_logprobs(sequences)

    def sync_to(self, engine_handles, engine_kind: str = "hf", bucket_bytes=None):
        """Weight sync into the engine actors. ``engine_handles[e]``: engine ``e``'s handle, or
        None when engine ``e`` is not synced this time. This rank feeds engine
        ``rank // --rollout-num-gpus-per-engine`` (:func:`feeder_args`)."""
        args = feeder_args(self.w.rank, self.w.cfg.rollout.num_gpus_per_engine, engine_handles, engine_kind)
        return self.w.sync_weights(bucket_bytes=bucket_bytes, feed_engines=True, **args)

    def broadcast_to(
        self,
        engine_handles,
        engine_kind: str,
        address: str,
        port: int,
        world: int,
        group_name: str,
        version: Optional[int] = None,
        backend: str = "gloo",
    ):
        """Weight sync into engines on GPUs of their own (--rollout-placement disaggregated): every
        rank takes part in the bucket collectives; rank 0 opens its member of the weight-update
        group the engines are joining (``address:port``, ``world`` members, the engines' TP ranks
        after it) and broadcasts each bucket to all of them (``hybrid.weight_broadcast.BroadcastSink``);
        ``version``: the policy version the engines then hold (set as their update ends);
        ``backend``: the group's, as the cluster chose it for the engines too ("nccl" on GPUs)."""
        from ..hybrid.bucket_sinks import naming_for_kind
        from ..hybrid.weight_broadcast import BroadcastSink, open_weight_update_group

        if self.w.rank != 0:
            return self.w.sync_weights(engine=None)
        group = open_weight_update_group(address, port, world, group_name, backend)
        handles = list(engine_handles)
        sink = BroadcastSink(
            group,
            receive=lambda entries: [h.update_weights_from_distributed.remote(entries, group_name) for h in handles],
            resolve=ray.get,
            finish=lambda: ray.get([h.finish_weight_update.remote(version) for h in handles]),
            naming=naming_for_kind(engine_kind),
        )
        try:
            return self.w.sync_weights(engine=sink)
        finally:
            torch.distributed.destroy_process_group(group)

    def placement(self) -> dict:
        """Where this rank runs: Ray node id and the GPU ids Ray gave it (physical on its node)."""
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "gpu_ids": [int(g) for g in ray.get_gpu_ids()]}

    def pid(self):
        return os.getpid()

    def weight_checksums(self, arm: bool):
        """The weight-sync check (hybrid/probe.py): ``arm`` makes this rank's next sync record
        per-tensor checksums of what it hands over; otherwise returns that record (or None)."""
        # imported at call time: Ray ships this class by value, and a module-level name would be
        # a pickled copy of the tap, not the one this process's weight sync records into
        from ..hybrid.weight_sync import CHECKSUM_TAP

        return CHECKSUM_TAP.arm() if arm else CHECKSUM_TAP.take()


def feeder_args(rank: int, gpus_per_engine: int, engine_handles, engine_kind: str, make_calls=None) -> dict:
    """``PolicyWorker.sync_weights`` arguments of trainer ``rank`` for one sync of the engines
    ``engine_handles`` (index = engine; None: not synced this time).

    EVERY rank of an engine's group gets the engine's ``EngineProtocol`` (lag, codec: the same
    buffer ring and SGLang's serializer and CUDA reductions in every feeder process); only the
    group's first rank gets the calls into the engine (``make_calls(handle, kind)``, default
    :func:`engine_calls`)."""
    k = int(gpus_per_engine)
    handle = engine_handles[rank // k]
    make_calls = make_calls or engine_calls
    active = [r for e, h in enumerate(engine_handles) if h is not None for r in range(e * k, (e + 1) * k)]
    return {
        "engine_calls": make_calls(handle, engine_kind) if handle is not None and rank % k == 0 else None,
        "engine_protocol": EngineProtocol.for_engine(engine_kind) if handle is not None else None,
        "skip_engine": handle is None,
        "active_feeders": active,
    }


def engine_calls(handle, engine_kind: str):
    """The feeding side's calls into one EngineActor (``hybrid.weight_sync.EngineCalls``), for
    the first feeder of the engine.

    Only small control messages go through Ray: the payloads (a few KB of handles and names)
    are inlined in the call, the tensors stay in the feeders' memory. When a bucket may be
    reused is the engine's ``EngineProtocol`` (every feeder has it: :func:`feeder_args`)."""
    return EngineCalls(
        send=lambda payloads: handle.update_weights_from_payloads.remote(payloads),
        resolve=ray.get,
        finish=lambda: ray.get(handle.finish_weight_update.remote()),
    )


@ray.remote(concurrency_groups={"control": 2, "weights": 1})
class EngineActor:
    """One rollout engine in its own process; threaded so ``abort`` can interrupt ``generate``."""

    def __init__(self, kind: str, model_dir: str, tokenizer_dir: Optional[str] = None, num_threads=None, **kwargs):
        os.environ.setdefault("OMP_NUM_THREADS", str(num_threads or 1))
        quiet_known_warnings()
        _threads(num_threads)
        # the kind's own constructor (rollout/engines.py ENGINE_KINDS); it imports the engine
        self.engine, self.tokenizer = engine_kind(kind).build(model_dir, tokenizer_dir, **kwargs)

    def pid(self):
        return os.getpid()

    def innermost_pid(self):
        """(pid, what) of the process that ``--debug-kill-engine-step`` kills: the engine's
        scheduler where the engine runs one (SGLang: a child process named
        ``sglang::scheduler``; killed, it takes this actor down with it), else this actor."""
        import psutil  # a declared dependency (megatron's checkpoint writer needs it)

        for child in psutil.Process().children(recursive=True):
            try:
                if "scheduler" in " ".join(child.cmdline()) or "scheduler" in child.name():
                    return child.pid, f"its scheduler process ({child.name()})"
            except psutil.Error:
                continue
        return os.getpid(), "its actor process"

    def generate(self, prompts, params):
        return self.engine.generate(prompts, params)

    def score(self, sequences, prompt_lens):
        return self.engine.score(sequences, prompt_lens)

    # streaming generation (the rollout manager, driver/engine_pool.py)
    def submit(self, requests):
        self.engine.submit(requests)

    def poll(self, timeout_s):
        return self.engine.poll(timeout_s)

    def abort_requests(self, rids=None):
        return self.engine.abort_requests(rids)

    def update_weights_from_payloads(self, payloads):
        """One bucket: one serialized payload per engine TP rank (rollout/payload.py)."""
        load = getattr(self.engine, "update_weights_from_payloads", None)
        if load is None:
            raise TypeError(f"{type(self.engine).__name__} cannot load serialized weight payloads")
        load(payloads)

    def finish_weight_update(self, version: Optional[int] = None):
        """End the update; with ``version``, the weights now loaded are that policy version (set
        in the same call: no decode step runs between the two, so every token's stamp is true)."""
        self.engine.finish_weight_update()
        if version is not None:
            self.engine.set_weight_version(version)

    # LoRA adapters (--lora-sync adapter): SGLang's calls, PEFT's names and config
    def load_lora_adapter_from_tensors(self, lora_name: str, tensors: dict, config_dict: dict) -> None:
        load = getattr(self.engine, "load_lora_adapter_from_tensors", None)
        if load is None:
            raise TypeError(f"{type(self.engine).__name__} cannot load LoRA adapters (--lora-sync adapter)")
        load(lora_name, tensors, config_dict)

    def unload_lora_adapter(self, lora_name: str) -> None:
        self.engine.unload_lora_adapter(lora_name)

    # weights broadcast over a collective group (--rollout-placement disaggregated): the engine's
    # calls. In a thread group of their own: they may run while the engine generates (poll), and
    # an engine that cannot take them then (HFEngine holds them aside) loads them at
    # finish_weight_update, which runs between two polls.
    @ray.method(concurrency_group="weights")
    def init_weights_update_group(self, address, port, rank_offset, world_size, group_name, backend):
        self.engine.init_weights_update_group(address, port, rank_offset, world_size, group_name, backend)

    @ray.method(concurrency_group="weights")
    def update_weights_from_distributed(self, entries, group_name):
        self.engine.update_weights_from_distributed(entries, group_name)

    @ray.method(concurrency_group="weights")
    def destroy_weights_update_group(self, group_name):
        self.engine.destroy_weights_update_group(group_name)

    def release_memory(self, tags=None):
        """The tags whose release was a no-op (``RolloutEngine.release_memory``)."""
        return self.engine.release_memory(tags) if tags else self.engine.release_memory()

    def resume_memory(self, tags=None):
        return self.engine.resume_memory(tags) if tags else self.engine.resume_memory()

    @ray.method(concurrency_group="control")
    def abort(self):
        self.engine.abort()

    @ray.method(concurrency_group="control")
    def health(self):
        return self.engine.health()

    def shutdown(self):
        self.engine.shutdown()

    def set_weight_version(self, version: int) -> None:
        """``RolloutEngine.set_weight_version``: the weights now loaded are policy ``version``."""
        self.engine.set_weight_version(version)

    def arm_weight_checksums(self):
        """``RolloutEngine.arm_weight_checksums``: the next sync is a probe sync."""
        self.engine.arm_weight_checksums()

    def weight_checksums(self, dtypes=None):
        """HF name -> checksum of the engine's tensors (``RolloutEngine.weight_checksums``), or
        None for an engine that cannot report them (the weight-sync check skips it)."""
        try:
            return self.engine.weight_checksums(dtypes)
        except NotImplementedError:
            return None

    def check_weights(self, action: str):
        """``RolloutEngine.check_weights`` (--check-weight-sync-init, hybrid/phases.py)."""
        return self.engine.check_weights(action)
