"""The driver's side of asynchronous training. driver/prefetch.RolloutQueue: the engines
generate ahead of the trainer, never more than the allowed lag, never past a checkpoint step,
never while the driver syncs; a rollout older than the lag when its step comes (the lag was
lowered) is thrown away and its prompts drawn again. driver/batch.interpolate_stale: which
samples skip the proximal forward under --proximal-logprobs interpolate."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from megatron_dapo.driver.prefetch import RolloutQueue

WAIT_S = 30.0  # a generous bound for a thread hand-over on a loaded machine


class FakeManager:
    """``collect(m, version)`` records what it was asked, holds while ``gate`` is clear, and
    returns a rollout whose verified groups name prompts 10*m, 10*m+1."""

    def __init__(self, fail_at=None):
        self.calls: list = []
        self.replayed: list = []
        self.inside = 0  # collections running now
        self.gate = threading.Event()
        self.gate.set()
        self.fail_at = fail_at
        self.lock = threading.Lock()

    def collect(self, m, version):
        with self.lock:
            self.inside += 1
            self.calls.append((m, version))
        try:
            assert self.gate.wait(WAIT_S)
            if m == self.fail_at:
                raise RuntimeError(f"collect {m} failed")
            groups = [SimpleNamespace(samples=[SimpleNamespace(prompt_index=10 * m + i)]) for i in range(2)]
            return SimpleNamespace(step=m, version=version, generated=groups)
        finally:
            with self.lock:
                self.inside -= 1

    def replay(self, prompts):
        self.replayed.append(list(prompts))


def _until(pred, what):
    deadline = time.monotonic() + WAIT_S
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture
def make():
    queues = []

    def _make(**kw):
        mgr = FakeManager(kw.pop("fail_at", None))
        q = RolloutQueue(mgr, **kw)
        queues.append((q, mgr))
        return q, mgr

    yield _make
    for q, mgr in queues:  # also on failure: release and end every producer
        mgr.gate.set()
        q.stop()


def test_the_engines_run_ahead_by_the_lag_and_no_further(make):
    q, mgr = make(version=1, lag=2, limit=10)
    q.start(1)
    _until(lambda: len(mgr.calls) == 3, "steps 1..3")
    time.sleep(0.2)  # time enough to overrun the bound if the rule were broken
    assert mgr.calls == [(1, 1), (2, 1), (3, 1)]  # step 3 is 2 versions old at version 1; step 4 would be 3
    roll, v = q.take(1)
    assert (roll.step, v) == (1, 1)
    q.update(version=2)  # the sync after step 1
    _until(lambda: len(mgr.calls) == 4, "step 4")
    assert mgr.calls[-1] == (4, 2)
    assert [q.take(m)[1] for m in (2, 3, 4)] == [1, 1, 2]  # lags 1, 2, 2 when they train


def test_lag_zero_is_synchronous_and_the_limit_stops_at_a_checkpoint(make):
    q, mgr = make(version=1, lag=0, limit=2)
    q.start(1)
    assert q.take(1)[1] == 1
    time.sleep(0.1)
    assert mgr.calls == [(1, 1)]  # nothing ahead of the trainer at lag 0
    q.update(version=2, lag=3)
    assert q.take(2)[1] == 2
    time.sleep(0.1)
    assert mgr.calls == [(1, 1), (2, 2)]  # step 2 saves: step 3 waits for the checkpoint
    q.update(limit=5)
    _until(lambda: len(mgr.calls) == 5, "steps 3..5")
    assert mgr.calls[2:] == [(3, 2), (4, 2), (5, 2)]


def test_nothing_is_generated_while_the_driver_syncs(make):
    q, mgr = make(version=1, lag=1, limit=10)
    mgr.gate.clear()  # step 1's collection hangs until released
    q.start(1)
    _until(lambda: mgr.inside == 1, "step 1 to start")
    entered = threading.Event()
    seen: list = []  # (collections running, collections asked) at the pause's start and end

    def sync():
        with q.paused():
            entered.set()
            seen.append((mgr.inside, len(mgr.calls)))
            time.sleep(0.1)
            seen.append((mgr.inside, len(mgr.calls)))
            q.update(version=2)

    t = threading.Thread(target=sync)
    t.start()
    time.sleep(0.1)
    assert not entered.is_set()  # the pause waits for the running collection
    mgr.gate.set()
    t.join(WAIT_S)
    assert entered.is_set() and not t.is_alive()
    assert seen == [(0, 1), (0, 1)]  # nothing ran or started while paused
    _until(lambda: len(mgr.calls) == 3, "steps 2..3")
    assert mgr.calls == [(1, 1), (2, 2), (3, 2)]  # generated after the sync, with its version


def test_a_rollout_older_than_the_lowered_lag_is_regenerated_from_its_prompts(make):
    q, mgr = make(version=1, lag=2, limit=10)
    q.start(1)
    _until(lambda: len(mgr.calls) == 3, "steps 1..3")
    q.take(1)
    with q.paused():
        q.update(version=2, lag=0)  # the sync after step 1; the controller drops the lag to 0
    # steps 2 and 3 were generated at version 1: 1 and 2 versions old at their steps, both above 0
    roll, v = q.take(2)
    assert (roll.step, v) == (2, 2) and q.regenerated == 2
    assert mgr.replayed == [[20, 21, 30, 31]]  # their prompts are drawn again, in order
    assert mgr.calls[3] == (2, 2)
    time.sleep(0.1)
    assert len(mgr.calls) == 4  # lag 0: nothing ahead of step 2
    assert q.queued() == {}


def test_a_failed_collection_is_raised_at_its_step_and_ends_the_producer(make):
    q, mgr = make(version=1, lag=2, limit=10, fail_at=2)
    q.start(1)
    assert q.take(1)[1] == 1
    with pytest.raises(RuntimeError, match="collect 2 failed"):
        q.take(2)
    time.sleep(0.1)
    assert [m for m, _ in mgr.calls] == [1, 2]  # nothing after the failure


def test_interpolate_skips_the_forward_of_stale_samples_only():
    """--proximal-logprobs interpolate (driver/batch.interpolate_stale): a sample generated under
    older weights gets the engine's logprobs as old logprobs and A-3PO's alpha = lag / (lag + 1)
    per token; a sample with a token of the current weights, or without a version or an engine
    logprob per token, still needs megatron's forward."""
    from megatron_dapo.driver.batch import Sample, interpolate_stale

    def sample(versions, eng):
        n = len(versions) if versions else 2
        return Sample(0, [1], list(range(n)), eng, "stop", "1", token_versions=versions)

    lag1 = sample([4, 4], [-0.5, -1.0])
    lag3 = sample([2, 2], [-0.1, -0.2])
    fresh = sample([5, 5], [-0.3, -0.3])
    mixed = sample([4, 5], [-0.3, -0.3])
    unstamped = sample(None, [-0.3, -0.3])
    short = sample([4, 4], [-0.3])  # an engine logprob missing
    need = interpolate_stale([lag1, lag3, fresh, mixed, unstamped, short], step=5)
    assert need == [fresh, mixed, unstamped, short]
    assert lag1.old_logprobs == [-0.5, -1.0] and lag1.prox_alpha == [0.5, 0.5]
    assert lag3.old_logprobs == [-0.1, -0.2] and lag3.prox_alpha == [0.75, 0.75]
    assert all(s.prox_alpha is None and s.old_logprobs is None for s in need)
    item = lag3.to_item()
    assert item.prox_alpha.tolist() == [0.75, 0.75] and item.old_logprobs.tolist() == pytest.approx([-0.1, -0.2])


def test_interpolate_without_asynchronous_training_is_refused_in_one_line():
    from megatron_dapo.config import ConfigError, parse_args
    from megatron_dapo.config.validate import check_async

    with pytest.raises(ConfigError, match="--proximal-logprobs interpolate approximates .* set --async-mode"):
        check_async(parse_args(["--hf-checkpoint", "x", "--proximal-logprobs", "interpolate"]), on_gpu=False)
    check_async(
        parse_args(["--hf-checkpoint", "x", "--proximal-logprobs", "interpolate", "--async-mode", "bounded"]),
        on_gpu=False,
    )
