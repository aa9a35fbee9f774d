"""Hybrid engine: weight sync into rollout engines, its probe, trainer offload, phase order.

See docs/hybrid.md. Submodules import megatron-core lazily (inside functions).
"""

from megatron_dapo.hybrid.weight_sync import DEFAULT_BUCKET_BYTES, SyncStats, WeightSync, WeightSyncError, sync_weights

__all__ = ["DEFAULT_BUCKET_BYTES", "SyncStats", "WeightSync", "WeightSyncError", "sync_weights"]
