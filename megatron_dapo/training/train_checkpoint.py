"""Trainer checkpoints: model + optimizer + LR schedule as one torch_dist checkpoint.

The model part is :mod:`megatron_dapo.checkpoint.dist_ckpt` (metadata, validation,
resharding on load); the optimizer's sharded state and the scheduler's state are saved as
extra state in the same ``dist_checkpointing`` call. Atomicity (temporary directory, rename,
``latest`` pointer written last) is the driver's (``megatron_dapo.driver.checkpoint_dirs``).
"""

from __future__ import annotations

from ..checkpoint.dist_ckpt import MODEL_KEY, checkpoint_metadata, load_checkpoint, save_checkpoint
from ..checkpoint.model_io import unwrap


def _extra(policy, loading: bool):
    def build(model_ssd):
        return {
            "optimizer": policy.optimizer.sharded_state_dict(model_ssd[MODEL_KEY], is_loading=loading),
            "scheduler": policy.scheduler.state_dict(),
        }

    return build


def save_train_checkpoint(policy, directory: str, metadata: dict) -> None:
    """Collective: every rank saves its shards of model and optimizer into ``directory``."""
    # the unwrapped GPTModel: checkpoint keys without DDP's "module." prefix, the same keys
    # as a converted checkpoint (tools/convert_hf_to_megatron.py)
    save_checkpoint(unwrap(policy.model), directory, metadata, extra_sharded_state=_extra(policy, False))


def load_train_checkpoint(policy, directory: str) -> dict:
    """Collective: load model, optimizer and scheduler state (any TP/PP); returns metadata."""
    meta, extra = load_checkpoint(unwrap(policy.model), directory, policy.arch, extra_sharded_state=_extra(policy, True))
    policy.optimizer.load_state_dict(extra["optimizer"])
    policy.scheduler.load_state_dict(extra["scheduler"])
    return meta


__all__ = ["checkpoint_metadata", "load_train_checkpoint", "save_train_checkpoint"]
