"""distributed.destroy_parallel frees every group a body made: after a real model, optimizer and
step (megatron TP1 x PP2 on two gloo ranks), the rank has as many gloo TCP loop threads as before.
A group something still holds is never freed, and each one's loop thread wakes every few
milliseconds for the life of the process: the session's pools piled up hundreds of them."""

import pytest

from tests.foundation import bodies
from tests.tiny import tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


def test_a_step_leaves_no_gloo_group_behind(gloo):
    pool = gloo(2)
    before = pool.run(bodies.gloo_loop_threads)
    pool.run(bodies.dp_optimizer_step, tiny_qwen2_config(), 1, 2, False, False)  # the pool destroys after each body
    after = pool.run(bodies.gloo_loop_threads)
    assert after == before, (before, after)
