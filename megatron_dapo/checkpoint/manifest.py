"""Verified bytes: a checksum of every file of a checkpoint or HF export, recorded when it is
committed and checked before anything reads it back (docs/reliability.md, "Verified bytes").

``checksums.json`` beside the files: ``{"algorithm": "blake2b-128", "files": {relative path:
{"bytes": n, "digest": hex}}}``. The tensor shards are hashed where they are written: every rank,
right after ``dist_checkpointing.save`` returns, hashes the ``.distcp`` files it wrote
(:func:`record_rank_files`, from the page cache, on every node at once) into a small
``checksums.rank<r>.json``; the process that commits the directory merges those and hashes only
what no rank recorded (the metadata, the trainer state; threads over files, hashlib releases
the GIL), just before the rename that publishes it. A rank's record is used only for a file
still of the size it recorded. ``verify`` re-reads every file and names the first one that is missing, of another
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
#: a rank's record of the shard files it wrote: ``checksums.rank<r>.json``
RANK_RECORD = "checksums.rank"
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


def _is_record(rel: str) -> bool:
    return rel == MANIFEST or (rel.startswith(RANK_RECORD) and rel.endswith(".json"))


def _files(directory: str) -> list[str]:
    out = []
    for root, _, names in os.walk(directory):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), directory)
            if not _is_record(rel):
                out.append(rel)
    return sorted(out)


def _threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def _write_json(path: str, record: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f, indent=0)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def _digests(directory: str, files: list[str]) -> Dict[str, dict]:
    with ThreadPoolExecutor(_threads()) as pool:
        sums = list(pool.map(lambda rel: _digest(os.path.join(directory, rel)), files))
    return {rel: {"bytes": n, "digest": d} for rel, (n, d) in zip(files, sums)}


def record_rank_files(directory: str, rank: int) -> str:
    """Hash the ``.distcp`` files that ``rank`` has just written into ``directory`` (torch's
    naming: ``__<rank>_<i>.distcp``) into ``checksums.rank<rank>.json``; called by every rank
    right after its save, while the bytes are in its page cache. Returns the record's path."""
    prefix = f"__{int(rank)}_"
    mine = sorted(n for n in os.listdir(directory) if n.startswith(prefix) and n.endswith(".distcp"))
    path = os.path.join(directory, f"{RANK_RECORD}{int(rank)}.json")
    _write_json(path, {"algorithm": ALGORITHM, "files": _digests(directory, mine)})
    return path


def recorded_by_rank(directory: str) -> Dict[str, dict]:
    """The digests the ranks recorded, for files still of the recorded size."""
    known: Dict[str, dict] = {}
    for name in sorted(os.listdir(directory)):
        if not (name.startswith(RANK_RECORD) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(directory, name)) as f:
                record = json.load(f)
            if record.get("algorithm") != ALGORITHM:
                continue
            for rel, entry in record["files"].items():
                full = os.path.join(directory, rel)
                if os.path.isfile(full) and os.path.getsize(full) == int(entry["bytes"]):
                    known[rel] = {"bytes": int(entry["bytes"]), "digest": str(entry["digest"])}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # an unreadable record: its files are hashed here
    return known


def write_manifest(directory: str) -> str:
    """Record every file under ``directory`` in ``directory/checksums.json`` (atomic): the
    digests the ranks recorded (:func:`record_rank_files`), the rest hashed here; the ranks'
    records are then removed. Returns the manifest's path."""
    files = _files(directory)
    known = recorded_by_rank(directory)
    sums = {**_digests(directory, [rel for rel in files if rel not in known]), **known}
    path = os.path.join(directory, MANIFEST)
    _write_json(path, {"algorithm": ALGORITHM, "files": {rel: sums[rel] for rel in files}})
    for name in os.listdir(directory):
        if name.startswith(RANK_RECORD) and name.endswith(".json"):
            os.remove(os.path.join(directory, name))
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
    sums = _digests(directory, sorted(files))
    for rel, got in sorted(sums.items()):
        if got["digest"] != files[rel]["digest"]:
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
