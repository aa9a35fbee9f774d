"""distributed.destroy_parallel frees every group a body made: after a real model, optimizer and
step (megatron TP1 x PP2 on two gloo ranks), the rank has as many gloo TCP loop threads as before.
A group something still holds is never freed, and each one's loop thread wakes every few
milliseconds for the life of the process: the session's pools piled up hundreds of them. Where a
body does hold groups, the pool reports it and conftest's ``gloo(n)`` starts a fresh one."""

import os

import pytest

from tests.foundation import bodies
from tests.harness import RECYCLE_AFTER_LOOPS, gloo_loop_threads
from tests.tiny import tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


def test_a_step_leaves_no_gloo_group_behind(gloo):
    pool = gloo(2)
    before = pool.run(gloo_loop_threads)
    pool.run(bodies.dp_optimizer_step, tiny_qwen2_config(), 1, 2, False, False)  # the pool destroys after each body
    after = pool.run(gloo_loop_threads)
    assert after == before, (before, after)
    assert pool.gloo_loops == max(after) and not pool.worn


def test_a_pool_whose_ranks_hold_groups_is_replaced(gloo):
    pool = gloo(2)
    pids = pool.run(os.getpid)
    assert gloo(2) is pool  # reused while it holds nothing
    pool.run(bodies.hold_new_groups, RECYCLE_AFTER_LOOPS + 1)
    assert pool.worn and pool.gloo_loops > RECYCLE_AFTER_LOOPS
    fresh = gloo(2)
    assert fresh is not pool and not pool.alive  # the worn pool's processes have ended
    assert set(fresh.run(os.getpid)).isdisjoint(pids) and fresh.run(gloo_loop_threads) == [1, 1]
