"""The weight sync's error type, shared by its planner (``bucket_plan.py``), the bucket gather
(``bucket_gather.py``), the sinks that feed the engines (``bucket_sinks.py``) and the sync
itself (``weight_sync.py``, which re-exports it)."""

from __future__ import annotations


class WeightSyncError(RuntimeError):
    """A weight sync (or its probe) failed: the engine's weights cannot be trusted."""
