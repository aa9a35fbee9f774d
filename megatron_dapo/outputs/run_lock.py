"""One run owns its directories: an exclusive lock on ``--run-dir`` and ``--save`` for the run's
lifetime (docs/reliability.md, "Run ownership").

The lock is ``fcntl.flock`` on ``DIR/.megatron-dapo.lock``, held by the driver process: the
operating system drops it when that process ends, however it ends (kill -9, a node that
reboots), so a lock is never left behind by a dead run. The file also holds the owner's host,
pid, start time and run id, so a second run (on this node or, on a shared file system whose
locks reach every node, on another) is refused in one line naming the live run, and a file
left by a dead owner is taken over with a line saying whose it was. ``--start-over`` moves
files aside only once the lock is held, so it never touches a live run's files. A clean exit
removes the file (a later start says nothing); a killed run leaves it, unlocked.

File systems without working ``flock`` (some NFS mounts without a lock daemon) raise an error
on ``flock``; the run then stops naming the path and the file system problem.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from typing import List, Optional

from ..errors import ConfigError

LOCK_NAME = ".megatron-dapo.lock"


@dataclass
class HeldLock:
    path: str
    fd: int
    created: bool = False  # this run made the directory (removed again when the run is refused)


#: the locks this process holds (kept open for its lifetime; released at exit)
_HELD: List[HeldLock] = []


def _owner(path: str) -> dict:
    try:
        with open(path) as f:
            return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def describe_owner(info: dict) -> str:
    if not info:
        return "owner unknown"
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')}, started {when}, run {info.get('run_id', '?')}"


def _open_locked(directory: str, flag: str) -> tuple[int, str, Optional[dict]]:
    """(fd, path, info of a dead previous owner or None) with the lock held; ConfigError when
    a live run holds it."""
    path = os.path.join(directory, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"{flag} {directory} is in use by a live run ({describe_owner(_owner(path))}); wait for it to end or stop "
            f"it, or choose another {flag} (--start-over never moves a live run's files)"
        ) from None
    except OSError as e:
        os.close(fd)
        raise ConfigError(
            f"{flag} {directory}: cannot lock {path} ({e.strerror}): the file system does not support flock; "
            f"choose a {flag} on a file system that does (a local disk, or NFS with its lock service)"
        ) from None
    stale = _owner(path) or None
    return fd, path, stale


def acquire(directory: str, flag: str, run_id: str) -> List[str]:
    """Lock ``directory`` for this process (created if missing) and record the owner; returns
    the lines to print (a stale lock taken over). Already held by this process: nothing."""
    directory = os.path.abspath(directory)
    if any(os.path.dirname(h.path) == directory for h in _HELD):
        return []
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    fd, path, stale = _open_locked(directory, flag)
    info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(), "run_id": run_id}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    os.fsync(fd)
    _HELD.append(HeldLock(path, fd, created))
    if stale:
        return [f"{flag} {directory}: took over the lock of a run that is gone ({describe_owner(stale)})"]
    return []


def check_free(directory: str, flag: str) -> List[str]:
    """For ``--dry-run``: ConfigError when a live run holds ``directory``; takes no lock."""
    path = os.path.join(os.path.abspath(directory), LOCK_NAME)
    if not os.path.exists(path):
        return []
    fd, _, stale = _open_locked(os.path.dirname(path), flag)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    return [f"{flag} {directory}: a lock left by a run that is gone ({describe_owner(stale)}) would be taken over"] if stale else []


def release(directories) -> None:
    """Release the locks of these directories (a run refused after it took them)."""
    wanted = {os.path.join(os.path.abspath(d), LOCK_NAME) for d in directories}
    for held in [h for h in _HELD if h.path in wanted]:
        _HELD.remove(held)
        _drop(held)
        if held.created:
            try:
                os.rmdir(os.path.dirname(held.path))  # only when empty
            except OSError:
                pass


def release_all() -> None:
    """Remove this process's lock files and drop the locks (a clean exit)."""
    while _HELD:
        _drop(_HELD.pop())


def _drop(held: HeldLock) -> None:
    try:
        if _owner(held.path).get("pid") == os.getpid():
            os.unlink(held.path)
    except OSError:
        pass
    finally:
        os.close(held.fd)


atexit.register(release_all)
