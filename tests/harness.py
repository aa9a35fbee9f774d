"""Run a test body on N gloo ranks (CPU), with processes started once per test session.

``GlooPool(world_size)`` spawns ``world_size`` worker processes that join one gloo default
group and then wait for tasks. ``pool.run(fn, *args)`` runs ``fn(*args)`` on every rank
(``fn`` must be a module-level function, so that it pickles by name) and returns the list of
per-rank results. A body that raises on any rank fails the call with that rank's traceback;
a body that does not finish within ``timeout`` kills the pool (a hang fails the test, not
CI) and the next call starts a fresh one.

After each body a rank destroys its parallel state and its process groups
(``distributed.destroy_parallel``) and reports how many gloo TCP loop threads it still has (one
per live gloo group; each wakes every few milliseconds for the life of the process). A group
that something still holds (measured: a MoE model's step on megatron-core 0.16.1 leaves 16 per
rank) cannot be freed, so more than ``RECYCLE_AFTER_LOOPS`` on a rank retire the pool at the
next ``gloo(n)`` of conftest (tests that hold a pool keep it for the rest of the test).

The ranks are forked from multiprocessing's fork server, which imports torch, megatron-core and
megatron_dapo's distributed helpers once (:data:`PRELOAD`) before it forks any rank: a rank then
starts without paying those imports again (about 4 CPU-s each on the 2-core test machine;
docs/benchmarks.md, "Test suite: time"). The fork server is a fresh interpreter, started once per
test process, that has run nothing but those imports: no thread, no gloo group, no OpenMP pool
is there to be copied into a rank. It inherits the environment of the process that first starts
a pool; ``GLOO_POOL_START=spawn`` starts the ranks as fresh interpreters instead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import traceback

from megatron_dapo.distributed import free_port

RECYCLE_AFTER_LOOPS = 64  # gloo TCP loop threads on one rank after a body: start a fresh pool
#: What the fork server imports before it forks the ranks (module doc).
PRELOAD = ["torch", "megatron_dapo.distributed", "megatron.core", "megatron.core.parallel_state"]


def _context():
    method = os.environ.get("GLOO_POOL_START", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"GLOO_POOL_START must be forkserver or spawn, got {method!r}")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def gloo_loop_threads() -> int:
    """This process's threads named ``gloo_tcp*`` (0 where /proc is not there)."""
    n = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for t in tasks:
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().startswith("gloo_tcp")
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def _worker(rank: int, world: int, port: int, tasks, results) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from megatron_dapo.distributed import init_distributed

    try:
        init_distributed(rank=rank, world_size=world, master_port=port, timeout_s=900)
        results.put((rank, "ready", None))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        return
    while True:
        item = tasks.get()
        if item is None:
            break
        task_id, fn, args, kwargs = item
        try:
            status, value = "ok", fn(*args, **kwargs)
        except BaseException:
            status, value = "error", traceback.format_exc()
        try:
            from megatron_dapo.distributed import destroy_parallel

            destroy_parallel()
        except Exception:
            pass
        results.put((rank, task_id, (status, value, gloo_loop_threads())))


class GlooPool:
    def __init__(self, world_size: int, start_timeout: float = 300.0):
        self.world_size = world_size
        ctx = _context()
        port = free_port()
        self._tasks = [ctx.Queue() for _ in range(world_size)]
        self._results = ctx.Queue()
        self._procs = [
            ctx.Process(target=_worker, args=(r, world_size, port, self._tasks[r], self._results), daemon=True)
            for r in range(world_size)
        ]
        for p in self._procs:
            p.start()
        self._next_id = 0
        self.gloo_loops = 0  # the most gloo loop threads a rank reported after the last body
        ready = 0
        while ready < world_size:
            rank, tag, payload = self._get(start_timeout)
            if tag == "error":
                self.close()
                raise RuntimeError(f"gloo rank {rank} failed to start:\n{payload}")
            ready += 1

    @property
    def alive(self) -> bool:
        return all(p.is_alive() for p in self._procs)

    @property
    def worn(self) -> bool:
        """Held gloo groups piled up on a rank (module doc): time for a fresh pool."""
        return self.gloo_loops > RECYCLE_AFTER_LOOPS

    def _get(self, timeout: float):
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            self.close()
            raise TimeoutError(
                f"gloo pool of {self.world_size} ranks did not answer within {timeout:.0f}s (killed)"
            ) from None

    def run(self, fn, *args, timeout: float = 300.0, **kwargs) -> list:
        if not self.alive:
            raise RuntimeError("gloo pool is dead")
        task_id = self._next_id
        self._next_id += 1
        self.gloo_loops = 0
        for q in self._tasks:
            q.put((task_id, fn, args, kwargs))
        out: dict[int, object] = {}
        errors = {}
        while len(out) + len(errors) < self.world_size:
            rank, tid, payload = self._get(timeout)
            if tid != task_id:
                continue
            status, value, loops = payload
            self.gloo_loops = max(self.gloo_loops, loops)
            if status == "ok":
                out[rank] = value
            else:
                errors[rank] = value
                # Other ranks may now block in a collective forever: kill the pool.
                self.close()
                break
        if errors:
            rank = min(errors)
            raise AssertionError(f"test body failed on gloo rank {rank}:\n{errors[rank]}")
        return [out[r] for r in range(self.world_size)]

    def close(self) -> None:
        for q in self._tasks:
            try:
                q.put_nowait(None)
            except Exception:
                pass
        for p in self._procs:
            p.join(timeout=2)
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=5)
