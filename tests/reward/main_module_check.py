"""Run as ``python -m tests.reward.main_module_check OUT [main-fn]`` by test_reward_pool.py.

Every process that runs this module's top level (the parent, and a spawned worker that
re-imports the parent's main module) appends its pid to OUT; then the parent scores one item
on a BatchScorer with the built-in mode or, with ``main-fn``, a reward defined here.
"""

import os
import sys

with open(sys.argv[1], "a") as f:
    f.write(f"{os.getpid()}\n")


def exact(response, ground_truth, **_):
    return 1.0 if response.strip().endswith(ground_truth) else -1.0


if __name__ == "__main__":
    from megatron_dapo.reward import BatchScorer

    fn = exact if sys.argv[2:] == ["main-fn"] else None
    with BatchScorer(num_workers=1, timeout_s=60.0, mode="dapo", reward_fn=fn) as pool:
        r = pool.score([("Answer: 7", "7")])[0]
        print(r.reason, r.score, pool.worker_pids[0])
