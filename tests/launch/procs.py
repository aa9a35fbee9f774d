"""End what a test started: every process of a session, also after a failure or a timeout.

Tests start scripts with ``subprocess.Popen(..., start_new_session=True)``; the script and
everything it starts (unless it calls setsid itself) share that session, so the session id
finds them all, even those that moved to a process group of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

# Grace for scripts that run Ray daemons: Ray's agents (runtime env, dashboard) notice that
# their raylet has ended by polling a pipe, and may then report to the GCS with a 60 s
# timeout before they exit (ray/_private/process_watcher.py). With two suites on 2 cores
# (load average ~90) a runtime env agent that had logged "Exiting" was still alive 15 s
# after its script ended. A process that never ends still fails the test.
RAY_SHUTDOWN_GRACE_S = 75.0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def command_line(pid: int) -> str:
    """``pid: cmdline`` (what a leftover process was, for the failure message)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f"{pid}: " + f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:300]
    except OSError:
        return f"{pid}: (gone)"


def session_pids(sid: int) -> list:
    """Live processes of session ``sid`` (from /proc; field 6 of stat is the session id)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def leftovers(proc, pattern: str = "", grace_s: float = 0.0) -> list:
    """Processes still alive in ``proc``'s session (it was started with start_new_session) or
    whose command line contains ``pattern``, after waiting up to ``grace_s`` for them to exit
    on their own; every one of them is SIGKILLed. Returns them as ``pid: command line``."""
    deadline = time.monotonic() + grace_s
    while True:
        left = {p for p in session_pids(proc.pid) if p != proc.pid}
        if pattern:
            found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
            left |= {int(p) for p in found}
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    described = [command_line(pid) for pid in sorted(left)]
    for pid in [*([proc.pid] if proc.poll() is None else []), *left]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return described


def run_in_session(
    cmd, timeout: float, grace_s: float = 0.0, pattern: str = "", **popen_kwargs
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a session of its own: after
    it ends (or at the timeout, when the test fails naming the command) every process it left
    in its session (or matching ``pattern``) is killed, after ``grace_s`` to exit on their own;
    they are in the result's ``leftovers`` (``pid: command line``)."""
    import pytest

    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen_kwargs
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        leftovers(proc)
        stdout, stderr = proc.communicate()
        timed_out = True
    finally:
        left = leftovers(proc, pattern, grace_s=grace_s)  # nothing it started outlives the test
        proc.wait()
    if timed_out:
        pytest.fail(f"{' '.join(map(str, cmd))} did not finish in {timeout} s:\n{stdout[-3000:]}{stderr[-5000:]}")
    done = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    done.leftovers = left
    return done


class private_ray_tmpdir:
    """A Ray temp dir of the test's own (``RAY_TMPDIR``), removed afterwards: a
    ``ray.cluster_utils.Cluster`` writes its address to ``<temp>/ray/ray_current_cluster``,
    which every later ``ray.init()`` on the machine would join if the script were killed before
    its shutdown removed it. Short (under /tmp), for Ray's 107-byte socket paths."""

    def __enter__(self) -> str:
        import tempfile

        self.path = tempfile.mkdtemp(prefix="rt", dir="/tmp")
        return self.path

    def __exit__(self, *exc) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)
