"""The trainer ranks as one typed object: the driver reaches its ``PolicyActor``s only here.

Every method runs on all ranks at once and returns when all have finished; the group owns
what the driver used to do by hand around those calls: sharding over data-parallel ranks
(balanced by tokens, ``driver/batch.py``), picking the rank whose result stands for each DP
rank (last pipeline stage, TP rank 0), and reducing the outputs of a training step
(``training/stats.reduce_step_stats``: ``StepStats`` -> the logged metrics). A user error raised on a rank (a ``CheckpointError``
of ``load``, ...) comes out as that error, not as Ray's wrapper around its traceback.

The hybrid step's trainer protocol (``hybrid/phases.py``: ``onload``, ``offload``,
``probe_logprobs``) is part of it; the weight sync, which needs the engines, is
``driver/cluster.Cluster.sync``.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from ..training.stats import reduce_step_stats
from .batch import dp_partition, dp_shards


def _ray_get(futures):
    import ray

    return ray.get(futures)


class TrainerGroup:
    """``actors[r]``: trainer rank ``r``'s ``PolicyActor`` handle; ``infos[r]``: what its
    ``info()`` returned (rank, dp_rank, dp_size, last_stage, pid, node_ip). ``get`` resolves a
    list of futures (``ray.get``; tests pass their own)."""

    def __init__(self, actors: Sequence, infos: Sequence[dict], get: Optional[Callable] = None):
        self.actors, self.infos = list(actors), list(infos)
        self._get = get or _ray_get
        self.dp_size = self.infos[0]["dp_size"] if self.infos else 1
        # the rank whose results stand for DP rank d: last PP stage, lowest rank (TP rank 0)
        self.reporters: dict = {}
        for i in sorted(self.infos, key=lambda i: i["rank"]):
            if i["last_stage"]:
                self.reporters.setdefault(i["dp_rank"], i["rank"])

    @property
    def world(self) -> int:
        return len(self.actors)

    def _all(self, launch: Callable) -> list:
        """``launch(actor, rank)`` (a future) on every rank; the results in rank order."""
        futures = [launch(a, r) for r, a in enumerate(self.actors)]
        try:
            return self._get(futures)
        except Exception as e:
            from ..errors import user_error_types

            cause = getattr(e, "cause", None)  # ray.exceptions.RayTaskError
            if isinstance(cause, user_error_types()):
                raise cause from None
            raise

    def _per_dp_rank(self, shards: list) -> list:
        """The argument of each rank: its DP rank's entry of ``shards``."""
        return [shards[i["dp_rank"]] for i in self.infos]

    # -- weights and checkpoints --------------------------------------------------------------
    def load_initial_weights(self) -> str:
        """--pretrained-checkpoint or --hf-checkpoint weights; returns where they came from."""
        return self._all(lambda a, r: a.load_initial_weights.remote())[0]

    def build_reference(self) -> str:
        """The frozen reference policy of the KL term; returns where its weights came from."""
        return self._all(lambda a, r: a.build_reference.remote())[0]

    def save(self, directory: str, metadata: dict) -> None:
        """Model and optimizer, megatron ``torch_dist`` (collective)."""
        self._all(lambda a, r: a.save.remote(directory, metadata))

    def load(self, directory: str) -> None:
        """Model and optimizer, resharded to this layout when it differs from the saved one."""
        self._all(lambda a, r: a.load.remote(directory))

    def export_hf(self, directory: str) -> None:
        """The current weights as an HF checkpoint in ``directory`` (collective)."""
        self._all(lambda a, r: a.export_hf.remote(directory))

    def export_peft(self, directory: str) -> None:
        """A LoRA policy's adapters in PEFT's format in ``directory`` (collective)."""
        self._all(lambda a, r: a.export_peft.remote(directory))

    def full_weights(self) -> dict:
        """Megatron global name -> full (TP-gathered) tensor, every PP stage's."""
        out = {}
        for part in self._all(lambda a, r: a.full_weights.remote()):
            out.update(part)
        return out

    # -- RNG ------------------------------------------------------------------------------------
    def rng_states(self) -> list:
        return self._all(lambda a, r: a.rng_state.remote())

    def set_rng_states(self, states: list) -> None:
        """``states[r]`` back on rank ``r`` (a resume on the same layout)."""
        if len(states) != self.world:
            raise ValueError(f"TrainerGroup.set_rng_states: {len(states)} state(s) for {self.world} rank(s)")
        self._all(lambda a, r: a.set_rng_state.remote(states[r]))

    def derive_rng_states(self, step: int) -> list:
        """Every rank seeded from (--seed, rank, ``step``); the seeds."""
        return self._all(lambda a, r: a.derive_rng_state.remote(step))

    # -- DAPO -----------------------------------------------------------------------------------
    def logprobs(self, samples: list, model: str = "policy") -> None:
        """Forward-only logprobs of the response tokens of ``samples`` (``driver.batch.Sample``),
        sharded over the DP ranks balanced by tokens; written to ``old_logprobs`` (``model``
        "policy") or ``ref_logprobs`` ("ref": the KL term's frozen reference)."""
        if model not in ("policy", "ref"):
            raise ValueError(f"TrainerGroup.logprobs: model {model!r} is 'policy' or 'ref'")
        if not samples:
            return
        items = [s.to_item() for s in samples]
        parts = dp_partition(items, self.dp_size)
        shards = [[items[i] for i in part] for part in parts]
        if model == "policy":
            outs = self._all(lambda a, r: a.compute_logprobs.remote(shards[self.infos[r]["dp_rank"]]))
        else:
            outs = self._all(lambda a, r: a.compute_ref_logprobs.remote(shards[self.infos[r]["dp_rank"]]))
        field = "old_logprobs" if model == "policy" else "ref_logprobs"
        for d, part in enumerate(parts):
            for i, lp in zip(part, outs[self.reporters[d]] or []):
                setattr(samples[i], field, lp)

    def train(self, minibatches: list, inject_nan: bool = False, progress: Optional[str] = None) -> dict:
        """One optimizer step per mini-batch (each split over the DP ranks balanced by tokens);
        the step's metrics reduced over the DP reporters and optimizer steps
        (``reduce_step_stats``: token-weighted means, grad norm, skipped steps, lr).
        ``progress``: a tqdm description, or None for no bar."""
        shards_per_mb = [dp_shards([s.to_item() for s in mb], self.dp_size) for mb in minibatches]
        outs: list = [[] for _ in self.actors]
        steps = range(len(shards_per_mb))
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc=progress, unit="opt-step", leave=False)
        for k in steps:
            mine = self._per_dp_rank(shards_per_mb[k])
            for r, o in enumerate(self._all(lambda a, r: a.train.remote([mine[r]], inject_nan))):
                outs[r].extend(o)
        return reduce_step_stats(outs, self.reporters)

    # -- the hybrid step's trainer protocol (hybrid/phases.py) ------------------------------------
    def onload(self) -> None:
        self._all(lambda a, r: a.onload.remote())

    def offload(self) -> None:
        self._all(lambda a, r: a.offload.remote())

    def probe_logprobs(self, sequences) -> list:
        return self._all(lambda a, r: a.probe_logprobs.remote(sequences))[self.reporters[0]]
