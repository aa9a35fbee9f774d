"""Start the driver's local Ray (``launch.placement.start_ray``) in a fresh process, run one task,
shut it down; print ``UP <seconds> <attempts>``. Run by tests/launch/test_ray_start.py.

``--kill-raylets N``: a thread SIGKILLs the first N raylets this process starts (a node that
never registers, as on a machine too busy for Ray's fixed waits), so the retry is exercised.
A StartupError ends the script with the driver's one line (errors.report_user_error), exit 2.

``--sigterm-during-start``: the script installs a SIGTERM handler as the driver does (it records
the signal and raises), and a thread sends SIGTERM to this process once its raylet exists, i.e.
inside ``ray.init``; it prints ``SIGTERM seen=<bool> outcome=<what the start did>`` (exit 143).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

import psutil


def _kill_raylets(n: int, killed: list) -> None:
    me, seen = psutil.Process(), set()
    while len(killed) < n:
        for c in me.children(recursive=True):
            try:
                if c.pid not in seen and c.exe().endswith("/raylet"):
                    seen.add(c.pid)
                    c.kill()
                    killed.append(c.pid)
            except psutil.Error:
                pass
        time.sleep(0.05)


def _sigterm_once_raylet_exists() -> None:
    me = psutil.Process()
    while True:
        for c in me.children(recursive=True):
            try:
                if c.exe().endswith("/raylet"):
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
            except psutil.Error:
                pass
        time.sleep(0.05)


def _head_processes() -> str:
    """How many of this process's descendants are Ray's log monitor, its autoscaler monitor and
    its raylet: ``log_monitor=N autoscaler_monitor=N raylet=N``."""
    found = {"log_monitor": 0, "autoscaler_monitor": 0, "raylet": 0}
    for c in psutil.Process().children(recursive=True):
        try:
            line = " ".join(c.cmdline())
        except psutil.Error:
            continue
        found["log_monitor"] += "ray/_private/log_monitor.py" in line
        found["autoscaler_monitor"] += "ray/autoscaler/_private/monitor.py" in line
        found["raylet"] += line.split(" ", 1)[0].endswith("/raylet")
    return " ".join(f"{k}={v}" for k, v in found.items())


def _sigterm_during_start() -> int:
    seen = threading.Event()

    def on_sigterm(signum, frame):  # as megatron_dapo/driver/signals.py: record, then raise
        seen.set()
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, on_sigterm)
    threading.Thread(target=_sigterm_once_raylet_exists, daemon=True).start()
    from megatron_dapo.launch.placement import start_ray

    outcome = "start returned"
    try:
        start_ray(num_cpus=1)
    except BaseException as e:  # noqa: BLE001 - what the start made of the signal is the result
        outcome = f"start raised {type(e).__name__}"
    finally:
        import ray

        ray.shutdown()
    print(f"SIGTERM seen={seen.is_set()} outcome={outcome}", flush=True)
    return 128 + signal.SIGTERM


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-raylets", type=int, default=0)
    ap.add_argument("--sigterm-during-start", action="store_true")
    args = ap.parse_args()
    if args.sigterm_during_start:
        return _sigterm_during_start()
    killed: list = []
    if args.kill_raylets:
        threading.Thread(target=_kill_raylets, args=(args.kill_raylets, killed), daemon=True).start()
    from megatron_dapo.errors import report_user_error
    from megatron_dapo.launch.placement import start_ray

    t = time.monotonic()
    try:
        info = start_ray(num_cpus=1)
    except Exception as e:
        return report_user_error("ray_start_check", e)
    import ray

    try:
        assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=300) == 42
        nice = ray.get(ray.remote(lambda: os.nice(0)).remote(), timeout=300)
        thp = ray.get(ray.remote(lambda: os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")).remote(), timeout=300)
        print(
            f"UP {time.monotonic() - t:.1f} killed={len(killed)} cpus={info['resources'].get('CPU')} "
            f"worker_nice={nice} driver_nice={os.nice(0)} worker_thp={thp} {_head_processes()}",
            flush=True,
        )
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
