"""EnginePool over real Ray actors: an engine that stops answering is restarted, re-synced, and
its outstanding requests start again there; abort returns the requests still running."""

from __future__ import annotations

import time

import pytest

from megatron_dapo.rollout.base import Finished, GenerationOutput, Request, SamplingParams

pytestmark = [pytest.mark.slow]


def test_hung_engine_is_restarted_resynced_and_its_requests_resubmitted():
    import ray

    from megatron_dapo.driver.engine_pool import EnginePool
    from megatron_dapo.launch.placement import start_ray

    start_ray()

    @ray.remote(num_cpus=0)
    class Engine:
        """Answers a request with its prompt's first token; the first engine hangs in poll."""

        def __init__(self, hang: bool):
            self.hang, self.todo = hang, []

        def submit(self, requests):
            self.todo += requests

        def poll(self, timeout_s):
            if self.hang:
                time.sleep(3600)  # stops answering
            out, self.todo = self.todo[:1], self.todo[1:]
            return [
                Finished(r.rid, GenerationOutput(r.prompt_ids, [r.prompt_ids[0]], [-0.1], "stop"), time.time())
                for r in out
            ]

        def abort_requests(self, rids=None):
            out = [
                Finished(r.rid, GenerationOutput(r.prompt_ids, [], [], "abort"), time.time())
                for r in self.todo
                if rids is None or r.rid in rids
            ]
            self.todo = [r for r in self.todo if rids is not None and r.rid not in rids]
            return out

    made, resynced = [], []

    def make_engine(i):
        h = Engine.remote(hang=not made)  # the first engine hangs, its replacement works
        made.append(h)
        return h

    def resync(handles):  # like the weight sync, it waits for the new engine
        ray.get([h.abort_requests.remote([]) for h in handles])
        resynced.append(list(handles))

    pool = EnginePool(make_engine, 1, resync, timeout_s=1.0)
    p = SamplingParams(n=1)
    pool.submit([Request("a", [1], p, group="g1"), Request("b", [2], p, group="g2"), Request("c", [3], p, group="g3")])
    got = {}
    deadline = time.monotonic() + 120
    while len(got) < 2 and time.monotonic() < deadline:
        for f in pool.wait(0.5):
            got[f.rid] = f.output.output_ids
    assert pool.restarts == 1 and len(made) == 2
    assert resynced == [[made[1]]]  # the new engine got the trainer's weights before generating
    assert got == {"a": [1], "b": [2]}  # the hung engine's requests were submitted again, nothing lost
    left = pool.abort()
    assert [(f.rid, f.output.finish_reason) for f in left] == [("c", "abort")] and pool.outstanding == 0
    for h in made:
        ray.kill(h)
