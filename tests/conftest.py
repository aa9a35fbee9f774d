"""Session-wide fixtures: one gloo pool per world size, started once and reused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Strict collectives for the whole suite (megatron_dapo/platform.py): a collective refuses a
# tensor on the side its group does not reduce on in production (a host tensor to what is NCCL
# on a GPU), which on CPU, all gloo, would pass unseen. Set here, before any pool, driver
# subprocess or Ray cluster starts, so every process the tests start inherits it;
# MEGATRON_DAPO_STRICT_COLLECTIVES=0 turns it off.
os.environ.setdefault("MEGATRON_DAPO_STRICT_COLLECTIVES", "1")

# One CPU thread per process for the whole suite (set before torch is imported here, inherited by
# every subprocess, Ray actor and gloo rank; the driver's actors honour it: driver/cluster.py
# actor_threads). Two xdist workers already fill the two cores, and each test runs several
# torch processes: with two OpenMP threads each, the threads of one op wait for each other on an
# oversubscribed machine (docs/benchmarks.md, "Test suite: time"). OMP_NUM_THREADS set by the caller wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# PyTorch's CPU allocations of 2 MiB or more on transparent huge pages, as the driver's Ray start
# gives its actors (launch/placement.RAY_START_ENV): for the gloo ranks and subprocesses the tests
# start themselves. A tiny model's vocab-sized logits otherwise cost millions of page faults per
# process (docs/benchmarks-log.md, "Page faults"). scripts/run_tests.sh exports it before pytest
# starts, for the pytest processes themselves (PyTorch reads it at its first allocation).
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


class _Pools:
    def __init__(self):
        self._pools = {}

    def __call__(self, world_size: int):
        from tests.harness import GlooPool

        pool = self._pools.get(world_size)
        if pool is not None and pool.alive and pool.worn:
            pool.close()  # its ranks hold many gloo groups that could not be freed (tests/harness.py)
        if pool is None or not pool.alive:
            pool = GlooPool(world_size)
            self._pools[world_size] = pool
        return pool

    def close(self):
        for p in self._pools.values():
            p.close()


@pytest.fixture(scope="session")
def gloo():
    """``gloo(n)`` returns the session's pool of n gloo ranks (see tests/harness.py)."""
    pools = _Pools()
    yield pools
    pools.close()


@pytest.fixture(scope="session", autouse=True)
def _one_ray_cluster_per_session():
    """Tests that run the driver in-process share one local Ray instance (started lazily by
    megatron_dapo.launch.placement.start_ray); it is shut down once at the end."""
    yield
    import sys as _sys

    ray = _sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


# ----------------------------------------------------------------- nothing left in the repository
# A test writes only under its temporary directories. The files that git does not track (and
# that are not caches) are listed when the session starts and when it ends; a path that
# appeared in between fails the session, naming it (a refused `tools/eval.py` once left
# runs/eval/<model>__<data>/ in the working directory).
_CACHES = (
    ".venv",
    ".whl",
    ".pytest_cache",
    "__pycache__",
    ".egg-info",
    ".git",
    ".hypothesis",
    ".mypy_cache",
    ".ruff_cache",
)


def _untracked_paths() -> set:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    paths = set()
    for line in out.splitlines():
        if line[:2] in ("??", "!!"):
            p = line[3:].strip().strip('"')
            if not any(part in _CACHES or part.endswith(".egg-info") for part in Path(p).parts):
                paths.add(p)
    return paths


def _is_xdist_worker(config) -> bool:
    """True inside a pytest-xdist worker (scripts/run_tests.sh runs the suite on two): the
    repository check is the controller's, which sees the whole session."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if not _is_xdist_worker(session.config):
        session.config._repo_untracked_before = _untracked_paths()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_repo_untracked_before", None)
    if before is None or os.environ.get("MEGATRON_DAPO_ALLOW_REPO_WRITES"):
        return
    new = sorted(_untracked_paths() - before)
    if new:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        msg = "tests left files in the repository (a test writes only under its tmp_path): " + ", ".join(new[:20])
        if tr is not None:
            tr.write_line(msg, red=True)
        else:
            print(msg, file=sys.stderr)
        session.exitstatus = 1


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle-files",
        metavar="SEED",
        type=int,
        default=None,
        help="run the test files in an order shuffled with SEED (tests inside a file keep their "
        "order): finds a test that passes only after another file's test set some state",
    )


def _file_of(item) -> str:
    return item.nodeid.split("::")[0]


#: why tests marked `sglang` cannot run on the compatibility stack (the only skip of them: on the
#: primary stack a missing SGLang fails them, so a broken install cannot pass unseen)
SGLANG_NEEDS_PRIMARY = (
    "sglang 0.5.23 pins torch 2.14.1, which the compatibility stack (Python 3.11, torch 2.13.0) does not "
    "carry: the primary stack runs the real-engine tests (README, Install)"
)


def pytest_collection_modifyitems(session, config, items):
    if sys.version_info < (3, 12):
        for item in items:
            if item.get_closest_marker("sglang") is not None:
                item.add_marker(pytest.mark.skip(reason=SGLANG_NEEDS_PRIMARY))
    seed = config.getoption("--shuffle-files")
    if seed is None:
        if _is_xdist_worker(config):
            # Under xdist (--dist loadfile) the controller hands out whole files in this order: the
            # files with a slow test (a driver, Ray or a multi-rank run; marker `slow`) go first, so
            # that the last files to run are short ones and both workers end together.
            slow = {_file_of(item) for item in items if item.get_closest_marker("slow") is not None}
            items.sort(key=lambda item: _file_of(item) not in slow)  # stable: the order within each part is kept
        return
    import random

    files = list(dict.fromkeys(_file_of(item) for item in items))
    random.Random(seed).shuffle(files)
    rank = {f: i for i, f in enumerate(files)}
    items.sort(key=lambda item: rank[_file_of(item)])  # stable: a file's own order is kept
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"test files shuffled with seed {seed}: {' '.join(files[:5])} ...")
