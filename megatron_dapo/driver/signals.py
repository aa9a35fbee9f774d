"""SIGTERM in the driver (scancel, a job's time limit, a plain ``kill``): an exception in the
main thread, so that ``megatron_dapo.train.main``'s ``finally`` stops the actors and unlinks
the trainers' shared-memory buffers, then exit code 143."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

SIGTERM_SEEN = threading.Event()  # set once SIGTERM has reached the driver


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the driver.

    A KeyboardInterrupt because that is what a blocking Ray call (``ray.get``) passes on intact
    from a signal handler; a SystemExit raised there comes out as ``SystemExit(1)``. Either way
    ``main`` goes by :data:`SIGTERM_SEEN`, not by the exception it sees."""


def _on_sigterm(signum, frame):
    """Turn SIGTERM into an exception in the main thread (the default action would end the
    driver at once: nothing cleaned up, the bucket files left in /dev/shm). A second SIGTERM
    during that cleanup is ignored; Slurm's KILL after its KillWait still ends it."""
    SIGTERM_SEEN.set()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exit_within(STOP_BOUND_S, 128 + signal.SIGTERM, "SIGTERM")
    print(
        "megatron_dapo.train: SIGTERM: stopping the run (checkpoints already committed are kept)",
        file=sys.stderr,
        flush=True,
    )
    raise Terminated()


def stop_on_sigterm():
    """Install :func:`_on_sigterm` (main thread only); returns the handler it replaced. Called
    again once Ray is up: ``ray.init`` installs its own C++ handler (it logs and aborts)."""
    if threading.current_thread() is threading.main_thread():
        return signal.signal(signal.SIGTERM, _on_sigterm)
    return None


def check_not_terminated() -> None:
    """Raise :class:`Terminated` if SIGTERM came and a library swallowed the interruption."""
    if SIGTERM_SEEN.is_set():
        raise Terminated()


#: seconds the driver's cleanup may take after SIGTERM or Ctrl-C before it exits anyway
STOP_BOUND_S = 30.0


def exit_within(seconds: float, code: int, why: str) -> threading.Thread:
    """Exit this process with ``code`` if it is still running ``seconds`` from now (a daemon
    thread; the cleanup that normally ends it first is left unfinished then): the stop of a run
    is bounded however loaded the machine (Ray's own shutdown can wait 60 s for a GCS that is
    gone). Its Ray node is ended by the reaper (launch/ray_reaper.py) after the driver exits."""

    def _exit():
        time.sleep(seconds)
        print(
            f"megatron_dapo.train: {why}: the cleanup took more than {seconds:.0f} s, exiting now (Ray's node "
            "processes are ended after it)",
            file=sys.stderr,
            flush=True,
        )
        os._exit(code)

    t = threading.Thread(target=_exit, name="stop-bound", daemon=True)
    t.start()
    return t
