"""Start the driver's local Ray (``launch.placement.start_ray``) in a fresh process, run one task,
shut it down; print ``UP <seconds> <attempts>``. Run by tests/launch/test_ray_start.py.

``--kill-raylets N``: a thread SIGKILLs the first N raylets this process starts (a node that
never registers, as on a machine too busy for Ray's fixed waits), so the retry is exercised.
A StartupError ends the script with the driver's one line (errors.report_user_error), exit 2.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kill-raylets", type=int, default=0)
    args = ap.parse_args()
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
        import os

        assert ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=300) == 42
        nice = ray.get(ray.remote(lambda: os.nice(0)).remote(), timeout=300)
        thp = ray.get(ray.remote(lambda: os.environ.get("THP_MEM_ALLOC_ENABLE", "unset")).remote(), timeout=300)
        print(
            f"UP {time.monotonic() - t:.1f} killed={len(killed)} cpus={info['resources'].get('CPU')} "
            f"worker_nice={nice} driver_nice={os.nice(0)} worker_thp={thp}",
            flush=True,
        )
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
