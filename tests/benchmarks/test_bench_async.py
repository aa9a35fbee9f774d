"""benchmarks/bench_async.py's simulation (issue 40): its engine's timing by hand, the admission
rule holding in the bounded mode, and the synchronous modes' staleness."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_async", os.path.join(ROOT, "benchmarks", "bench_async.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_async"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_an_engine_decodes_by_continuous_batching_as_stated(bench):
    m = dataclasses.replace(bench.MODELS[0], t0=0.01, a=0.001, prefill_s_per_token=0.0)
    e = bench.Engine(m)
    e.start(0.0, 1, 100)  # alone: 100 decode steps of 0.011 s
    assert e.next_end() == pytest.approx(100 * 0.011)
    e.start(0.5, 2, 10)  # at 0.5 s a second one joins: both now at 0.012 s per step
    done_first = 0.5 / 0.011  # tokens the first had made by then
    assert e.next_end() == pytest.approx(0.5 + 10 * 0.012)
    assert e.pop_end() == 2
    assert e.next_end() == pytest.approx(0.5 + 10 * 0.012 + (100 - done_first - 10) * 0.011)
    e.pause(e.t, 2.0)  # a weight broadcast: nothing decodes for 2 s
    assert e.next_end() == pytest.approx(0.5 + 10 * 0.012 + 2.0 + (100 - done_first - 10) * 0.011)


def test_bounded_mode_trains_nothing_older_than_k_and_the_synchronous_modes_are_exact(bench, monkeypatch):
    monkeypatch.setattr(bench, "GROUPS", 24)  # a small step: the rule, not the numbers
    m = dataclasses.replace(bench.MODELS[1], gpus=16)
    for k in (0, 1, 2):
        r = bench.bounded(m, k, 8, steps=4, seed=1)
        assert r["tps"] > 0 and sum(r["stale"].values()) == 4 * 24
        assert max(r["stale"]) <= k, (k, r["stale"])
    assert bench.colocated_sync(m, 2, 1)["stale"] == {0: 48}
    assert bench.one_step_off(m, 8, 2, 1)["stale"] == {1: 48}
