"""A process-pool batch scorer whose per-item timeout really fires.

Each worker is a process we start and own (never threads, never a plain executor: neither
can stop a stuck sympy call). A worker that overruns its item's deadline is SIGKILLed and
replaced; its item scores -1 with reason "timeout" and the batch goes on. A worker that
dies (e.g. it hit its memory cap inside C code) is replaced too; its item gets "error".
Workers run under RLIMIT_AS so a runaway expression cannot eat the machine before the
timeout fires; a MemoryError inside a worker is reported as reason "error".

Each item is a `RewardInput` (prompt, response, label, data source, metadata) or a
``(response, label)`` pair; a `RewardRouter` picks its reward by data source. Rewards that
are Python functions (the built-in checkers, ``package.module:function``) run in the
workers; remote reward models (``http(s)://...``) are scored in batches by
`megatron_dapo.reward.remote` on a thread of the calling process, while the workers score
the rest.

Processes use the "spawn" start method by default (the trainer holds torch and threads;
forking it is unsafe). As with any spawn pool, a script that creates a BatchScorer must
guard its entry point with ``if __name__ == "__main__":``. A spawned worker re-runs the
parent's main module only where the reward specs need it (they pickle by reference to
``__main__``: a reward function defined there); otherwise it would repeat the main module's
imports for nothing (for the driver, ``python -m megatron_dapo.train``, torch: about 1.5 s of
CPU and 300 MB per worker).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import types
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from .api import RewardInput, as_reward_input, compute_score, reward_mode
from .plugins import RewardRouter, load_reward_fn, spec_kind, wrap_reward_fn
from .remote import RemoteRewardModel
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


def _build_scorer(spec: Any, eos_text: str | None) -> Callable[[RewardInput], RewardResult]:
    """The scoring function of one local reward spec (a built-in checker or a function)."""
    if spec_kind(spec) == "builtin":
        mode = reward_mode(spec)
        if mode.warmup is not None:  # e.g. import sympy and warm caches before the first timed item
            mode.warmup()
        return lambda inp: compute_score(inp.response, inp.label, mode=spec, eos_text=eos_text)
    fn = load_reward_fn(spec) if isinstance(spec, str) else wrap_reward_fn(spec)
    return lambda inp: fn(
        inp.response, inp.label, prompt=inp.prompt, data_source=inp.data_source, extra_info=dict(inp.metadata)
    )


def _worker_main(conn, specs: dict, eos_text: str | None, memory_limit_mb: int | None) -> None:
    """Worker loop: receive (index, spec key, RewardInput), send (index, RewardResult)."""
    try:
        scorers = {key: _build_scorer(spec, eos_text) for key, spec in specs.items()}
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
        index, key, inp = msg
        try:
            result = scorers[key](inp)
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


def needs_main_module(specs: Any) -> bool:
    """Whether a worker must import the parent's ``__main__``: something in the reward specs is
    pickled by reference to it (a function, a class instance, a partial of one defined there).
    String specs and the built-in modes import their own modules."""
    try:
        return b"__main__" in pickle.dumps(specs)
    except Exception:  # noqa: BLE001 - unpicklable: the worker's start reports it, as before
        return True


@contextlib.contextmanager
def _main_module_hidden(hide: bool):
    """While a process starts: ``multiprocessing`` reads ``sys.modules["__main__"]`` to tell the
    spawned child which main module to re-run (its ``__spec__`` name or its ``__file__``); a
    bare module named ``__main__`` there tells it none, as for an interactive session."""
    if not hide or "__main__" not in sys.modules:
        yield
        return
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _Worker:
    """One worker process and its end of the pipe."""

    def __init__(self, ctx, args: tuple, hide_main: bool) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,) + args, daemon=True)
        with _main_module_hidden(hide_main):
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
    """Score samples (`RewardInput` records or (response, ground_truth) pairs) on a pool of
    worker processes, each with the reward of its data source.

    Args:
        num_workers: pool size (default: min(4, cpu count)).
        timeout_s: per-item wall-clock budget inside a worker; an item that overruns is
            scored -1 with reason "timeout" and its worker is killed and replaced.
        memory_limit_mb: RLIMIT_AS cap of each worker in MiB (None/0: no cap).
        mode: built-in scoring mode (a name of ``api.REWARD_MODES``: "dapo", "math") when
            `reward_fn` is None.
        reward_fn: the default reward instead of `mode`: a "package.module:function" spec
            (or a picklable callable) with the signature documented in
            `megatron_dapo.reward.plugins`, or the URL of a remote reward model.
        sources: per data source rewards, ``{source: spec}`` or ``["SOURCE=SPEC", ...]``;
            a spec is a reward mode ("dapo", "math"), "package.module:function" or an http(s) URL.
        remote_timeout_s, remote_max_retries, remote_batch_size: the remote reward
            models' request budget, retries and records per request
            (`megatron_dapo.reward.remote.RemoteRewardModel`).
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
        sources: Any = None,
        remote_timeout_s: float = 30.0,
        remote_max_retries: int = 3,
        remote_batch_size: int = 64,
    ) -> None:
        if start_method not in ("spawn", "forkserver"):
            raise ValueError("start_method must be 'spawn' or 'forkserver' (fork is unsafe in the trainer)")
        if timeout_s is None or timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        # validates mode, specs and URLs, and imports every function spec once (fail fast)
        self.router = RewardRouter(mode, reward_fn, sources)
        self._remote = {
            key: RemoteRewardModel(
                url, timeout_s=remote_timeout_s, max_retries=remote_max_retries, batch_size=remote_batch_size
            )
            for key, url in self.router.remote_specs().items()
        }
        self.num_workers = int(num_workers or min(4, os.cpu_count() or 1))
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = float(startup_timeout_s)
        self._args = (self.router.local_specs(), eos_text, memory_limit_mb)
        self._ctx = mp.get_context(start_method)
        self._lock = threading.Lock()
        self._closed = False
        #: How many workers were killed for overrunning, and how many died on their own.
        self.timeouts = 0
        self.crashes = 0
        self._hide_main = not needs_main_module(self._args[0])  # decided once, for every (re)start
        self._workers = [_Worker(self._ctx, self._args, self._hide_main) for _ in range(self.num_workers)]

    # -- lifecycle ---------------------------------------------------------------------
    @classmethod
    def from_config(cls, reward_cfg: Any, **kwargs: Any) -> "BatchScorer":
        """The scorer of a run's reward config (`megatron_dapo.config.schema.RewardConfig`)."""
        c = reward_cfg
        return cls(
            num_workers=c.num_workers,
            timeout_s=c.timeout_s,
            mode=c.mode,
            reward_fn=c.reward_fn,
            sources=c.reward_source,
            remote_timeout_s=c.remote_timeout_s,
            remote_max_retries=c.remote_max_retries,
            remote_batch_size=c.remote_batch_size,
            **kwargs,
        )

    def needs_label(self, data_source: str) -> bool:
        """Whether samples of `data_source` need a non-empty label (see `RewardRouter`)."""
        return self.router.needs_label(data_source)

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
        self._workers[self._workers.index(worker)] = _Worker(self._ctx, self._args, self._hide_main)

    # -- scoring -----------------------------------------------------------------------
    def score(self, items: Sequence[Any]) -> list[RewardResult]:
        """Score every item (`RewardInput` or (response, ground_truth)); results come back
        in input order.

        Items are validated first, so a bad batch fails loudly before any work: a label
        that is not a string is a ValueError naming `ground_truth`; so is an empty label
        of a sample whose reward is a built-in checker (which needs one). A remote reward
        model that fails for good raises `RemoteRewardError` naming its URL.
        """
        if self._closed:
            raise RuntimeError("BatchScorer is closed")
        inputs = [as_reward_input(item, i) for i, item in enumerate(items)]
        keys = [self.router.key(inp.data_source) for inp in inputs]
        for i, inp in enumerate(inputs):
            if self.router.needs_label(inp.data_source):
                try:
                    check_ground_truth(inp.label)
                except ValueError as exc:
                    where = f" (data_source {inp.data_source!r})" if inp.data_source else ""
                    raise ValueError(f"item {i}{where}: {exc}") from None
        with self._lock:
            return self._run(inputs, keys)

    def _run(self, inputs: list, keys: list) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(inputs)
        remote = self._start_remote(inputs, keys, results)
        try:
            self._run_local(inputs, keys, results)
        finally:
            for thread, _ in remote:
                thread.join()
        for _, box in remote:
            if box:
                raise box[0]
        return results  # type: ignore[return-value]

    def _start_remote(self, inputs: list, keys: list, results: list) -> list:
        """One thread per remote reward model scoring its samples; returns (thread, error box)."""
        started = []
        for key, model in self._remote.items():
            idx = [i for i, k in enumerate(keys) if k == key]
            if not idx:
                continue
            box: list = []

            def run(model=model, idx=idx, box=box):
                try:
                    for i, res in zip(idx, model.score([inputs[i] for i in idx])):
                        results[i] = res
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                    box.append(exc)

            thread = threading.Thread(target=run, name=f"reward-remote-{key}", daemon=True)
            thread.start()
            started.append((thread, box))
        return started

    def _run_local(self, inputs: list, keys: list, results: list) -> None:
        pending = deque(i for i, k in enumerate(keys) if k not in self._remote)
        busy: dict[_Worker, tuple[int, float]] = {}
        while pending or busy:
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.ready and worker not in busy and pending:
                    index = pending.popleft()
                    response = inputs[index].response
                    if not isinstance(response, str):
                        results[index] = incorrect("error", error=f"response is {type(response).__name__}, not str")
                        continue
                    try:
                        worker.conn.send((index, keys[index], inputs[index]))
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
