"""The driver's start-up order on a local Ray, in its own process: ``megatron_dapo.train.main``
on a tiny model (CPU, HF engines) with the actor classes wrapped so that the moment the
driver creates its first trainer actor (PolicyActor: it builds model and optimizer at once)
is recorded together with the state of every engine launched so far, read from the engine
itself (``RolloutEngine.is_released``). The run stops right there.

    python tests/launch/startup_order_check.py WORK_DIR

Prints one line ``RESULT {json}``: ``engines_before_trainer`` (per engine launched before
the first trainer actor: the memory tags it had released at that moment), ``num_engines``.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ray  # noqa: E402

from megatron_dapo import train  # noqa: E402
from megatron_dapo.driver import actors  # noqa: E402
from megatron_dapo.rollout.base import MEMORY_TAGS  # noqa: E402

ENGINES = []
RESULT = {}


class StopAtFirstTrainer(Exception):
    pass


def released_tags(actor_self):
    return [t for t in MEMORY_TAGS if actor_self.engine.is_released(t)]


class _Launch:
    def __init__(self, inner):
        self.inner = inner

    def remote(self, *args, **kwargs):
        handle = self.inner.remote(*args, **kwargs)
        ENGINES.append(handle)
        return handle


class RecordingEngineActor:
    def options(self, **kw):
        return _Launch(REAL_ENGINE.options(**kw))


class RecordingPolicyActor:
    def options(self, **kw):
        # the state of each engine launched so far, from the engine (waits until it is up)
        RESULT["engines_before_trainer"] = [ray.get(h.__ray_call__.remote(released_tags), timeout=300) for h in ENGINES]
        raise StopAtFirstTrainer()


REAL_ENGINE = actors.EngineActor


def main(work: str) -> int:
    from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir

    hf = make_tiny_qwen2_dir(os.path.join(work, "hf"))
    prompts = make_prompts(os.path.join(work, "prompts.jsonl"), n=8)
    actors.EngineActor = RecordingEngineActor()
    actors.PolicyActor = RecordingPolicyActor()
    args = [
        "--hf-checkpoint",
        hf,
        "--prompt-data",
        prompts,
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--max-response-length",
        "8",
        "--overlong-buffer-length",
        "4",
        "--max-prompt-length",
        "64",
        "--num-rollout",
        "1",
        "--run-dir",
        os.path.join(work, "run"),
        "--wandb-mode",
        "disabled",
        "--reward-num-workers",
        "1",
        "--actor-num-gpus-per-node",
        "2",
        "--rollout-num-gpus-per-engine",
        "1",
        "--rollout-engine",
        "hf",
    ]
    try:
        train.main(args)
    except StopAtFirstTrainer:
        pass
    finally:
        ray.shutdown()
    RESULT["num_engines"] = 2
    print("RESULT " + json.dumps(RESULT), flush=True)
    return 0 if "engines_before_trainer" in RESULT else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
