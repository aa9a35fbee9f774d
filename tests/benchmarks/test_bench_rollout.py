"""benchmarks/bench_rollout.py: the simulated engines keep the streaming contract on one virtual
clock with the stated decode cost (t0 + a * c per step, prefill per token), the trainable
tokens are counted by the trainer's rule, and the --small run prints its last line."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_rollout as B  # noqa: E402

from megatron_dapo.config import parse_args  # noqa: E402
from megatron_dapo.driver.batch import Sample  # noqa: E402
from megatron_dapo.rollout.base import Request, SamplingParams  # noqa: E402

P = 2  # prompt tokens


class FixedWork:
    """Samples of the given lengths, in order (all right)."""

    def __init__(self, lengths, max_len=64):
        self.lengths, self.max_len, self.samples = list(lengths), max_len, []

    def new_sample(self, prompt):
        self.samples.append((self.lengths[len(self.samples)], True))
        return len(self.samples) - 1


def _sim(lengths, t0=1.0, c=0.5, prefill=0.0, group=1):
    return B.Sim(FixedWork(lengths), P, group, t0, c, prefill)


def _req(rid, prefix=(), max_new=64):
    return Request(rid, [0, 7] + list(prefix), SamplingParams(max_new_tokens=max_new))


def test_a_decode_step_costs_t0_plus_a_c_and_streaming_returns_each_request_when_it_ends():
    sim = _sim([2, 4])
    e = B.SimEngine(sim, slots=8, blocking=False, abortable=True)
    e.submit([_req("a"), _req("b")])
    # two sequences: steps of 1 + 2 * 0.5 = 2; "a" ends after 2 steps (t = 4), then "b" alone
    # at 1.5 a step for 2 more (t = 7)
    (a,) = e.poll(1.0)
    assert (a.rid, len(a.output.output_ids), a.output.finish_reason, a.finished_at) == ("a", 2, "stop", 4.0)
    (b,) = e.poll(1.0)
    assert (b.rid, len(b.output.output_ids), b.finished_at) == ("b", 4, 7.0)
    assert e.poll(1.0) == [] and sim.decoded == 6


def test_a_blocking_chunk_returns_every_request_when_its_longest_ends():
    sim = _sim([2, 4])
    e = B.SimEngine(sim, slots=8, blocking=True, abortable=False)
    e.submit([_req("a"), _req("b")])
    got = e.poll(1.0)
    assert sorted(f.rid for f in got) == ["a", "b"] and sim.now == 7.0
    assert {f.rid: f.finished_at for f in got} == {"a": 4.0, "b": 7.0}


def test_a_waiting_request_takes_a_freed_slot_at_the_next_step_and_pays_its_prefill():
    sim = _sim([2, 3], prefill=0.25, group=2)
    e = B.SimEngine(sim, slots=1, blocking=False, abortable=True)
    e.submit([_req("a"), _req("b")])
    # "a": prefill of its prompt share (P / G = 1 token) 0.25, 2 steps of 1.5 -> ends at 3.25;
    # "b" enters then: 0.25 of prefill and 3 steps of 1.5 -> 8.0
    assert [(f.rid, f.finished_at) for f in e.poll(1.0)] == [("a", 3.25)]
    assert [(f.rid, f.finished_at) for f in e.poll(1.0)] == [("b", 8.0)]


def test_a_continuation_prefills_its_prefix_and_generates_the_rest():
    sim = _sim([], prefill=0.1)
    sim.work.samples.append((6, True))  # sample 0: 6 tokens, 2 of them generated before
    e = B.SimEngine(sim, slots=4, blocking=False, abortable=True)
    e.submit([_req("cont", [B.SAMPLE_BASE + 2 * 0 + 1, 7])])
    (f,) = e.poll(1.0)
    # prefill of the prompt share (P / G = 2) and the 2 prefix tokens: 4 x 0.1; then 4 steps of 1.5
    assert len(f.output.output_ids) == 4 and f.output.finish_reason == "stop"
    assert f.finished_at == pytest.approx(0.4 + 4 * 1.5)


def test_abort_cuts_at_the_instant_or_waits_for_the_end():
    for abortable, want in ((True, (2, "abort", 3.2)), (False, (10, "stop", 15.0))):
        sim = _sim([10], t0=1.0, c=0.5)
        e = B.SimEngine(sim, slots=1, blocking=False, abortable=abortable)
        e.submit([_req("a"), _req("queued")])
        sim.step()  # "a" enters at t = 0; "queued" waits for the slot
        sim.now = 3.2  # two steps of 1.5 done (3.0), the third under way
        got = {f.rid: f for f in e.abort_requests(None)}
        f = got["a"]
        assert (len(f.output.output_ids), f.output.finish_reason, f.finished_at) == want, abortable
        assert got["queued"].output.output_ids == [] and got["queued"].output.finish_reason == "abort"
        assert not e.running and not e.waiting


def test_while_an_abort_waits_for_running_requests_no_engine_starts_a_waiting_one():
    sim = _sim([4, 2, 9])
    e0 = B.SimEngine(sim, slots=1, blocking=False, abortable=False)
    e1 = B.SimEngine(sim, slots=1, blocking=False, abortable=False)
    e0.submit([_req("a")])
    e1.submit([_req("b"), _req("c")])  # "c" waits for "b"'s slot
    sim.step()  # both engines admit at t = 0
    got = e0.abort_requests(["a"])  # runs "a" to its end (t = 6); "b" ended at t = 3 meanwhile
    assert [(f.rid, f.finished_at) for f in got] == [("a", 6.0)]
    assert list(e1.running) == [] and [r.rid for r, _ in e1.waiting] == ["c"]
    assert [f.rid for f in e1.abort_requests(["b", "c"])] == ["c", "b"]


def test_trainable_tokens_follow_the_trainers_weights():
    cfg = parse_args(["--no-progress"])

    def s(n, stale=0, train=True):
        return Sample(0, [1, 2], [5] * n, [-0.5] * n, "stop", "x", train=train, stale_len=stale)

    samples = [s(5), s(4, stale=3), s(6, stale=6), s(3, train=False)]
    assert B.trainable_tokens(samples, cfg.algo, None) == 5 + 4 + 6
    assert B.trainable_tokens(samples, cfg.algo, "mask") == 5 + 1  # stale tokens carry no gradient
    assert B.trainable_tokens(samples, cfg.algo, "correct") == 5 + 4 + 6  # overlong-filtered: none


def test_the_cost_model_follows_the_stated_facts():
    k = B.engine_costs("h100", 3000.0)
    assert k["weights_gb"] == pytest.approx(8.19, abs=0.01) and k["kv_token_kib"] == 32
    assert k["floor"] == pytest.approx(2.445e-3, rel=1e-3)
    assert k["floor"] / k["c"] == pytest.approx(83.3, abs=0.5)  # the weights ~ 80 sequences' KV
    assert B.engine_costs("h200", 3000.0)["floor"] < k["floor"]


def test_small_benchmark_prints_the_table_and_the_last_line(capsys):
    assert B.main(["--small"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("rollout trainable tokens/s, best over blocking chunks: ")
    ratio = float(lines[-1].rsplit(": ", 1)[1])
    for name, *_ in B.KINDS:
        assert any(line.startswith(name + " ") for line in lines), name
    # with a decode floor, streaming and its early abort beat chunks that wait for their tails
    assert ratio > 1.0
