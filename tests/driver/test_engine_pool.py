"""EnginePool restarts an engine that stops answering and re-queues its prompts (real Ray actors)."""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.slow]


def test_hung_engine_is_restarted_resynced_and_its_chunk_requeued():
    import ray

    from megatron_dapo.driver.rollout_manager import EnginePool
    from megatron_dapo.launch.placement import start_ray

    start_ray()

    @ray.remote(num_cpus=0)
    class Engine:
        def __init__(self, hang: bool):
            self.hang = hang

        def generate(self, prompts, params):
            if self.hang:
                time.sleep(3600)  # stops answering
            return [[f"out-{p[0]}"] for p in prompts]

        def abort(self):
            pass

    made, resynced = [], []

    def make_engine(i):
        h = Engine.remote(hang=not made)  # the first engine hangs, its replacement works
        made.append(h)
        return h

    pool = EnginePool(make_engine, 1, lambda handles: resynced.append(list(handles)), timeout_s=1.0)
    got = {}
    pool.run_chunks([([[1]], None), ([[2]], None)], lambda i, out: got.setdefault(i, out) and False, ordered=True)
    assert pool.restarts == 1 and len(made) == 2
    assert resynced == [[made[1]]]  # the new engine got the trainer's weights before generating
    assert got == {0: [["out-1"]], 1: [["out-2"]]}  # the hung chunk was re-queued, nothing lost
    for h in made:
        ray.kill(h)
