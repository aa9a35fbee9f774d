"""The Ray side of a run: trainer actors and engine actors on one placement group.

``Cluster`` places one ``PolicyActor`` per trainer rank and creates ``EngineActor``s on the
same (colocated) bundles; the ranks are reached through ``trainers`` (a ``TrainerGroup``,
driver/trainer_group.py) and the weight sync (``sync``). Nothing here knows the DAPO loop.

Ray is imported inside the methods: ``import megatron_dapo.train`` (which imports this module)
imports no Ray (tests/foundation/test_import_graph.py).
"""

from __future__ import annotations

import os
import time
from typing import Optional

import torch

from ..config import ConfigError, world_size
from ..launch.placement import (
    PlacementError,
    alive_nodes,
    bundle_placements,
    create_placement_group,
    default_cpus_per_bundle,
    engine_gpu_plan,
    on_bundle,
    ranks_to_bundles,
    start_ray,
)
from ..rollout.engines import engine_kind, resolve_engine_kind
from ..rollout.payload import remove_shared_memory_files, remove_stale_shared_memory_files
from .trainer_group import TrainerGroup


def actor_threads(total_cpus: float, world: int, omp: Optional[str] = None) -> int:
    """CPU threads of each trainer and engine actor: the cores Ray counts shared among the
    ranks (``total_cpus // world``, at least 1), and no more than ``OMP_NUM_THREADS`` where that
    is set (``omp``; the shell's usual cap: a job that shares its cores, as the test suite does
    with two workers, sets it to 1, since threads beyond a core only wait for each other)."""
    n = max(1, int(total_cpus // max(world, 1)))
    if omp is None or omp.strip() == "":
        return n
    try:
        cap = int(omp)
        if cap < 1:
            raise ValueError
    except ValueError:
        raise ConfigError(
            f"OMP_NUM_THREADS={omp!r} is not a positive whole number: unset it, "
            "or set the threads each trainer and engine actor may use (e.g. 1)"
        ) from None
    return min(n, cap)


def engine_options(cfg, kind: str, index: int, base_gpu_id: int, tokenizer_dir: str):
    """(engine constructor kwargs, Ray actor options) of engine ``index``: the kind's own
    ``options`` (rollout/engines.py ``ENGINE_KINDS``)."""
    return engine_kind(kind).options(cfg, index, base_gpu_id, tokenizer_dir)


class Cluster:
    """Trainer actors and engine actors on one Ray placement group (colocated bundles).

    Start-up: the placement group, where each bundle landed (node address, GPU ids) and the
    rank order that follows from it (``launch.placement.ranks_to_bundles``: sorted by node
    address and GPU id), the engine plan; then, with ``build_trainers`` (default), the trainer
    actors. The driver (``megatron_dapo.train``) passes ``build_trainers=False``: it launches
    the engines first (``make_engine``), lets them release their memory and only then calls
    :meth:`build_trainers` (``hybrid.phases.HybridStep.launch``), so that SGLang sizes its KV
    cache on a GPU that no trainer occupies yet.
    """

    def __init__(self, cfg, hf_dir: str, tokenizer_dir: str, build_trainers: bool = True):
        import ray  # lazy: see the module docstring

        self.cfg = cfg
        self.hf_dir, self.tokenizer_dir = hf_dir, tokenizer_dir
        self.world = world_size(cfg)
        remove_stale_shared_memory_files()  # buffers of killed runs on this node
        start_ray()
        on_gpu = torch.cuda.is_available()
        self.gpus = 1 if on_gpu else 0
        total_cpus = float(ray.cluster_resources().get("CPU", 1))
        r = cfg.rollout
        self.disaggregated = r.placement == "disaggregated"
        engine_gpus = r.num_gpus if self.disaggregated else 0
        # CPU bundles share the CPUs among all bundles of the run (the engines' own ones too)
        cpus = None if on_gpu else default_cpus_per_bundle(self.world + engine_gpus, 0, alive_nodes())
        self.pg = create_placement_group(self.world, gpus_per_bundle=self.gpus, cpus_per_bundle=cpus, timeout_s=120)
        self.bundle_cpus = self._bundle_cpus()
        self.threads = actor_threads(total_cpus, self.world + engine_gpus, os.environ.get("OMP_NUM_THREADS"))
        by_bundle = bundle_placements(self.pg, self.gpus)
        self.bundle_of = ranks_to_bundles(by_bundle)  # rank -> bundle: by (node address, GPU id)
        self.placements = [by_bundle[b] for b in self.bundle_of]  # rank -> {node_id, node_ip, gpu_ids}
        self.engine_kind = resolve_engine_kind(r.engine, on_gpu)
        if self.disaggregated:
            # the engines' own GPUs: a placement group of their own, engine e on bundles e*K .. e*K+K-1
            self.engine_pg = create_placement_group(
                engine_gpus, gpus_per_bundle=self.gpus, cpus_per_bundle=cpus, timeout_s=120, name="rollout-engines"
            )
            by_engine_bundle = bundle_placements(self.engine_pg, self.gpus)
            self.engine_bundle_of = ranks_to_bundles(by_engine_bundle)
            self.engine_placements = [by_engine_bundle[b] for b in self.engine_bundle_of]
            self.num_engines = engine_gpus // r.num_gpus_per_engine
        else:
            self.engine_pg, self.engine_placements = self.pg, self.placements
            self.engine_bundle_of = self.bundle_of
            self.num_engines = self.world // r.num_gpus_per_engine
        # Engine e sits on consecutive GPUs of one node: those of the ranks that feed it (colocated)
        # or of its own bundles (disaggregated)
        self.engine_plan = engine_gpu_plan(self.engine_placements, r.num_gpus_per_engine)
        self._syncs = 0  # weight-update groups opened (disaggregated: one per sync)
        # the policy version the next sync gives the engines (the driver sets it; disaggregated
        # engines take it as their update ends, so a generating engine's stamps switch with its weights)
        self.weight_version: Optional[int] = None
        self.actors: list = []
        self.infos: list = []
        self.trainers: Optional[TrainerGroup] = None  # once build_trainers ran
        self.master_addr = self.master_port = None
        self._engine_ids: dict = {}
        self.adapter_version = 0  # --lora-sync adapter: the adapters sent so far (their names' counter)
        self.adapter_of: dict = {}  # engine actor id -> the adapter it serves
        if build_trainers:
            self.build_trainers()

    def _strategy(self, rank: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # lazy: Ray

        return PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=self.bundle_of[rank])

    def rendezvous(self):
        """(MASTER_ADDR, MASTER_PORT) of the trainers' process group: chosen ON rank 0's node (a
        tiny task on its bundle), where rank 0's TCPStore listens; 127.0.0.1 when every rank
        is on one node. The driver may sit on any node (or a node without ranks)."""
        where = on_bundle(self.pg, self.bundle_of[0], gpus=0.01 if self.gpus else 0)
        one_node = len({p["node_id"] for p in self.placements}) == 1
        return ("127.0.0.1" if one_node else where["node_ip"]), where["port"]

    def build_trainers(self, timeout_s=None) -> None:
        """One PolicyActor per rank (model, optimizer, process groups); waits until all are up
        (``timeout_s``: at most that long, else ``ray.exceptions.GetTimeoutError``)."""
        import ray  # lazy: Ray

        from .actors import PolicyActor  # imports Ray at its top

        cfg, gpus = self.cfg, self.gpus
        self.master_addr, self.master_port = self.rendezvous()
        self.actors = [
            PolicyActor.options(  # type: ignore[attr-defined]  # a @ray.remote class
                scheduling_strategy=self._strategy(r), num_cpus=self.bundle_cpus / 2, num_gpus=gpus * 0.5 if gpus else 0
            ).remote(r, self.world, self.master_addr, self.master_port, cfg, self.hf_dir, self.threads)
            for r in range(self.world)
        ]
        self.infos = ray.get([a.info.remote() for a in self.actors], timeout=timeout_s)
        seen = ray.get([a.placement.remote() for a in self.actors], timeout=timeout_s)
        for rank, (got, want) in enumerate(zip(seen, self.placements)):
            if got["node_id"] != want["node_id"] or sorted(got["gpu_ids"]) != sorted(want["gpu_ids"]):
                raise PlacementError(f"trainer rank {rank} runs on {got}, its bundle was probed at {want}")
        self.trainers = TrainerGroup(self.actors, self.infos)

    def make_engine(self, i: int):
        """Launch engine ``i`` (an EngineActor on the bundles of its feeding ranks); a restarted
        engine ``i`` replaces the old one in :meth:`sync`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # lazy: Ray

        from .actors import EngineActor  # imports Ray at its top

        r, gpus = self.cfg.rollout, self.gpus
        kw, opts = engine_options(self.cfg, self.engine_kind, i, self.engine_plan[i]["base_gpu_id"], self.tokenizer_dir)
        share = 1.0 if self.disaggregated else 0.5  # a bundle of its own, or half of a trainer rank's
        handle = EngineActor.options(  # type: ignore[attr-defined]  # a @ray.remote class
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.engine_pg, placement_group_bundle_index=self.engine_bundle_of[i * r.num_gpus_per_engine]
            ),
            num_cpus=self.bundle_cpus * share,
            num_gpus=gpus * share if gpus else 0,
            **opts,
        ).remote(self.engine_kind, self.hf_dir, self.tokenizer_dir, self.threads, **kw)
        self._engine_ids[handle._actor_id] = i
        return handle

    def _bundle_cpus(self) -> float:
        spec = self.pg.bundle_specs[0]
        return float(spec.get("CPU", 1))

    def sync(self, engine_handles, full: bool = True) -> dict:
        """The weight sync into ``engine_handles``. ``--lora-sync adapter``: ``full`` sends the frozen
        base (the first sync, a restarted engine), then every sync sends the adapters alone
        (:meth:`_sync_adapters`); otherwise ``full`` is ignored (every sync is full)."""
        import ray  # lazy: Ray

        handles = list(getattr(engine_handles, "members", engine_handles))  # RemoteEngines or handles
        if self.disaggregated:
            return self._broadcast(handles)
        adapters = self.cfg.model.lora_rank > 0 and self.cfg.model.lora_sync == "adapter"
        if adapters and not full:
            return self._sync_adapters(handles, {"bytes": 0, "buckets": 0, "seconds": 0.0, "engines": len(handles)})
        # Every rank feeds the engine on its own GPUs (docs/hybrid.md, "who feeds whom"); the
        # ranks of an engine not being synced (a restarted engine is synced alone) only take
        # part in the collectives.
        by_index = [None] * self.num_engines
        for h in handles:
            i = self._engine_ids.get(h._actor_id)
            if i is None:
                raise ValueError("Cluster.sync: an engine handle that this cluster's make_engine did not create")
            by_index[i] = h
        outs = ray.get([a.sync_to.remote(by_index, self.engine_kind) for a in self.actors])
        fed = [o for r, o in enumerate(outs) if by_index[r // self.cfg.rollout.num_gpus_per_engine] is not None]
        stats = {
            "bytes": fed[0]["bytes"] if fed else 0,
            "buckets": max(o["buckets"] for o in outs),
            "seconds": max(o["seconds"] for o in outs),
            "engines": len(handles),
        }
        return self._sync_adapters(handles, stats) if adapters else stats

    def _sync_adapters(self, handles, stats: dict) -> dict:
        """--lora-sync adapter: the trainer's adapters, gathered whole in PEFT's names (a collective
        of every rank; rank 0 returns them), loaded into each engine under a new name (SGLang's
        ``load_lora_adapter_from_tensors``), then the engine's previous adapter unloaded."""
        import ray  # lazy: Ray

        t0 = time.perf_counter()
        tensors, config = ray.get([a.adapter_payload.remote() for a in self.actors])[0]
        self.adapter_version += 1
        name = f"policy-{self.adapter_version}"
        ray.get([h.load_lora_adapter_from_tensors.remote(name, tensors, config) for h in handles])
        previous = [(h, self.adapter_of.get(h._actor_id)) for h in handles]
        ray.get([h.unload_lora_adapter.remote(old) for h, old in previous if old])
        for h in handles:
            self.adapter_of[h._actor_id] = name
        sent = sum(t.numel() * t.element_size() for t in tensors.values())
        return {
            **stats,
            "bytes": stats["bytes"] + sent,
            "adapter_bytes": sent,
            "seconds": stats["seconds"] + time.perf_counter() - t0,
        }

    def _broadcast(self, handles) -> dict:
        """The sync into engines on GPUs of their own: a weight-update group of rank 0 and every
        synced engine's TP ranks (engine j's TP rank k is member 1 + j*K + k), opened for this
        sync on rank 0's node; the engines join, rank 0 broadcasts every bucket to all of them
        (``PolicyActor.broadcast_to``), then the group is closed on every side."""
        import ray  # lazy: Ray

        for h in handles:
            if self._engine_ids.get(h._actor_id) is None:
                raise ValueError("Cluster.sync: an engine handle that this cluster's make_engine did not create")
        k = self.cfg.rollout.num_gpus_per_engine
        where = on_bundle(self.pg, self.bundle_of[0], gpus=0.01 if self.gpus else 0)
        address = (
            "127.0.0.1"
            if len({p["node_id"] for p in self.placements + self.engine_placements}) == 1
            else where["node_ip"]
        )
        self._syncs += 1
        name, world = f"mdapo-weights-{os.getpid()}-{self._syncs}", 1 + k * len(handles)
        backend = "nccl" if self.gpus else "gloo"
        joins = [
            h.init_weights_update_group.remote(address, where["port"], 1 + j * k, world, name, backend)
            for j, h in enumerate(handles)
        ]
        outs = ray.get(
            [
                a.broadcast_to.remote(
                    handles, self.engine_kind, address, where["port"], world, name, self.weight_version, backend
                )
                for a in self.actors
            ]
        )
        ray.get(joins)
        ray.get([h.destroy_weights_update_group.remote(name) for h in handles])
        return {
            "bytes": outs[0]["bytes"],
            "buckets": max(o["buckets"] for o in outs),
            "seconds": max(o["seconds"] for o in outs),
            "engines": len(handles),
        }

    # -- the hybrid step's trainer protocol (hybrid/phases.py): the trainer group's, plus the sync
    def _group(self) -> TrainerGroup:
        if self.trainers is None:
            raise RuntimeError("the trainer actors are not built yet (Cluster.build_trainers)")
        return self.trainers

    def onload(self) -> None:
        self._group().onload()

    def offload(self) -> None:
        self._group().offload()

    def probe_logprobs(self, sequences) -> list:
        return self._group().probe_logprobs(sequences)

    def shutdown(self, engine_handles=()):
        """Kill the engine and trainer actors, then unlink the trainer processes' shared-memory
        bucket buffers on this node (CPU weight sync; a killed actor's files would outlive it)."""
        import ray  # lazy: Ray

        for a in list(self.actors) + list(engine_handles):
            try:
                ray.kill(a)
            except Exception:
                pass
        for pg in {id(self.pg): self.pg, id(self.engine_pg): self.engine_pg}.values():
            try:
                ray.util.remove_placement_group(pg)
            except Exception:
                pass
        here = ray.util.get_node_ip_address()
        remove_shared_memory_files([i["pid"] for i in self.infos if i.get("node_ip") == here])

    def weight_checksums(self, arm: bool, engines=None):
        """The hybrid step's checksum check (hybrid/probe.py): ``arm`` makes every rank's next
        sync record per-tensor checksums (and arms ``engines``: RolloutEngine.arm_weight_checksums); otherwise ``{"trainer": per-rank records, "engines":
        per-engine checksums}`` of ``engines`` (RemoteEngines or handles), in the dtypes sent."""
        import ray  # lazy: Ray

        handles = list(getattr(engines, "members", engines or []))
        outs = ray.get([a.weight_checksums.remote(arm) for a in self.actors])
        if arm:
            ray.get([h.arm_weight_checksums.remote() for h in handles])
            return None
        dtypes = {n: c[0] for rec in outs for n, c in (rec or {}).items()}
        return {"trainer": outs, "engines": ray.get([h.weight_checksums.remote(dtypes) for h in handles])}


class RemoteEngines:
    """The hybrid step's engines protocol over EngineActor handles: every call goes to all
    engines at once and waits for all of them."""

    def __init__(self, handles):
        self.members = list(handles)

    def release_memory(self, tags) -> list:
        """Per engine, the tags whose release was a no-op (hybrid/phases.py records them)."""
        import ray  # lazy: Ray

        return ray.get([h.release_memory.remote(list(tags)) for h in self.members])

    def resume_memory(self, tags) -> list:
        import ray  # lazy: Ray

        return ray.get([h.resume_memory.remote(list(tags)) for h in self.members])

    def score(self, sequences, prompt_lens) -> list:
        import ray  # lazy: Ray

        return ray.get([h.score.remote(sequences, prompt_lens) for h in self.members])

    def check_weights(self, action: str) -> list:
        import ray  # lazy: Ray

        return ray.get([h.check_weights.remote(action) for h in self.members])

    def set_weight_version(self, version: int) -> None:
        """Tell every engine the version of the weights it now holds (it stamps its tokens with it)."""
        import ray  # lazy: Ray

        ray.get([h.set_weight_version.remote(version) for h in self.members])


class RemoteEngine:
    """A RolloutEngine-like client of one EngineActor (evaluation from the driver)."""

    def __init__(self, handle):
        self.handle = handle

    def generate(self, prompts, params):
        import ray  # lazy: Ray

        return ray.get(self.handle.generate.remote(prompts, params))

    def score(self, sequences, prompt_lens):
        import ray  # lazy: Ray

        return ray.get(self.handle.score.remote(sequences, prompt_lens))
