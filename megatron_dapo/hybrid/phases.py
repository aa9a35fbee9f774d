"""The hybrid engine's per-step phase order (training and rollout share the same devices).

One step::

    generate                                  (engine awake, trainer offloaded)
    -> engine.release_memory([weights, kv_cache])
    -> trainer onload                         (params, grads, optimizer state)
    -> train                                  (the caller's train function)
    -> engine.resume_memory([weights])
    -> sync weights                           (bucketed, see weight_sync.py)
    -> probe, megatron half (every N-th sync) (needs the trainer's weights: before offload)
    -> trainer offload
    -> engine.resume_memory([kv_cache])
    -> probe, engine half (score + compare)   (needs the engine's KV cache: after resume)
    -> generate ...

Why (docs/hybrid.md has the long version): the engine and the trainer are never both
resident at their peak; the engine's weight memory must exist before the sync writes into
it, and the trainer's weights must still be resident while they are read (sync and probe);
the KV cache, the largest allocation of the engine, comes back only after the trainer's
memory is gone; ``finish_weight_update`` flushes the engine's prefix cache, which was
computed with the old weights.

``HybridEngine`` is collective: every rank constructs it and calls the same methods in the
same order; only feeder ranks hold an engine. It keeps ``phase`` ("rollout" or "train")
and refuses calls out of order.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, List, Optional, Sequence

import torch.distributed as dist

from ..rollout.base import KV_CACHE, WEIGHTS
from .offload import TrainerOffloader
from .probe import compare_with_engine, default_probe_tokens, megatron_probe_logprobs, model_threshold, should_check
from .weight_sync import DEFAULT_BUCKET_BYTES, WeightSync

log = logging.getLogger(__name__)

ROLLOUT, TRAIN, INIT = "rollout", "train", "init"


class PhaseError(RuntimeError):
    """A hybrid-engine method called in the wrong phase."""


class HybridEngine:
    """Drive the phase order of one trainer (``policy``: ``training.setup.Policy``) and its
    engine(s) (on feeder ranks; None elsewhere).

    ``check_weight_sync_every``: probe after every N-th sync (0: never); ``probe_tokens``
    and ``probe_threshold`` as in :func:`probe.check_weight_sync`. ``offload``: False keeps
    the trainer resident (e.g. separate devices for the engine). ``preserve_grads``: see
    :class:`offload.TrainerOffloader` (False is faster; gradients are zeroed every step).
    """

    def __init__(
        self,
        policy,
        engine=None,
        *,
        feeder_ranks: Sequence[int] = (0,),
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        check_weight_sync_every: int = 1,
        probe_tokens=None,
        probe_threshold: Optional[float] = None,
        offload: bool = True,
        preserve_grads: bool = False,
        tp_group=None,
        pp_group=None,
        mp_group=None,
    ):
        self.policy = policy
        self.engines: List = [] if engine is None else (list(engine) if isinstance(engine, (list, tuple)) else [engine])
        self.sync = WeightSync(
            policy.model, policy.arch, feeder_ranks=feeder_ranks, bucket_bytes=bucket_bytes,
            tp_group=tp_group, pp_group=pp_group, mp_group=mp_group,
        )
        if self.engines and not self.sync.is_feeder:
            raise ValueError(f"rank {dist.get_rank()} got an engine but is not in feeder_ranks {list(feeder_ranks)}")
        if self.sync.is_feeder and not self.engines:
            raise ValueError(f"rank {dist.get_rank()} is a feeder rank but got no engine")
        self.pp_group = pp_group
        self.check_every = check_weight_sync_every
        self.probe_tokens = probe_tokens if probe_tokens is not None else default_probe_tokens(policy.arch.vocab_size)
        self.probe_threshold = probe_threshold
        self.offloader = TrainerOffloader(policy.model, policy.optimizer, preserve_grads=preserve_grads) if offload else None
        self.phase = INIT
        self.num_syncs = 0
        self.events: List[str] = []  # what happened, in order (tests, logs)
        self.timings: dict = {}

    # ---------------------------------------------------------------- helpers ----
    def _event(self, name: str) -> None:
        self.events.append(name)
        log.debug("hybrid: %s", name)

    def _timed(self, key: str, fn, *a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        self.timings[key] = time.perf_counter() - t0
        return out

    def _require(self, *phases: str, what: str) -> None:
        if self.phase not in phases:
            raise PhaseError(f"HybridEngine.{what}() in phase {self.phase!r}; allowed in {list(phases)}")

    # ----------------------------------------------------------------- phases ----
    def to_rollout(self) -> dict:
        """train (or init) -> rollout: resume weights, sync, probe, offload, resume KV cache."""
        self._require(INIT, TRAIN, what="to_rollout")
        for e in self.engines:
            e.resume_memory([WEIGHTS])
        self._event("engine_resume_weights")
        stats = self._timed("sync_s", self.sync.sync, self.engines)
        self._event("sync_weights")
        probe, ref = None, None
        check = should_check(self.num_syncs, self.check_every)
        if check:  # megatron's half of the probe needs the trainer's weights: before offload
            ref = self._timed(
                "probe_megatron_s", megatron_probe_logprobs, self.policy.model, self.policy.arch,
                self.probe_tokens, pp_group=self.pp_group,
            )
            self._event("probe_megatron")
        self.num_syncs += 1
        if self.offloader is not None:
            self._timed("offload_s", self.offloader.offload)
            self._event("trainer_offload")
        for e in self.engines:
            e.resume_memory([KV_CACHE])
        self._event("engine_resume_kv_cache")
        self.phase = ROLLOUT
        if check:  # the engine's half needs its KV cache: after resume
            threshold = self.probe_threshold
            if threshold is None:
                threshold = model_threshold(self.policy.model)
            probe = self._timed("probe_engine_s", compare_with_engine, ref, self.engines or None, self.probe_tokens, threshold)
            self._event("probe_engine")
        return {"sync": stats, "probe_max_abs": probe}

    def to_train(self) -> None:
        """rollout -> train: release the engine's weights and KV cache, onload the trainer."""
        self._require(ROLLOUT, what="to_train")
        for e in self.engines:
            e.release_memory([WEIGHTS, KV_CACHE])
        self._event("engine_release")
        if self.offloader is not None:
            self._timed("onload_s", self.offloader.onload)
            self._event("trainer_onload")
        self.phase = TRAIN

    def generate(self, fn: Callable, *args, **kwargs):
        """Run ``fn(engines, *args, **kwargs)`` in the rollout phase (engines is [] off-feeder)."""
        self._require(ROLLOUT, what="generate")
        out = fn(self.engines, *args, **kwargs)
        self._event("generate")
        return out

    def train(self, fn: Callable, *args, **kwargs):
        """Run ``fn(policy, *args, **kwargs)`` in the train phase."""
        self._require(TRAIN, what="train")
        out = fn(self.policy, *args, **kwargs)
        self._event("train")
        return out

    def step(self, generate_fn: Callable, train_fn: Callable):
        """One full step: generate -> to_train -> train(rollouts) -> to_rollout.

        ``generate_fn(engines)`` returns the rollouts; ``train_fn(policy, rollouts)`` trains
        on them. Returns ``(rollouts, train_output, to_rollout_info)``.
        """
        if self.phase == INIT:
            self.to_rollout()
        rollouts = self.generate(generate_fn)
        self.to_train()
        out = self.train(train_fn, rollouts)
        info = self.to_rollout()
        return rollouts, out, info
