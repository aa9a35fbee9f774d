"""Verified bytes: a checksum of every file of a checkpoint or HF export, recorded when it is
committed and checked before anything reads it back (docs/reliability.md, "Verified bytes").

``checksums.json`` beside the files: ``{"algorithm": "blake2b-128", "files": {relative path:
{"bytes": n, "digest": hex}}}``. It is written by the process that commits the directory, just
before the rename that publishes it, while the files it hashes are still in the page cache
(threads over files; hashlib releases the GIL), so it costs a read from memory of what was just
written. ``verify`` re-reads every file and names the first one that is missing, of another
size, or of other bytes; a directory without the file (written before checksums existed) is
reported as unverified, not refused.

Pickled trainer state is read with :func:`load_state`: ``torch.load(weights_only=True)`` (the
RNG states' numpy arrays allowed by name), so a damaged or foreign file is one line, never
torch's advice to load it with ``weights_only=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional

MANIFEST = "checksums.json"
ALGORITHM = "blake2b-128"
_CHUNK = 8 << 20


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.blake2b(digest_size=16)
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _files(directory: str) -> list[str]:
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def _threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def write_manifest(directory: str) -> str:
    """Hash every file under ``directory`` into ``directory/checksums.json`` (atomic)."""
    files = _files(directory)
    with ThreadPoolExecutor(_threads()) as pool:
        sums = list(pool.map(lambda rel: _digest(os.path.join(directory, rel)), files))
    record = {"algorithm": ALGORITHM, "files": {rel: {"bytes": n, "digest": d} for rel, (n, d) in zip(files, sums)}}
    path = os.path.join(directory, MANIFEST)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=0)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    return path


def recorded(directory: str) -> Optional[Dict[str, dict]]:
    """The recorded checksums of ``directory`` (None: none recorded)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        files = record["files"]
        if record.get("algorithm") != ALGORITHM or not isinstance(files, dict):
            raise ValueError("unknown layout")
        return files
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {MANIFEST: {"error": f"{type(e).__name__}: {e}"}}


def verify(directory: str) -> Optional[str]:
    """None when every recorded file is present with its recorded size and digest (or nothing
    was recorded); else one line naming the first damaged file and what differs."""
    files = recorded(directory)
    if files is None:
        return None
    if MANIFEST in files:
        return f"{MANIFEST} is damaged ({files[MANIFEST]['error']})"
    for rel, want in sorted(files.items()):
        path = os.path.join(directory, rel)
        if not os.path.isfile(path):
            return f"{rel} is missing (recorded at save: {want['bytes']} bytes)"
        size = os.path.getsize(path)
        if size != want["bytes"]:
            return f"{rel} is damaged: {size} bytes, {want['bytes']} recorded at save (truncated or overwritten)"
    names = sorted(files)
    with ThreadPoolExecutor(_threads()) as pool:
        sums = list(pool.map(lambda rel: _digest(os.path.join(directory, rel)), names))
    for rel, (_, digest) in zip(names, sums):
        if digest != files[rel]["digest"]:
            return f"{rel} is damaged: its bytes differ from those recorded at save ({ALGORITHM})"
    return None


def describe(directory: str) -> str:
    """For the dry run: "checksums verified (N files)" or "no checksums recorded"."""
    files = recorded(directory)
    return "no checksums recorded (written before they existed)" if files is None else f"{len(files)} files verified"


def load_state(path: str):
    """A pickled trainer state (``trainer_state.pt``) read with ``weights_only=True``: tensors,
    plain Python values and the numpy arrays of RNG states only. Raises ValueError with one line
    for a damaged or foreign file (never torch's advice to turn the check off)."""
    import numpy as np
    import torch

    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    allowed = [np.dtype, _reconstruct, np.ndarray, type(np.dtype(np.uint32)), type(np.dtype(np.float64))]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - damaged, truncated, or a file of another program
        reason = type(e).__name__
        if reason == "UnpicklingError":
            reason = "not a trainer state saved by megatron-dapo, or damaged"
        raise ValueError(f"{os.path.basename(path)} cannot be read ({reason})") from None
