"""Where a command's CPU goes, by kind of process: every process on the machine is sampled from
/proc twice a second while the command runs (Linux only, standard library only).

    python benchmarks/suite_cpu.py [--json OUT] [--top N] -- bash scripts/run_tests.sh -q

Prints the command's exit code and wall time, then one line per kind of process (Ray's daemons,
its actors, the driver, gloo ranks, pytest workers, ...): CPU-seconds and how many processes.
Processes that existed before the command count only their CPU from then on; a process that
lived less than half a second between two samples is missed, so the totals are a lower bound.
Run it alone on the machine: everything else running is counted too (under its own kind).
Used for docs/benchmarks.md, "Test suite: time".
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import threading
import time

HZ = os.sysconf("SC_CLK_TCK")

#: (substring of the command line, kind); the first that matches wins.
KINDS = (
    ("gcs_server", "ray gcs_server"),
    ("raylet/raylet", "ray raylet"),
    ("dashboard/agent.py", "ray::DashboardAgent"),
    ("runtime_env/agent", "ray::RuntimeEnvAgent"),
    ("dashboard/dashboard.py", "ray dashboard (API server)"),
    ("log_monitor", "ray log monitor"),
    ("autoscaler/_private/monitor", "ray autoscaler monitor"),
    ("default_worker.py", "ray worker (no title yet)"),
    ("megatron_dapo.train", "driver (python -m megatron_dapo.train)"),
    ("multiprocessing.forkserver", "forked from multiprocessing's fork server (gloo ranks)"),
    ("multiprocessing.spawn", "multiprocessing spawn child"),
    ("multiprocessing.resource_tracker", "multiprocessing resource tracker"),
    ("exec(eval(sys.stdin.readline()))", "pytest-xdist worker"),
    (" -m pytest", "pytest (in a subprocess)"),
    ("/bin/pytest", "pytest (in a subprocess)"),
)


def _read(pid: str):
    """(cpu seconds, start time, command line, comm) of ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return None
    comm, rest = stat.split("(", 1)[1].rsplit(")", 1)
    fields = rest.split()
    return (int(fields[11]) + int(fields[12])) / HZ, fields[19], cmdline, comm


class Sampler(threading.Thread):
    def __init__(self, interval_s: float = 0.5):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.stop = threading.Event()
        self.seen: dict = {}  # (pid, start) -> [cpu since the first sample, title, comm]
        self.base: dict = {}  # CPU of the processes that were there before the command

    def sweep(self, first: bool) -> None:
        me = str(os.getpid())
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            got = _read(pid)
            if got is None:
                continue
            cpu, start, cmdline, comm = got
            key = (int(pid), start)
            if first:
                self.base[key] = cpu
            entry = self.seen.setdefault(key, [0.0, cmdline, comm])
            entry[0] = cpu - self.base.get(key, 0.0)
            if cmdline.startswith("ray::"):  # Ray's workers set their title once they know their job
                entry[1] = cmdline

    def run(self) -> None:
        self.sweep(first=True)
        while not self.stop.wait(self.interval_s):
            self.sweep(first=False)
        self.sweep(first=False)


def kind(cmdline: str, comm: str) -> str:
    if cmdline.startswith("ray::"):
        return cmdline.split()[0].split(".")[0]  # ray::PolicyActor.save -> ray::PolicyActor
    for needle, name in KINDS:
        if needle in cmdline:
            return name
    m = re.search(r"(tests/\S+\.py|tools/\S+\.py|benchmarks/\S+\.py|scripts/\S+|-m \S+)", cmdline)
    if m:
        return m.group(1)
    m = re.search(r"(\S+\.py)\b", cmdline)  # another script: its file name
    if m:
        return os.path.basename(m.group(1))
    return comm if not cmdline else f"{comm}: {cmdline[:60]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write every sampled process here")
    ap.add_argument("--top", type=int, default=30, help="kinds to print (default 30)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("give the command to run after --")
    sampler = Sampler()
    sampler.start()
    t0 = time.monotonic()
    rc = subprocess.call(cmd)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    rows = [(pid, start, cpu, title, comm) for (pid, start), (cpu, title, comm) in sampler.seen.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    by_kind: dict = collections.defaultdict(lambda: [0.0, 0])
    for _, _, cpu, title, comm in rows:
        k = by_kind[kind(title, comm)]
        k[0] += cpu
        k[1] += cpu > 0
    total = sum(v[0] for v in by_kind.values())
    print(f"exit {rc}, wall {wall:.1f} s, CPU {total:.0f} s sampled over {len(rows)} processes")
    for name, (cpu, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:9.1f} s  {n:5d}  {name}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
