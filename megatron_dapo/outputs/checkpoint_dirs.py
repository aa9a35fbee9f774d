"""Atomic checkpoint directories: write to a temporary name, rename, update ``latest`` last.

Layout under ``--save``::

    step_000004/            torch_dist model + optimizer (all ranks) + trainer_state.pt
        run.json            {"run_id", "step"}: which run wrote it
        checksums.json      every file's size and digest (checkpoint/manifest.py), verified before a resume
    latest                  text file with the name of the newest complete checkpoint
    aside-<time>/           checkpoints moved out of the way by --start-over (never deleted)

A crash (even kill -9) during a save leaves a ``.tmp-step_*`` directory that is ignored and
removed at the next start; ``latest`` still names the previous complete checkpoint.

Nothing is deleted that the run did not write: rotation (``--keep-last``) orders checkpoints by
step NUMBER and removes only older checkpoints of the same run (``run.json``); before the
first save, :func:`check_save_dir` refuses a ``--save`` holding another run's checkpoints, or
checkpoints of this run later than the step it resumes from, and names the choices
(:func:`move_aside` is what ``--start-over`` does with them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import List, Optional, Tuple

from ..checkpoint import manifest

LATEST = "latest"
STATE_FILE = "trainer_state.pt"
RUN_FILE = "run.json"
_STEP_RE = re.compile(r"^step_(\d+)$")


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


def steps(save_root: str) -> List[Tuple[int, str]]:
    """The complete checkpoints under ``save_root`` as (step, directory name), by step number."""
    if not os.path.isdir(save_root):
        return []
    out = []
    for name in os.listdir(save_root):
        m = _STEP_RE.match(name)
        if m and os.path.isdir(os.path.join(save_root, name)):
            out.append((int(m.group(1)), name))
    return sorted(out)


def run_id_of(step_path: str) -> Optional[str]:
    """The run that wrote a checkpoint (its ``run.json``), None when unknown."""
    try:
        with open(os.path.join(step_path, RUN_FILE)) as f:
            return json.load(f).get("run_id")
    except (OSError, ValueError):
        return None


def write_run_file(step_path: str, run_id: str, step: int) -> None:
    with open(os.path.join(step_path, RUN_FILE), "w") as f:
        json.dump({"run_id": run_id, "step": int(step)}, f)


def commit(save_root: str, step: int, keep_last: int, run_id: Optional[str] = None) -> str:
    """Rename the finished temporary directory into place, then point ``latest`` at it; then
    remove this run's older checkpoints beyond ``keep_last`` (by step number; another run's
    checkpoints and later steps are never touched)."""
    src, dst = tmp_dir(save_root, step), os.path.join(save_root, step_dir_name(step))
    if run_id is not None:
        write_run_file(src, run_id, step)
    manifest.write_manifest(src)  # every file's checksum, verified before a resume reads them
    if os.path.exists(dst):
        if run_id is None or run_id_of(dst) != run_id:
            raise FileExistsError(f"{dst} exists and was not written by this run: it is left as it is")
        shutil.rmtree(dst)  # this run's own earlier save of the same step (a re-run after a resume)
    os.replace(src, dst)
    _fsync_dir(save_root)
    ptr = os.path.join(save_root, LATEST)
    with open(ptr + ".tmp", "w") as f:
        f.write(step_dir_name(step) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(ptr + ".tmp", ptr)
    _fsync_dir(save_root)
    if run_id is not None:
        mine = [name for s, name in steps(save_root)
                if s <= step and run_id_of(os.path.join(save_root, name)) == run_id]
        for old in mine[:-keep_last]:
            shutil.rmtree(os.path.join(save_root, old), ignore_errors=True)
    return dst


class SaveDirConflict(ValueError):
    """``--save`` holds checkpoints this run must not write beside (see :func:`check_save_dir`)."""

    def __init__(self, message: str, names: List[str]):
        super().__init__(message)
        self.names = names


def check_save_dir(save_root: str, run_id: Optional[str], resume_step: Optional[int]) -> None:
    """Before the first save: raise :class:`SaveDirConflict` when ``save_root`` holds
    checkpoints of another run (or of no known run), or - resuming at ``resume_step`` -
    checkpoints of this run after that step (a rollback). Nothing is changed here."""
    foreign, later = [], []
    for s, name in steps(save_root):
        rid = run_id_of(os.path.join(save_root, name))
        if resume_step is not None and rid is None and s <= resume_step:
            continue  # written before checkpoints named their run: left alone (rotation never removes it)
        if resume_step is None or rid != run_id:
            foreign.append(name)
        elif s > resume_step:
            later.append(name)
    if foreign:
        raise SaveDirConflict(
            f"--save {save_root} holds checkpoints of another run ({_span(foreign)}); write to a new --save "
            f"directory, resume that run with --load {save_root}, or pass --start-over to move them into "
            f"{save_root}/aside-<time>/ (nothing is deleted)", foreign)
    if later:
        raise SaveDirConflict(
            f"--save {save_root} holds checkpoints of this run after step {resume_step} ({_span(later)}), which "
            f"rotation would mix with the new ones; resume from the latest with --load {save_root}, write to a "
            f"new --save directory, or pass --start-over to move the later ones into {save_root}/aside-<time>/ "
            "(nothing is deleted)", later)


def _span(names: List[str]) -> str:
    return names[0] if len(names) == 1 else f"{len(names)} checkpoints, {names[0]} .. {names[-1]}"


def move_aside(root: str, names: List[str], label: str = "aside") -> Optional[str]:
    """Move ``names`` (entries of ``root``) into a new ``root/<label>-<time>/`` and return it
    (None when there is nothing to move); a ``latest`` pointer that names a moved checkpoint
    is moved with it. Nothing is deleted."""
    present = [n for n in names if os.path.lexists(os.path.join(root, n))]
    if not present:
        return None
    dest = os.path.join(root, f"{label}-{time.strftime('%Y%m%d-%H%M%S')}")
    k = 1
    while os.path.exists(dest):
        k += 1
        dest = os.path.join(root, f"{label}-{time.strftime('%Y%m%d-%H%M%S')}-{k}")
    os.makedirs(dest)
    ptr = os.path.join(root, LATEST)
    if os.path.exists(ptr):
        with open(ptr) as f:
            if f.read().strip() in present:
                present.append(LATEST)
    for n in present:
        os.replace(os.path.join(root, n), os.path.join(dest, n))
    _fsync_dir(root)
    return dest


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


def write_dir_atomically(directory: str, write) -> str:
    """``write(tmp)`` fills ``<directory>.tmp``, which then replaces ``directory`` by a rename:
    a crash never leaves a half-written ``directory`` (an HF export of the run's own). Returns
    ``directory``."""
    tmp = directory.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    manifest.write_manifest(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    os.replace(tmp, directory)
    return directory
