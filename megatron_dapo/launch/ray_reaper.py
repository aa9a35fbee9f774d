"""A local Ray node ends with the driver that started it, however the driver ends.

``ray.init`` starts the node's processes (GCS, raylet, the raylet's dashboard and runtime-env
agents) under the driver. The GCS and the raylet die with it (Ray sets them to get SIGKILL when
their parent dies), but the agents are the raylet's children: when the raylet is gone they try to
report its death to the GCS, which is gone too, and wait out a fixed 60 s RPC timeout before they
exit (Ray 2.60, ``_private/process_watcher.py``), re-parented to init meanwhile; a driver
killed with ``kill -9`` (or by the OOM killer) left them running that long, and a driver whose
own shutdown hangs on the dead GCS printed Ray's "GCS may have been killed" a minute later.

:func:`watch` hands the node's processes (pid and start time, so that a reused pid is never
touched) to a small reaper process whose stdin is a pipe from the driver. When the driver
exits, by any route, the pipe closes; the reaper gives the processes :data:`REAP_GRACE_S` to
end on their own (a normal shutdown ends them in about a second), then kills the rest with
SIGKILL and exits. It ignores SIGINT (a terminal's Ctrl-C reaches the whole foreground group)
and SIGTERM (Slurm signals every process of the job), so it outlives the driver by at most its
grace. Only for a node this driver started (``ray.init(address="local")``), never a cluster's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Iterable, Optional

#: seconds the node's processes get to end by themselves once the driver is gone
REAP_GRACE_S = 10.0
_reapers: list = []  # the reapers of this process (their stdin pipes stay open until it exits)


def _started(pid: int) -> Optional[float]:
    import psutil  # a dependency of ray[default]

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def watch(pids: Iterable[int], grace_s: float = REAP_GRACE_S) -> Optional[subprocess.Popen]:
    """Start a reaper for ``pids`` (this driver's Ray node processes); returns it (None: no
    process to watch). The reaper holds the read end of a pipe whose write end only this process
    holds; nothing has to be called at exit."""
    procs = [(pid, t) for pid in sorted(set(pids)) if (t := _started(pid)) is not None]
    if not procs:
        return None
    reaper = subprocess.Popen(
        [sys.executable, "-m", "megatron_dapo.launch.ray_reaper", str(float(grace_s))],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        close_fds=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
    )
    assert reaper.stdin is not None
    reaper.stdin.write(json.dumps({"driver": os.getpid(), "procs": procs}) + "\n")
    reaper.stdin.flush()
    _reapers.append(reaper)
    return reaper


def _alive(pid: int, started: float) -> bool:
    t = _started(pid)
    return t is not None and abs(t - started) < 1e-3


def reap(procs: list, grace_s: float, poll_s: float = 0.2) -> list:
    """Wait up to ``grace_s`` for ``procs`` (``[pid, start time]``) to end, then SIGKILL the
    ones still alive; returns their pids."""
    deadline = time.monotonic() + grace_s
    left = [(p, t) for p, t in procs if _alive(p, t)]
    while left and time.monotonic() < deadline:
        time.sleep(poll_s)
        left = [(p, t) for p, t in left if _alive(p, t)]
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return [p for p, _ in left]


def main(argv=None) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args = sys.argv[1:] if argv is None else argv
    grace_s = float(args[0]) if args else REAP_GRACE_S
    first = sys.stdin.readline()
    if not first:
        return 0
    record = json.loads(first)
    while sys.stdin.readline():  # blocks until the driver's end closes the pipe
        pass
    killed = reap([tuple(x) for x in record["procs"]], grace_s)
    if killed:
        print(
            f"[ray] the Ray node of driver {record['driver']} outlived it by {grace_s:.0f} s: ended pids "
            f"{', '.join(map(str, killed))}",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
