"""benchmarks/bench_rollout.py: the simulated engines keep the EnginePool's contract, and the
benchmark runs the real rollout manager with and without --partial-rollout."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_rollout as B  # noqa: E402
from megatron_dapo.rollout.base import GenerationOutput  # noqa: E402


def _outs(lengths):
    return [[GenerationOutput([0, 7], [7] * n, [-0.5] * n, "stop") for n in lengths]]


def test_decode_steps_cost_the_token_rate_with_a_latency_floor():
    pool = B.SimPool(None, 1, token_rate=1.0, step_latency=1.0)
    outs = _outs([2, 4])
    # 2 steps with 2 sequences (2 units each), then 2 steps with 1 (1 unit each)
    assert pool._duration(outs) == 6.0
    assert [pool._steps_by(outs, t) for t in (0.0, 1.9, 2.0, 4.0, 5.0, 6.0, 9.0)] == [0, 0, 1, 2, 3, 4, 4]
    cut = pool._cut(outs, 3)[0]
    assert [len(o.output_ids) for o in cut] == [2, 3] and [o.finish_reason for o in cut] == ["stop", "abort"]
    # no latency floor: time is proportional to the tokens
    assert B.SimPool(None, 1, token_rate=2.0, step_latency=0.0)._duration(outs) == 3.0


def test_aborted_chunks_reach_on_leftover_and_queued_ones_come_back_empty():
    work = B.Workload(4, seed=0, median=8.0, sigma=0.5, max_len=64, a=1.0, b=1.0)
    pool = B.SimPool(work, 1, token_rate=4.0, step_latency=0.0)
    from megatron_dapo.rollout.base import SamplingParams

    params = SamplingParams(max_new_tokens=64, n=2)
    chunks = [([[i, 7]], params) for i in range(3)]
    seen, left = [], []
    pool.run_chunks(chunks, lambda k, outs: seen.append(k) or True, ordered=False,
                    on_leftover=lambda k, outs: left.append((k, outs)))
    # one engine: chunk 0 finishes and fills the batch; chunk 1 was never started (one at a time)
    assert seen == [0] and [k for k, _ in left] == [1, 2] and all(o is None for _, o in left)


def test_small_benchmark_prints_both_lines(capsys):
    assert B.main(["--small"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("partial rollout speedup: ")
    gen = lines[-2].split()
    assert lines[-2].startswith("generated/kept samples: ")
    without, with_partial = float(gen[2]), float(gen[4])
    # partial rollout keeps the aborted samples: fewer responses generated per kept one
    assert with_partial < without
    float(lines[-1].split(": ")[1])
