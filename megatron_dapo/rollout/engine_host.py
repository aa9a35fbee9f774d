"""A rollout engine in an OS process of its own, without Ray (benchmarks, tests, tools).

In production every engine lives in its own process, an EngineActor (driver/actors.py). Two
things depend on it: SGLang kills its parent's whole process tree when one of its scheduler
processes dies, so whoever owns an ``sglang.Engine`` must be a process of its own; and CUDA IPC
handles are opened by the engine's process, never by the feeder that exported them (the driver
refuses a handle its own process exported: ``CUDA error: invalid device context``).
:class:`EngineHost` gives the same layout where Ray is not wanted: it starts
``python -m megatron_dapo.rollout.engine_host`` in a new session (so that the whole tree,
schedulers included, can be ended at once), which builds ``ENGINE(*args, **kwargs)``
(``engine``: ``"module:Class"``, :data:`SGLANG` or :data:`HF`) and serves method calls over a
local socket, in order: ``host.generate(prompts, params)`` runs ``engine.generate`` there.
Arguments and results cross as ``torch.save`` bytes (a Connection would pickle tensors as file
descriptors). ``close()`` ends the tree, also after a failure.
"""

from __future__ import annotations

import concurrent.futures
import importlib
import io
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Client, Listener
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_KEY = b"megatron-dapo-engine-host"
SGLANG = "megatron_dapo.rollout.sglang_engine:SGLangEngine"
HF = "megatron_dapo.rollout.hf_engine:HFEngine"


def _dumps(obj) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


class EngineDied(RuntimeError):
    """The engine's process ended (its connection closed) while a call was outstanding."""


class EngineHost:
    """Client of one engine process. Any attribute is a remote method of the engine; besides
    them: ``pid``, ``attr(name)``, ``scheduler_pids()``, ``alive()``, ``close()``.
    ``threads``: the engine process's ``OMP_NUM_THREADS``."""

    def __init__(self, engine: str, *args, threads: int = 1, **engine_kwargs):
        env = dict(os.environ, OMP_NUM_THREADS=str(int(threads)), PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "megatron_dapo.rollout.engine_host"],
            cwd=str(ROOT),
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self.conn = None
        try:
            self.proc.stdin.write(_dumps((engine, args, engine_kwargs)).hex().encode() + b"\n")
            self.proc.stdin.close()
            line = self.proc.stdout.readline().decode().strip()
            if not line.isdigit():
                raise RuntimeError(f"the engine process did not start (said {line!r}, exit {self.proc.poll()})")
            self.conn = Client(("127.0.0.1", int(line)), authkey=_KEY)
            self._ask("__ready__")  # the engine is built (or its error is raised here)
        except BaseException:
            self.close()
            raise

    def _ask(self, name, *args, **kwargs):
        try:
            self.conn.send_bytes(_dumps((name, args, kwargs)))
            status, value = _loads(self.conn.recv_bytes())
        except (EOFError, ConnectionError, OSError) as e:
            raise EngineDied(f"the engine process ended during {name}() (exit {self.proc.poll()})") from e
        if status != "ok":
            raise value
        return value

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **k: self._ask(name, *a, **k)

    def scheduler_pids(self):
        return self._ask("__children__")

    def attr(self, name: str):
        """An attribute of the engine object (not a call)."""
        return self._ask("__attr__", name)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout_s: float = 60) -> None:
        """Shut the engine down, then end whatever of its process tree is left."""
        try:
            if self.conn is not None and self.alive():
                try:
                    self.conn.send_bytes(_dumps(("__stop__", (), {})))
                    self.proc.wait(timeout=timeout_s)
                except Exception:  # noqa: BLE001 - the kill below ends it
                    pass
        finally:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and _group_alive(self.proc.pid):
                    time.sleep(0.1)
                    self.proc.poll()
            if self.proc.poll() is None:
                self.proc.wait()
            if self.conn is not None:
                self.conn.close()
            self.proc.stdout.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _serve() -> None:
    import psutil
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    spec, args, kwargs = _loads(bytes.fromhex(sys.stdin.readline().strip()))
    # The engine is built in this (main) thread and every method runs in one worker thread: the
    # layout of an EngineActor (a threaded Ray actor: its methods run in a thread of the actor's
    # pool, never the main one), where an event loop looked up per thread is missing.
    calls = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-call")
    with Listener(("127.0.0.1", 0), authkey=_KEY) as listener:
        print(listener.address[1], flush=True)
        with listener.accept() as conn:
            engine, error = None, None
            try:
                module, cls = spec.split(":")
                engine = getattr(importlib.import_module(module), cls)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - raised on the client's side
                error = exc
            while True:
                name, args, kw = _loads(conn.recv_bytes())
                try:
                    if name == "__stop__":
                        if engine is not None:
                            calls.submit(engine.shutdown).result()
                        calls.shutdown()
                        conn.send_bytes(_dumps(("ok", None)))
                        return
                    if name == "__ready__":
                        if error is not None:
                            raise error
                        out = None
                    elif name == "__children__":
                        out = [p.pid for p in psutil.Process().children(recursive=True)]
                    elif name == "__attr__":
                        out = getattr(engine, args[0])
                    else:  # in the worker thread, as an EngineActor's methods run in a Ray thread
                        out = calls.submit(getattr(engine, name), *args, **kw).result()
                    conn.send_bytes(_dumps(("ok", out)))
                except Exception as exc:  # noqa: BLE001 - raised on the client's side
                    conn.send_bytes(_dumps(("error", exc)))


if __name__ == "__main__":
    _serve()
