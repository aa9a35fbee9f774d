"""driver/cluster.actor_threads: each actor's CPU threads are the cores shared among the ranks,
capped by OMP_NUM_THREADS where it is set; a malformed value is a user error naming the variable."""

from __future__ import annotations

import pytest

from megatron_dapo.config import ConfigError
from megatron_dapo.driver.cluster import actor_threads
from megatron_dapo.errors import is_user_error, one_line


@pytest.mark.parametrize(
    "cpus,world,omp,want",
    [
        (2.0, 1, None, 2),
        (2.0, 2, None, 1),
        (16.0, 4, None, 4),
        (2.0, 4, None, 1),  # never 0
        (16.0, 4, "1", 1),
        (16.0, 4, "8", 4),
        (2.0, 1, "", 2),
        (2.0, 1, " ", 2),  # a cap, never a raise
    ],
)
def test_cores_shared_among_ranks_capped_by_omp(cpus, world, omp, want):
    assert actor_threads(cpus, world, omp) == want


@pytest.mark.parametrize("omp", ["0", "-2", "two", "1.5"])
def test_a_malformed_omp_num_threads_is_one_line_naming_it(omp):
    with pytest.raises(ConfigError) as e:
        actor_threads(2.0, 1, omp)
    assert is_user_error(e.value)
    msg = one_line(e.value)
    assert msg.startswith(f"OMP_NUM_THREADS={omp!r} is not a positive whole number") and "\n" not in msg
