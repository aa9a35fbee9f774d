"""Atomic checkpoint directories: write to a temporary name, rename, update ``latest`` last.

Layout under ``--save``::

    step_000004/            torch_dist model + optimizer (all ranks) + trainer_state.pt
    latest                  text file with the name of the newest complete checkpoint

A crash (even kill -9) during a save leaves a ``.tmp-step_*`` directory that is ignored and
removed at the next start; ``latest`` still names the previous complete checkpoint.
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

LATEST = "latest"
STATE_FILE = "trainer_state.pt"


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def tmp_dir(save_root: str, step: int) -> str:
    return os.path.join(save_root, f".tmp-{step_dir_name(step)}")


def clean_stale(save_root: str) -> None:
    if not os.path.isdir(save_root):
        return
    for name in os.listdir(save_root):
        if name.startswith(".tmp-"):
            shutil.rmtree(os.path.join(save_root, name), ignore_errors=True)


def commit(save_root: str, step: int, keep_last: int) -> str:
    """Rename the finished temporary directory into place, then point ``latest`` at it."""
    src, dst = tmp_dir(save_root, step), os.path.join(save_root, step_dir_name(step))
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.replace(src, dst)
    _fsync_dir(save_root)
    ptr = os.path.join(save_root, LATEST)
    with open(ptr + ".tmp", "w") as f:
        f.write(step_dir_name(step) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(ptr + ".tmp", ptr)
    _fsync_dir(save_root)
    done = sorted(n for n in os.listdir(save_root) if n.startswith("step_"))
    for old in done[:-keep_last]:
        shutil.rmtree(os.path.join(save_root, old), ignore_errors=True)
    return dst


def resolve(load: str) -> Optional[str]:
    """A checkpoint directory from ``--load`` (a run's save root with ``latest``, or a step dir)."""
    ptr = os.path.join(load, LATEST)
    if os.path.exists(ptr):
        with open(ptr) as f:
            return os.path.join(load, f.read().strip())
    if os.path.exists(os.path.join(load, STATE_FILE)):
        return load
    return None


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
