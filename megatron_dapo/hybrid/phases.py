"""The hybrid step: the ONE owner of the phase order of a colocated trainer and its engines.

Training and rollout share the same devices. One step::

    generate                                  (engines awake, trainer offloaded)
    -> engines.release_memory(all tags)       (weights, KV cache, CUDA graphs)
    -> trainer.onload()                       (params, grads, optimizer state)
    -> [old logprobs, train]                  (the caller, between to_train and to_rollout)
    -> engines.resume_memory([weights])
    -> trainer.sync(engines)                  (bucketed TP/PP -> HF, weight_sync.py)
    -> probe, megatron half (every N-th sync) (needs the trainer's weights: before offload)
    -> trainer.offload()
    -> engines.resume_memory([kv_cache, cuda_graph])
    -> probe, engine half (score + compare)   (needs the engine's KV cache: after resume)
    -> generate ...

Start-up (:meth:`HybridStep.launch`): engines launched -> engines.release_memory(all tags) ->
trainer built -> the first ``to_rollout`` (from INIT): the engines size their KV cache on GPUs
that no trainer holds yet. A restarted engine (:meth:`HybridStep.resync`): it and the running
engines release their KV cache before the trainer onloads for its sync.

Why (docs/hybrid.md has the long version): the engine and the trainer are never both resident
at their peak; the engine's weight memory must exist before the sync writes into it; the
trainer's weights must be resident while they are read (sync and probe); the KV cache and CUDA
graphs, the largest allocations of the engine, come back only after the trainer's memory is
gone; ``finish_weight_update`` (inside the sync) flushes the engine's prefix cache, which was
computed with the old weights.

``HybridStep`` is single-controller: the driver (``megatron_dapo.train``) holds one and gives
it a *trainer* and, per call, the *engines*. The same object drives the Ray path (trainer:
``driver.cluster.Cluster``, engines: ``driver.cluster.RemoteEngines``) and the in-process path
(trainer: :class:`InProcessTrainer` around one ``PolicyWorker``, engines: :class:`LocalEngines`,
used by ``benchmarks/gpu_check.py``); both trainers call the same ``PolicyWorker`` methods.

Trainer protocol: ``onload()``, ``offload()``, ``sync(engines) -> dict`` (at least ``bytes``),
``probe_logprobs(sequences) -> [[float]]`` (megatron's logprobs of tokens 1.. of each sequence
at temperature 1, what ``RolloutEngine.score`` returns with prompt length 1).
Engines protocol: ``release_memory(tags)``, ``resume_memory(tags)`` (each may return, per
engine, the tags whose call was a no-op: SGLang on a CPU keeps its memory; the event is then
logged with the suffix :data:`NOOP_SUFFIX`), ``score(sequences, prompt_lens) -> [per engine: [[float]]]``.
"""

from __future__ import annotations

import logging
import time
from typing import List, Optional, Sequence

import torch

from ..rollout.base import MEMORY_TAGS, WEIGHTS
from .probe import (
    PROBE_TOKENS,
    check_probe_stats,
    compare_checksums,
    cut_probe,
    default_threshold,
    probe_stats,
    reference_checksums,
    should_check,
)
from .weight_sync import CHECKSUM_TAP, WeightSyncError

log = logging.getLogger(__name__)

ROLLOUT, TRAIN, INIT = "rollout", "train", "init"
#: the suffix of a memory event (engine_release, engine_resume_*) in which the engines' calls freed
#: or restored nothing (SGLang's CPU engine cannot release memory: rollout/sglang_cpu.py)
NOOP_SUFFIX = "_noop"
# everything but the weights comes back after the sync (KV cache, CUDA graphs)
AFTER_SYNC_TAGS = tuple(t for t in MEMORY_TAGS if t != WEIGHTS)


class PhaseError(RuntimeError):
    """A hybrid-step method called in the wrong phase."""


class LocalEngines:
    """Engines living in this process (``RolloutEngine`` objects), one call after another."""

    def __init__(self, engines):
        self.members = list(engines) if isinstance(engines, (list, tuple)) else [engines]

    def release_memory(self, tags: Sequence[str]) -> list:
        return [e.release_memory(list(tags)) for e in self.members]

    def resume_memory(self, tags: Sequence[str]) -> list:
        return [e.resume_memory(list(tags)) for e in self.members]

    def score(self, sequences, prompt_lens) -> list:
        return [e.score(sequences, prompt_lens) for e in self.members]

    def check_weights(self, action: str) -> list:
        return [e.check_weights(action) for e in self.members]


class InProcessTrainer:
    """The trainer protocol over one in-process ``PolicyWorker`` (a world of one rank)."""

    def __init__(self, worker, offload: bool = True):
        self.worker = worker
        self.offload_enabled = offload

    def onload(self) -> None:
        if self.offload_enabled:
            self.worker.onload()

    def offload(self) -> None:
        if self.offload_enabled:
            self.worker.offload()

    def sync(self, engines, full: bool = True) -> dict:
        del full  # every in-process sync is a full one (--lora-sync adapter runs on the Ray path)
        members = engines.members
        return self.worker.sync_weights(members[0] if len(members) == 1 else members)

    def probe_logprobs(self, sequences) -> list:
        return self.worker.probe_logprobs(sequences)

    def weight_checksums(self, arm: bool, engines=None):
        """arm: the next sync records checksums (weight_sync.CHECKSUM_TAP), and so do the engines
        (RolloutEngine.arm_weight_checksums); else this rank's
        record and each engine's checksums in the dtypes sent."""
        if arm:
            for e in getattr(engines, "members", ()):
                e.arm_weight_checksums()
            return CHECKSUM_TAP.arm()
        mine = CHECKSUM_TAP.take()
        dtypes = {n: c[0] for n, c in (mine or {}).items()}
        return {"trainer": [mine], "engines": [_engine_checksums(e, dtypes) for e in engines.members]}


def _engine_checksums(engine, dtypes: dict):
    """An engine's checksums by HF name, or None where it cannot report them."""
    try:
        return engine.weight_checksums(dtypes)
    except NotImplementedError as e:
        log.warning("weight sync check: no checksums from this engine (%s)", e)
        return None


class HybridStep:
    """Drive the phase order of one trainer and its engines (see the module docstring).

    ``offload``: False keeps the trainer resident (separate devices for the engines, or a CPU
    run). ``check_weight_sync_every``: probe after every N-th sync (0: never; the first sync
    is sync 0). ``probe_tolerance``: the mean |logp_engine - logp_megatron| tolerated on the
    probe's first ``probe.PROBE_TOKENS`` tokens (its p90: ``probe.P90_FACTOR`` x it); None takes
    the parameter dtype's (:func:`probe.default_threshold`: fp32 1e-4, fp16 0.03, bf16 0.1). A
    trainer with ``weight_checksums(arm, engines=None)`` also gets the exact checksum check
    (``probe.compare_checksums``) on the same syncs, right after the sync.
    ``check_init_sync`` (``--check-weight-sync-init``): the engines started with the trainer's
    initial weights; the first sync must restore them exactly after a random fill
    (:meth:`_init_check`; engines protocol: ``check_weights(action)``).
    """

    def __init__(
        self,
        trainer,
        *,
        offload: bool,
        check_weight_sync_every: int = 1,
        probe_tolerance: Optional[float] = None,
        param_dtype: torch.dtype = torch.float32,
        check_init_sync: bool = False,
        adapters_only: bool = False,
    ):
        self.trainer = trainer
        # --lora-sync adapter: the engines keep the frozen base between steps (they release their KV
        # cache and CUDA graphs only) and take the LoRA adapters alone at each sync; the base is sent
        # at the first sync and to a restarted engine (trainer protocol: sync(engines, full=...))
        self.adapters_only = adapters_only
        self.check_init_sync = check_init_sync  # --check-weight-sync-init: see _init_check
        self._init_snapshot = False
        self.offload = offload
        self.check_every = check_weight_sync_every
        self.tolerance = probe_tolerance if probe_tolerance is not None else default_threshold(param_dtype)
        self.probe_tokens = PROBE_TOKENS
        self.last_check: dict = {}  # the last probe's statistics and checksum counts
        self.phase = INIT
        self.trainer_resident = True  # a fresh trainer is on its devices
        self.num_syncs = 0
        self.events: List[str] = []  # what happened, in order (tests, hybrid_events.jsonl)
        self.timings: dict = {}

    # ---------------------------------------------------------------- helpers ----
    def _event(self, name: str) -> None:
        self.events.append(name)
        log.debug("hybrid: %s", name)

    def _memory(self, event: str, key: str, fn, tags) -> None:
        """One memory call on the engines (release or resume), timed; its event gets
        :data:`NOOP_SUFFIX` when every engine reports every tag as a no-op."""
        got = self._timed(key, fn, list(tags))
        kept = got if isinstance(got, list) else []
        noop = bool(kept) and all(isinstance(k, list) and set(k) >= set(tags) for k in kept)
        self._event(event + (NOOP_SUFFIX if noop else ""))

    def _timed(self, key: str, fn, *a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - t0
        return out

    def _require(self, *phases: str, what: str) -> None:
        if self.phase not in phases:
            raise PhaseError(f"HybridStep.{what}() in phase {self.phase!r}; allowed in {list(phases)}")

    def _onload(self) -> None:
        if self.offload and not self.trainer_resident:
            self._timed("onload_s", self.trainer.onload)
            self._event("trainer_onload")
        self.trainer_resident = True

    def _offload(self) -> None:
        if self.offload and self.trainer_resident:
            self._timed("offload_s", self.trainer.offload)
            self._event("trainer_offload")
            self.trainer_resident = False

    def _sync_and_probe_reference(self, engines, probe: Optional[list], full: bool = True):
        checking = bool(probe) and should_check(self.num_syncs, self.check_every)
        # exact checksums (probe.compare_checksums): the trainer records what it sends; not for an
        # adapter-only sync (the engine's weights then differ from what was sent: base + adapters)
        sums = getattr(self.trainer, "weight_checksums", None) if checking and not self.adapters_only else None
        if sums is not None:
            sums(True, engines)  # arm: the next sync records, on both sides
        if self.adapters_only:
            stats = self._timed("sync_s", self.trainer.sync, engines, full=full)
            self._event("sync_weights" if full else "sync_adapters")
        else:
            stats = self._timed("sync_s", self.trainer.sync, engines)
            self._event("sync_weights")
        ref = None
        self.last_check = {}
        if checking:
            if sums is not None:
                got = self._timed("probe_s", sums, False, engines)
                self.last_check.update(compare_checksums(reference_checksums(got["trainer"]), got["engines"]))
            ref = self._timed("probe_s", self.trainer.probe_logprobs, cut_probe(probe, self.probe_tokens))
            self._event("probe_megatron")
        self.num_syncs += 1
        return stats, ref

    def _sync_info(self, stats, worst: Optional[float]) -> dict:
        return {"sync": stats, "probe_max_abs": worst, "checksums_compared": self.last_check.get("compared")}

    def _init_check(self, engines, action: str) -> None:
        """``--check-weight-sync-init`` (engines started from the trainer's initial weights):
        "snapshot" at launch, "reset_tensors" before the first sync, "compare" after it
        (``RolloutEngine.check_weights``); raises WeightSyncError naming every tensor the first
        sync did not restore exactly."""
        got = self._timed("probe_s", engines.check_weights, action)
        self._event(f"init_check_{action}")
        if action in ("snapshot", "compare"):
            self._init_snapshot = action == "snapshot"
        bad = [f"engine {e}: " + "; ".join(lines) for e, lines in enumerate(got or []) if lines]
        if action == "compare" and bad:
            raise WeightSyncError(
                "initial weight sync check (--check-weight-sync-init) failed: after the first sync these engine "
                "tensors differ from the checkpoint the engine loaded at launch: " + " | ".join(bad) + ". Every "
                "tensor was overwritten with random values before the sync, so a tensor named here was not written "
                "by the sync (its name never reached the engine's loader, or the loader skipped it) or was written "
                "with other values or in another layout (two tensors exchanged, a TP shard or a fused q/k/v or "
                "gate/up block in the wrong order, a wrong conversion). The trainer's weights at the first sync must "
                "be --hf-checkpoint's (no --load, no --pretrained-checkpoint)"
            )

    def _probe_engines(self, engines, probe: Optional[list], ref: list) -> float:
        assert probe is not None, "a reference to probe against exists only for a probe"
        probe = cut_probe(probe, self.probe_tokens)
        got = self._timed("probe_s", engines.score, probe, [1] * len(probe))
        self._event("probe_engine")
        st = probe_stats(ref, got)
        self.last_check.update(st)
        check_probe_stats(st, self.tolerance, where=f" after sync {self.num_syncs}")
        return st["max_abs"]

    # ----------------------------------------------------------------- phases ----
    def launch(self, engines, build_trainer) -> None:
        """Start-up (INIT): the engines, just launched, release all their memory, THEN
        ``build_trainer()`` builds the trainer (model, optimizer). An engine sizes its KV cache
        from the memory free when it starts (SGLang's mem_fraction_static): launched before
        the trainer it sees a free GPU. ``release_memory`` waits for every engine to be up.
        The first :meth:`to_rollout` then resumes their weights, syncs, offloads the trainer
        and resumes their KV cache."""
        self._require(INIT, what="launch")
        if self.check_init_sync:  # before the release: the engines still hold the checkpoint
            self._init_check(engines, "snapshot")
        self._memory("engine_launch_release", "release_s", engines.release_memory, MEMORY_TAGS)
        build_trainer()
        self.trainer_resident = True
        self._event("trainer_build")

    def to_train(self, engines) -> None:
        """rollout -> train: the engines release all their memory, the trainer onloads."""
        self._require(ROLLOUT, what="to_train")
        self.timings = {}
        tags = AFTER_SYNC_TAGS if self.adapters_only else MEMORY_TAGS  # adapters only: the base stays
        self._memory("engine_release", "release_s", engines.release_memory, tags)
        self._onload()
        self.phase = TRAIN

    def to_rollout(self, engines, probe: Optional[list] = None) -> dict:
        """train (or init) -> rollout: resume weights, sync, probe (megatron half), offload,
        resume KV cache and CUDA graphs, probe (engine half).

        ``probe``: token sequences to compare engine and megatron logprobs on (every N-th
        sync); None skips the probe. Returns ``{"sync": stats, "probe_max_abs": float|None,
        "checksums_compared": int|None}`` (tensors whose exact checksums were compared).
        """
        self._require(INIT, TRAIN, what="to_rollout")
        init_check = self.phase == INIT and self.check_init_sync
        if self.phase == INIT:
            self.timings = {}
            self._onload()
        if init_check and not self._init_snapshot:  # no launch(): engines not released since they loaded
            self._init_check(engines, "snapshot")
        full = self.phase == INIT or not self.adapters_only  # the base goes at the first sync only
        if full:
            self._memory("engine_resume_weights", "resume_s", engines.resume_memory, [WEIGHTS])
        if init_check:
            self._init_check(engines, "reset_tensors")
        stats, ref = self._sync_and_probe_reference(engines, probe, full=full)
        if init_check:
            self._init_check(engines, "compare")
        self._offload()
        self._memory("engine_resume_kv_cache", "resume_s", engines.resume_memory, AFTER_SYNC_TAGS)
        self.phase = ROLLOUT
        worst = self._probe_engines(engines, probe, ref) if ref is not None else None
        return self._sync_info(stats, worst)

    def resync(self, engines, probe: Optional[list] = None, others=None) -> dict:
        """Re-sync ``engines`` that were (re)started awake mid-rollout; ``others``: the engines
        that kept running (they hold their KV cache in ROLLOUT).

        With an offloaded trainer the trainer never sits next to a KV cache: the restarted
        engines and the others release their KV cache and CUDA graphs (the weights stay: the
        memory of a normal sync), the trainer onloads, syncs the restarted engines, probes,
        offloads, then every engine resumes its KV cache and the restarted ones are probed. A
        resident trainer (no offload) just syncs and probes."""
        self._require(ROLLOUT, INIT, what="resync")
        make_room = self.offload and not self.trainer_resident
        if make_room:
            released = [engines] + ([others] if others is not None and self.phase == ROLLOUT else [])
            for e in released:
                self._timed("release_s", e.release_memory, list(AFTER_SYNC_TAGS))
            self._event("engine_release_kv_cache")
        self._onload()
        stats, ref = self._sync_and_probe_reference(engines, probe)
        if make_room:
            self._offload()
            for e in released:
                self._timed("resume_s", e.resume_memory, list(AFTER_SYNC_TAGS))
            self._event("engine_resume_kv_cache")
        worst = self._probe_engines(engines, probe, ref) if ref is not None else None
        return self._sync_info(stats, worst)

    def while_trainer_resident(self, fn, *args, **kwargs):
        """Run ``fn`` with the trainer onloaded (e.g. a checkpoint save during rollout), then
        offload it again if it was offloaded."""
        was = self.trainer_resident
        self._onload()
        try:
            return fn(*args, **kwargs)
        finally:
            if not was:
                self._offload()
