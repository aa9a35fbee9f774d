"""A driver for test_resume's SIGTERM test: ``megatron_dapo.train.main`` with a Trainer whose
``run`` starts a local Ray, re-installs the SIGTERM handler as ``Trainer.run`` does after
``ray.init``, prints ``blocking`` and waits in ``ray.get`` on a task that sleeps: the state a
driver is in for most of a run. Its ``cluster.shutdown`` writes the file named by argv[1].

    python tests/e2e/sigterm_driver.py MARKER HF_CONFIG_DIR
"""

from __future__ import annotations

import sys
import time

import ray

from megatron_dapo import train


class _Cluster:
    def __init__(self, marker: str):
        self.marker = marker

    def shutdown(self, engine_handles=()):
        with open(self.marker, "w") as f:
            f.write("shutdown\n")


class BlockingTrainer:
    def __init__(self, cfg, checks=None):
        self.cluster = None

    def run(self):
        ray.init(address="local", num_cpus=1, include_dashboard=False)  # never a stray cluster
        train.stop_on_sigterm()
        self.cluster = _Cluster(sys.argv[1])

        @ray.remote
        def sleep(seconds):
            time.sleep(seconds)

        ref = sleep.remote(300)
        print("blocking", flush=True)
        ray.get(ref)


if __name__ == "__main__":
    train.Trainer = BlockingTrainer
    # the HF dir holds only config.json (no weights, no tokenizer): what is tested here is the
    # SIGTERM path, not the checks before launch (tests/launch/test_preflight.py)
    train.check_before_launch = lambda cfg, arch: None  # the name train.main calls
    with open("prompts.jsonl", "w") as f:  # in the working directory; never read
        f.write("{}\n")
    sys.exit(
        train.main(
            [
                "--hf-checkpoint",
                sys.argv[2],
                "--prompt-data",
                "prompts.jsonl",
                "--max-prompt-length",
                "16",
                "--max-response-length",
                "16",
                "--overlong-buffer-length",
                "4",
            ]
        )
    )
