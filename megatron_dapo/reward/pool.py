"""A process-pool batch scorer whose per-item timeout really fires.

Each worker is a process we start and own (never threads, never a plain executor: neither
can stop a stuck sympy call). A worker that overruns its item's deadline is SIGKILLed and
replaced; its item scores -1 with reason "timeout" and the batch goes on. A worker that
dies (e.g. it hit its memory cap inside C code) is replaced too; its item gets "error".
Workers run under RLIMIT_AS so a runaway expression cannot eat the machine before the
timeout fires; a MemoryError inside a worker is reported as reason "error".

Processes use the "spawn" start method by default (the trainer holds torch and threads;
forking it is unsafe). As with any spawn pool, a script that creates a BatchScorer must
guard its entry point with ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from .result import RewardResult, check_ground_truth, incorrect

_READY = "__ready__"


def _apply_memory_limit(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    import resource

    limit = int(memory_limit_mb) * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _build_scorer(mode: str, reward_fn: Any, eos_text: str | None) -> Callable[[str, str], RewardResult]:
    if reward_fn is None:
        from .api import compute_score

        if mode == "math":  # import sympy and warm caches before the first timed item
            compute_score("Answer: \\frac{1}{2}", "0.5", mode="math")
        return lambda response, gt: compute_score(response, gt, mode=mode, eos_text=eos_text)
    from .plugins import load_reward_fn, wrap_reward_fn

    fn = load_reward_fn(reward_fn) if isinstance(reward_fn, str) else wrap_reward_fn(reward_fn)
    return lambda response, gt: fn(response, gt)


def _worker_main(conn, mode: str, reward_fn: Any, eos_text: str | None, memory_limit_mb: int | None) -> None:
    """Worker loop: receive (index, response, ground_truth), send (index, RewardResult)."""
    try:
        score = _build_scorer(mode, reward_fn, eos_text)
        _apply_memory_limit(memory_limit_mb)
    except BaseException as exc:  # report the failure to start, then exit
        conn.send(("__failed__", f"{type(exc).__name__}: {exc}"))
        return
    conn.send((_READY, os.getpid()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        index, response, ground_truth = msg
        try:
            result = score(response, ground_truth)
        except MemoryError:
            result = incorrect("error", error="MemoryError (worker memory cap reached)")
        except RecursionError:
            result = incorrect("error", error="RecursionError")
        except Exception as exc:  # noqa: BLE001 - any scoring failure is an "error" item
            result = incorrect("error", error=f"{type(exc).__name__}: {exc}"[:500])
        try:
            conn.send((index, result))
        except MemoryError:
            conn.send((index, incorrect("error", error="MemoryError while sending result")))


class _Worker:
    """One worker process and its end of the pipe."""

    def __init__(self, ctx, args: tuple) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,) + args, daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.started_at = time.monotonic()

    def kill(self) -> None:
        try:
            self.proc.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
        self.proc.join(timeout=5)
        self.conn.close()


class BatchScorer:
    """Score (response, ground_truth) pairs on a pool of worker processes.

    Args:
        num_workers: pool size (default: min(4, cpu count)).
        timeout_s: per-item wall-clock budget inside a worker; an item that overruns is
            scored -1 with reason "timeout" and its worker is killed and replaced.
        memory_limit_mb: RLIMIT_AS cap of each worker in MiB (None/0: no cap).
        mode: built-in scoring mode ("dapo" or "math") when `reward_fn` is None.
        reward_fn: a "package.module:function" spec (or a picklable callable) with the
            signature documented in `megatron_dapo.reward.plugins`.
        eos_text: end-of-sequence text to strip in the built-in modes.
        start_method: "spawn" (default) or "forkserver".
        startup_timeout_s: how long a (re)started worker may take to become ready.

    The pool starts once, in the constructor, and is reused by every `score` call. Use it
    as a context manager or call `close()`.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        timeout_s: float = 10.0,
        memory_limit_mb: int | None = 2048,
        mode: str = "dapo",
        reward_fn: Any = None,
        eos_text: str | None = None,
        start_method: str = "spawn",
        startup_timeout_s: float = 120.0,
    ) -> None:
        if mode not in ("dapo", "math"):
            raise ValueError(f"mode must be 'dapo' or 'math', got {mode!r}")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError("start_method must be 'spawn' or 'forkserver' (fork is unsafe in the trainer)")
        if timeout_s is None or timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if isinstance(reward_fn, str):
            from .plugins import load_reward_fn

            load_reward_fn(reward_fn)  # fail fast here rather than in every worker
        self.num_workers = int(num_workers or min(4, os.cpu_count() or 1))
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._args = (mode, reward_fn, eos_text, memory_limit_mb)
        self._ctx = mp.get_context(start_method)
        self._lock = threading.Lock()
        self._closed = False
        #: How many workers were killed for overrunning, and how many died on their own.
        self.timeouts = 0
        self.crashes = 0
        self._workers = [_Worker(self._ctx, self._args) for _ in range(self.num_workers)]

    # -- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> "BatchScorer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def close(self) -> None:
        """Stop every worker (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for worker in self._workers:
            try:
                worker.conn.send(None)
            except Exception:  # noqa: BLE001 - already dead
                pass
        deadline = time.monotonic() + 5
        for worker in self._workers:
            worker.proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if worker.proc.is_alive():
                worker.kill()
            else:
                worker.conn.close()
        self._workers = []

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the current workers (changes when a worker is replaced)."""
        return [w.proc.pid for w in self._workers]

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self._ctx, self._args)

    # -- scoring -----------------------------------------------------------------------
    def score(self, items: Sequence[tuple[str, str]]) -> list[RewardResult]:
        """Score every (response, ground_truth) pair; results come back in input order.

        Every ground truth is validated first (ValueError naming `ground_truth` for an
        empty, None or non-string one), so a bad batch fails loudly before any work.
        """
        if self._closed:
            raise RuntimeError("BatchScorer is closed")
        items = list(items)
        for i, item in enumerate(items):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise ValueError(f"item {i} must be a (response, ground_truth) pair, got {item!r:.80}")
            try:
                check_ground_truth(item[1])
            except ValueError as exc:
                raise ValueError(f"item {i}: {exc}") from None
        with self._lock:
            return self._run(items)

    def _run(self, items: list) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        busy: dict[_Worker, tuple[int, float]] = {}
        while pending or busy:
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.ready and worker not in busy and pending:
                    index = pending.popleft()
                    response = items[index][0]
                    if not isinstance(response, str):
                        results[index] = incorrect("error", error=f"response is {type(response).__name__}, not str")
                        continue
                    try:
                        worker.conn.send((index, response, items[index][1]))
                    except (OSError, ValueError):
                        pending.appendleft(index)
                        self.crashes += 1
                        self._replace(worker)
                        continue
                    busy[worker] = (index, now + self.timeout_s)
            if not pending and not busy:
                break
            deadlines = [d for _, d in busy.values()]
            deadlines += [w.started_at + self.startup_timeout_s for w in self._workers if not w.ready]
            wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            ready_conns = wait([w.conn for w in self._workers], timeout=wait_s)
            by_conn = {w.conn: w for w in self._workers}
            for conn in ready_conns:
                worker = by_conn[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    self._on_death(worker, busy, results, pending)
                    continue
                if msg[0] == _READY:
                    worker.ready = True
                elif msg[0] == "__failed__":
                    self.close()
                    raise RuntimeError(f"reward worker failed to start: {msg[1]}")
                else:
                    index, result = msg
                    busy.pop(worker, None)
                    results[index] = result
            now = time.monotonic()
            for worker, (index, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(worker)
                    results[index] = incorrect("timeout", error=f"scoring exceeded {self.timeout_s:g} s")
                    self.timeouts += 1
                    self._replace(worker)
            for worker in list(self._workers):
                if not worker.ready and now - worker.started_at > self.startup_timeout_s:
                    self.close()
                    raise RuntimeError(f"reward worker did not start within {self.startup_timeout_s:g} s")
        return results  # type: ignore[return-value]

    def _on_death(self, worker: _Worker, busy: dict, results: list, pending: deque) -> None:
        """A worker's pipe closed: score its item as an error and start a replacement."""
        self.crashes += 1
        if worker in busy:
            index, _ = busy.pop(worker)
            code = worker.proc.exitcode
            results[index] = incorrect("error", error=f"worker died (exit code {code})")
        elif not worker.ready:
            # Died while starting (e.g. memory cap far too low): do not loop forever.
            self.close()
            raise RuntimeError("reward worker died while starting; is memory_limit_mb too low?")
        self._replace(worker)
