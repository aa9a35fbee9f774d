"""The hybrid step (hybrid/phases.py): the one phase order of the driver and of gpu_check.

* with recording fakes: the order, refusals out of phase, the probe's failure and its dtype
  tolerance, re-sync of a restarted engine while the trainer is offloaded;
* the in-process trainer path for real: a PolicyWorker, a strict HF engine that refuses work
  while released and checks the trainer's residency at every call, two DAPO updates.
The Ray path (driver.cluster.Cluster) runs the same object in tests/e2e (hybrid_events.jsonl).
"""

from __future__ import annotations

import math

import pytest
import torch

from megatron_dapo.hybrid.phases import HybridStep, PhaseError
from megatron_dapo.hybrid.probe import probe_stats
from megatron_dapo.hybrid.weight_sync import WeightSyncError
from megatron_dapo.rollout.base import KV_CACHE, MEMORY_TAGS, WEIGHTS

STEP = [
    "engine_release",
    "trainer_onload",
    "engine_resume_weights",
    "sync_weights",
    "probe_megatron",
    "trainer_offload",
    "engine_resume_kv_cache",
    "probe_engine",
]
INIT = STEP[2:]


class FakeTrainer:
    def __init__(self, log, logprobs=((-1.0, -2.0),)):
        self.log, self.logprobs = log, [list(x) for x in logprobs]

    def onload(self):
        self.log.append("onload")

    def offload(self):
        self.log.append("offload")

    def sync(self, engines):
        self.log.append("sync")
        return {"bytes": 10}

    def probe_logprobs(self, seqs):
        self.log.append("probe_logprobs")
        return self.logprobs


class FakeEngines:
    def __init__(self, log, scored=((-1.0, -2.0),)):
        self.log, self.scored = log, [list(x) for x in scored]

    def release_memory(self, tags):
        self.log.append(("release", tuple(tags)))

    def resume_memory(self, tags):
        self.log.append(("resume", tuple(tags)))

    def score(self, seqs, lens):
        self.log.append(("score", tuple(lens)))
        return [self.scored]


def test_order_of_one_step_and_refusals():
    log = []
    h = HybridStep(FakeTrainer(log), offload=True, check_weight_sync_every=1)
    e = FakeEngines(log)
    with pytest.raises(PhaseError, match="to_train"):
        h.to_train(e)
    out = h.to_rollout(e, probe=[[1, 2, 3]])
    assert out == {"sync": {"bytes": 10}, "probe_max_abs": 0.0, "checksums_compared": None}
    with pytest.raises(PhaseError, match="to_rollout"):
        h.to_rollout(e)
    h.to_train(e)
    h.to_rollout(e, probe=[[1, 2, 3]])
    assert h.events == INIT + STEP
    rest = [t for t in MEMORY_TAGS if t != WEIGHTS]
    assert log == [
        ("resume", (WEIGHTS,)),
        "sync",
        "probe_logprobs",
        "offload",
        ("resume", tuple(rest)),
        ("score", (1,)),
        ("release", tuple(MEMORY_TAGS)),
        "onload",
        ("resume", (WEIGHTS,)),
        "sync",
        "probe_logprobs",
        "offload",
        ("resume", tuple(rest)),
        ("score", (1,)),
    ]


def test_no_offload_and_probe_every_other_sync():
    log = []
    h = HybridStep(FakeTrainer(log), offload=False, check_weight_sync_every=2)
    e = FakeEngines(log)
    assert h.to_rollout(e, probe=[[1, 2, 3]])["probe_max_abs"] == 0.0  # sync 0
    h.to_train(e)
    assert h.to_rollout(e, probe=[[1, 2, 3]])["probe_max_abs"] is None  # sync 1
    assert "onload" not in log and "offload" not in log
    assert h.events[-4:] == ["engine_release", "engine_resume_weights", "sync_weights", "engine_resume_kv_cache"]


def test_probe_failure_names_the_tolerance_and_dtype_defaults():
    log = []
    assert HybridStep(FakeTrainer(log), offload=False).tolerance == 1e-4
    assert HybridStep(FakeTrainer(log), offload=False, param_dtype=torch.bfloat16).tolerance == 0.1
    assert HybridStep(FakeTrainer(log), offload=False, probe_tolerance=0.5).tolerance == 0.5
    h = HybridStep(FakeTrainer(log), offload=False)
    with pytest.raises(WeightSyncError, match=r"mean \|logp_engine - logp_megatron\| = 0\.15 > 0\.0001"):
        h.to_rollout(FakeEngines(log, scored=((-1.0, -2.3),)), probe=[[1, 2, 3]])


def test_probe_stats_shapes_and_nan():
    st = probe_stats([[0.0, 1.0]], [[[0.5, 1.0]], [[0.0, 0.75]]])
    assert st["max_abs"] == 0.5 and st["mean_abs"] == 0.1875
    assert math.isinf(probe_stats([[0.0]], [[[float("nan")]]])["max_abs"])
    with pytest.raises(WeightSyncError, match="2 logprobs"):
        probe_stats([[0.0]], [[[0.0, 1.0]]])


def test_resync_of_a_restarted_engine_while_offloaded():
    log = []
    h = HybridStep(FakeTrainer(log), offload=True)
    e = FakeEngines(log)
    h.to_rollout(e)
    log.clear()
    h.resync(e, probe=[[1, 2]])
    rest = tuple(t for t in MEMORY_TAGS if t != WEIGHTS)
    assert log == [("release", rest), "onload", "sync", "probe_logprobs", "offload", ("resume", rest), ("score", (1,))]
    assert not h.trainer_resident
    log.clear()
    assert h.while_trainer_resident(lambda: "saved") == "saved"
    assert log == ["onload", "offload"]


class Memory:
    """What each engine and the trainer hold on the (shared) GPUs; every change is checked:
    the trainer must never be resident while an engine holds its KV cache."""

    def __init__(self):
        self.trainer = True  # a fresh trainer is on its devices
        self.engines = {}
        self.clashes = []

    def check(self, when):
        holding = sorted(n for n, held in self.engines.items() if KV_CACHE in held)
        if self.trainer and holding:
            self.clashes.append((when, holding))


class MemoryTrainer(FakeTrainer):
    def __init__(self, mem, log):
        super().__init__(log)
        self.mem = mem

    def onload(self):
        super().onload()
        self.mem.trainer = True
        self.mem.check("trainer onload")

    def offload(self):
        super().offload()
        self.mem.trainer = False


class MemoryEngines(FakeEngines):
    """Engines named ``names``; a just launched engine holds all its memory."""

    def __init__(self, mem, log, *names):
        super().__init__(log)
        self.mem, self.names = mem, names
        for n in names:
            mem.engines[n] = set(MEMORY_TAGS)
        mem.check(f"launch of {names}")

    def release_memory(self, tags):
        super().release_memory(tags)
        for n in self.names:
            self.mem.engines[n] -= set(tags)

    def resume_memory(self, tags):
        super().resume_memory(tags)
        for n in self.names:
            self.mem.engines[n] |= set(tags)
        self.mem.check(f"resume {tags} of {self.names}")


def test_launch_releases_the_engines_before_the_trainer_is_built():
    """Start-up: the engines are launched on free GPUs, release all their memory, and only then
    is the trainer built; the first to_rollout follows."""
    log, mem = [], Memory()
    mem.trainer = False  # not built yet
    h = HybridStep(MemoryTrainer(mem, log), offload=True)
    engines = MemoryEngines(mem, log, "e0", "e1")

    def build():
        log.append("build")
        assert all(not held for held in mem.engines.values()), mem.engines
        mem.trainer = True
        mem.check("trainer build")

    h.launch(engines, build)
    assert log == [("release", tuple(MEMORY_TAGS)), "build"]
    h.to_rollout(engines, probe=[[1, 2, 3]])
    assert h.events == ["engine_launch_release", "trainer_build"] + INIT
    assert not mem.clashes and not mem.trainer
    assert all(held == set(MEMORY_TAGS) for held in mem.engines.values())
    with pytest.raises(PhaseError, match="launch"):
        h.launch(engines, build)


@pytest.mark.parametrize("with_others", [False, True], ids=["restarted-only", "others-running"])
def test_resync_never_onloads_the_trainer_next_to_a_kv_cache(with_others):
    """An engine restarted mid-rollout comes up holding its KV cache, next to the running
    engines' KV caches: the trainer onloads for its sync only once all of them released their
    KV cache (the weights stay), and every engine holds all its memory again afterwards."""
    log, mem = [], Memory()
    h = HybridStep(MemoryTrainer(mem, log), offload=True)
    mem.trainer = False
    running = MemoryEngines(mem, log, "e0", "e1")
    running.release_memory(list(MEMORY_TAGS))  # as HybridStep.launch leaves them, then builds the trainer
    mem.trainer = True
    h.to_rollout(running)  # engines awake with their KV caches, trainer offloaded
    assert not mem.clashes and not mem.trainer
    others = MemoryEngines(mem, log, "e0")
    restarted = MemoryEngines(mem, log, "e1")  # the new e1, launched awake
    h.events.clear()
    if with_others:
        h.resync(restarted, probe=[[1, 2]], others=others)
    else:
        del mem.engines["e0"]  # a single engine: only the restarted one
        h.resync(restarted, probe=[[1, 2]])
    assert not mem.clashes, mem.clashes
    assert not mem.trainer and not h.trainer_resident
    assert all(held == set(MEMORY_TAGS) for held in mem.engines.values())
    assert h.events == [
        "engine_release_kv_cache",
        "trainer_onload",
        "sync_weights",
        "probe_megatron",
        "trainer_offload",
        "engine_resume_kv_cache",
        "probe_engine",
    ]


@pytest.mark.gloo
def test_in_process_trainer_path(gloo, tmp_path):
    from tests.e2e.fixtures import make_tiny_qwen2_dir
    from tests.hybrid import bodies

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    (o,) = gloo(1).run(bodies.phase_order, hf, 2)
    assert o["tolerance"] == 1e-4  # fp32 parameters
    assert o["to_train_in_init"] and o["to_rollout_in_rollout"]
    assert o["events"] == INIT + STEP + STEP
    assert o["released_refusals"] == [(True, True, True)] * 2
    assert o["train"] == [True, True]
    assert all(p is not None and p < 1e-5 for p in o["probe"]), o["probe"]
    assert o["calls"][:3] == ["resume:weights", "update_weights", "finish_weight_update"]
    assert o["calls"].count("generate") == 2
