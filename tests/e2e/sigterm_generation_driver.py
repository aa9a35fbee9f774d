"""A driver for test_sigterm_generation: ``megatron_dapo.train.main`` (flags parsed, validated and
preflight-checked on a real tiny model) with a Trainer whose ``run`` starts a local Ray, builds
the driver's real :class:`EnginePool` over two engine actors whose generation takes an hour
(``poll`` never answers), prints ``generating PID PID`` and waits for requests as
``RolloutManager.collect`` does (``EnginePool.wait``). SIGTERM must end it within seconds: ``main``'s cleanup
kills the engine actors (``Cluster.shutdown``), then exit code 143. The stand-in cluster's
``shutdown`` kills the actors as the real one does and writes the file named by argv[1].

    python tests/e2e/sigterm_generation_driver.py MARKER HF_DIR PROMPTS RUN_DIR
"""

from __future__ import annotations

import os
import sys
import time

import ray

from megatron_dapo import train
from megatron_dapo.driver.rollout_manager import EnginePool
from megatron_dapo.rollout.base import Request, SamplingParams

GENERATION_S = 3600.0


@ray.remote(num_cpus=0)
class SlowEngine:
    """An engine whose generation round never ends by itself within the test."""

    def pid(self) -> int:
        return os.getpid()

    def submit(self, requests) -> None:
        pass

    def poll(self, timeout_s):
        time.sleep(GENERATION_S)
        return []

    def abort_requests(self, rids=None):
        return []


class _Cluster:
    def __init__(self, marker: str):
        self.marker = marker

    def shutdown(self, engine_handles=()):
        for h in engine_handles:
            ray.kill(h)
        with open(self.marker, "w") as f:
            f.write(f"shutdown {len(engine_handles)} engines\n")


class GeneratingTrainer:
    def __init__(self, cfg, checks=None):
        self.cfg = cfg
        self.cluster = None
        self.engines = None

    def run(self):
        ray.init(address="local", num_cpus=2, include_dashboard=False)  # never a stray cluster
        train.stop_on_sigterm()  # as Trainer.run does once Ray is up
        self.cluster = _Cluster(sys.argv[1])
        self.engines = EnginePool(lambda i: SlowEngine.remote(), 2, resync=lambda handles: None, timeout_s=7200)
        pids = ray.get([h.pid.remote() for h in self.engines.handles])
        params = SamplingParams(max_new_tokens=8)
        self.engines.submit([Request(f"{g}.{j}", [1, 2, 3], params, group=str(g)) for g in range(4) for j in range(2)])
        print("generating", *pids, flush=True)
        while not self.engines.wait(5.0):
            pass
        raise AssertionError("the generation ended by itself")


if __name__ == "__main__":
    train.Trainer = GeneratingTrainer
    marker, hf, prompts, run_dir = sys.argv[1:5]
    sys.exit(
        train.main(
            [
                "--hf-checkpoint",
                hf,
                "--prompt-data",
                prompts,
                "--run-dir",
                run_dir,
                "--wandb-mode",
                "disabled",
                "--max-prompt-length",
                "64",
                "--max-response-length",
                "12",
                "--overlong-buffer-length",
                "4",
            ]
        )
    )
