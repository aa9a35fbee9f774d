"""Trainer checkpoints: model + optimizer + LR schedule as one torch_dist checkpoint.

The model part is :mod:`megatron_dapo.checkpoint.dist_ckpt` (metadata, validation,
resharding on load); the optimizer's sharded state and the scheduler's state are saved as
extra state in the same ``dist_checkpointing`` call. Atomicity (temporary directory, rename,
``latest`` pointer written last) is the driver's (``megatron_dapo.outputs.checkpoint_dirs``).

Resume on another layout. The optimizer state is stored in a format that dist_checkpointing
reshards like the model:

* the plain (non-distributed) optimizer: one tensor per parameter state (``exp_avg``,
  ``exp_avg_sq``) with the sharding of its parameter (:data:`PER_PARAMETER`);
* the distributed optimizer: ``fully_reshardable`` (:data:`FULLY_RESHARDABLE`): at a save the
  DP shards are gathered into per-parameter tensors of the parameter's (TP/PP-sharded) shape,
  at a load every rank reads its parameters' tensors and keeps its DP range. megatron-core
  0.16.1's ``fully_sharded_model_space`` (its default) cannot be used: its sharded tensors
  carry ``flattened_range``, which 0.16.1's ``ShardedTensor`` refuses ("ShardedTensor.
  flattened_range is not supported"), so a distributed-optimizer save failed outright.

So TP, PP, CP, DP and the node count may change between a save and a ``--load``; switching
``--use-distributed-optimizer`` may not (the two formats hold different tensors).
:func:`resume_note` says, from the layout recorded in the checkpoint (``metadata["layout"]``)
and the new one, whether a resume is supported and what changes.
"""

from __future__ import annotations

from typing import Optional

from ..checkpoint.dist_ckpt import (
    FULLY_RESHARDABLE,
    MODEL_KEY,
    PER_PARAMETER,
    RESHARDABLE_FORMATS,
    CheckpointError,
    checkpoint_layout,
    checkpoint_metadata,
    current_layout,
    load_checkpoint,
    read_metadata,
    resume_note,
    same_ranks,
    save_checkpoint,
)
from ..checkpoint.lora_meta import lora_record
from ..checkpoint.model_io import unwrap
from ..config.validate import lora_targets


def optimizer_format(distributed_optimizer: bool) -> str:
    return FULLY_RESHARDABLE if distributed_optimizer else PER_PARAMETER


def _is_distributed(policy) -> bool:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    opts = getattr(policy.optimizer, "chained_optimizers", None) or [policy.optimizer]
    return any(isinstance(o, DistributedOptimizer) for o in opts)


def _ensure_optimizer_state(policy) -> None:
    """Give a distributed optimizer that has not stepped yet its (zero) Adam state.

    Without TE/Apex megatron-core drives torch's Adam, and ``DistributedOptimizer.state_dict``
    reads the step from the per-parameter state, which a fresh torch Adam does not have (an
    ``AssertionError`` in the first ``sharded_state_dict`` of a resumed run). The zeros are
    what torch's Adam starts from; a load overwrites them."""
    import torch
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    for o in getattr(policy.optimizer, "chained_optimizers", None) or [policy.optimizer]:
        inner = getattr(o, "optimizer", None)
        if not isinstance(o, DistributedOptimizer) or not isinstance(inner, torch.optim.Adam):
            continue  # (torch's AdamW is an Adam; TE's and Apex's fused Adam keep the step per group)
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state[p]
                if not st:
                    st["step"] = torch.tensor(0.0)
                    st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _load_optimizer_state(policy, state: dict) -> None:
    """``optimizer.load_state_dict`` of the loaded optimizer state.

    The distributed optimizer's ``fully_reshardable`` state goes in in two steps, because
    megatron-core 0.16.1's ``_set_main_param_and_optimizer_states`` copies every key of the
    inner per-parameter state, ``step`` included, from the loaded tensors, which never hold the
    step (it travels in the param groups): torch's Adam (no TE/Apex, e.g. on the CPU) fails with
    ``KeyError: 'step'``. The common state (param groups, step) is loaded first, then the
    parameter state with the step set aside and put back, one step tensor per parameter:
    ``DistributedOptimizer.load_state_dict`` gives every parameter the SAME step tensor, which
    torch's Adam increments in place once per parameter (16 parameters: the step went 2 -> 18
    in one update, and the bias correction with it).

    A mixture-of-experts model has two chained optimizers (dense and expert parameters, each
    over its own data-parallel group) and a state per optimizer, keyed by its index: each goes
    in the same way, then the chain's steps are aligned, as ``ChainedOptimizer.load_state_dict``
    does (it would hand each state to ``load_state_dict`` directly: the ``KeyError`` above)."""
    chained = getattr(policy.optimizer, "chained_optimizers", None)
    mine, saved = len(chained) if chained else 1, _saved_optimizer_count(state)
    if saved is not None and saved != mine:
        # megatron-core gives a MoE model's experts their own optimizer only at EP > 1
        raise CheckpointError(
            f"the checkpoint's optimizer state is of {saved} chained optimizer(s), this layout builds {mine} (a "
            "mixture-of-experts model has a separate expert optimizer exactly when --expert-model-parallel-size > 1): "
            "resume at an expert-parallel size on the same side of 1, or start from the model alone "
            "(--pretrained-checkpoint) with a fresh optimizer"
        )
    if mine == 1:
        _load_one_optimizer_state(chained[0] if chained else policy.optimizer, state)
        return
    states = [v for _, v in sorted((k, v) for k, v in state.items() if isinstance(k, int))]
    for opt, st in zip(chained, states):
        _load_one_optimizer_state(opt, st)
    policy.optimizer._synchronize_steps()


def _saved_optimizer_count(state: dict) -> Optional[int]:
    """How many chained optimizers wrote ``state`` (one optimizer's state has its own
    ``optimizer`` entry; a chain's are under the indices 0, 1, ...); None when it cannot tell."""
    if "optimizer" in state:
        return 1
    n = sum(1 for k, v in state.items() if isinstance(k, int) and isinstance(v, dict) and "optimizer" in v)
    return n or None


def _load_one_optimizer_state(opt, state: dict) -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if not (isinstance(opt, DistributedOptimizer) and state.get("param_state_sharding_type") == FULLY_RESHARDABLE):
        opt.load_state_dict(state)
        return
    param_state = state.pop("param_state")
    state.pop("param_state_sharding_type")
    opt.load_state_dict(state)
    inner = opt.optimizer.state
    steps = {p: st.pop("step") for p, st in inner.items() if "step" in st}
    try:
        opt.load_parameter_state_from_fully_reshardable(param_state)
    finally:
        for p, step in steps.items():
            inner[p]["step"] = step.clone()


def run_layout(tp: int, pp: int, cp: int, world_size: int, nodes: Optional[int], distributed_optimizer: bool) -> dict:
    """A layout record (the keys of ``metadata["layout"]``) from the sizes of a run."""
    return {
        "tp": tp,
        "pp": pp,
        "cp": cp,
        "dp": world_size // max(1, tp * pp * cp),
        "world_size": world_size,
        "nodes": nodes,
        "distributed_optimizer": bool(distributed_optimizer),
        "optimizer_format": optimizer_format(distributed_optimizer),
    }


def lora_record_of(cfg) -> Optional[dict]:
    """The LoRA record this run's checkpoints carry (checkpoint/lora_meta.py: the adapters'
    rank, alpha and targets, the base model named and fingerprinted); None without LoRA."""
    m = cfg.model
    if not m.lora_rank:
        return None
    return lora_record(m.lora_rank, m.lora_alpha, lora_targets(cfg), m.hf_checkpoint)


def _extra(policy, loading: bool):
    dist_opt = _is_distributed(policy)
    if dist_opt:
        _ensure_optimizer_state(policy)

    def build(model_ssd):
        # fully_reshardable also for the plain optimizer's metadata: only the distributed one
        # reads it; chained_optim_avoid_prefix: no "chained_0." in keys (one optimizer here)
        md = (
            {"distrib_optim_sharding_type": FULLY_RESHARDABLE, "chained_optim_avoid_prefix": True} if dist_opt else None
        )
        return {
            "optimizer": policy.optimizer.sharded_state_dict(model_ssd[MODEL_KEY], is_loading=loading, metadata=md),
            "scheduler": policy.scheduler.state_dict(),
        }

    return build


def save_train_checkpoint(policy, directory: str, metadata: dict) -> None:
    """Collective: every rank saves its shards of model and optimizer into ``directory``."""
    dist_opt = _is_distributed(policy)
    meta = dict(metadata)
    meta["layout"] = {
        **dict(metadata.get("layout") or {}),
        "distributed_optimizer": dist_opt,
        "optimizer_format": optimizer_format(dist_opt),
    }
    # the unwrapped GPTModel: checkpoint keys without DDP's "module." prefix, the same keys
    # as a converted checkpoint (tools/convert_hf_to_megatron.py)
    save_checkpoint(unwrap(policy.model), directory, meta, extra_sharded_state=_extra(policy, False))


def load_train_checkpoint(policy, directory: str) -> dict:
    """Collective: load model, optimizer and scheduler state (any TP/PP/CP/DP); returns metadata.

    A checkpoint whose optimizer state cannot be loaded by this optimizer (:func:`resume_note`)
    is refused before anything is read."""
    new = {
        **current_layout(),
        "distributed_optimizer": _is_distributed(policy),
        "optimizer_format": optimizer_format(_is_distributed(policy)),
    }
    ok, note = resume_note(checkpoint_layout(read_metadata(directory)), new)
    if not ok:
        raise CheckpointError(f"{directory}: cannot resume: {note}")
    meta, extra = load_checkpoint(
        unwrap(policy.model), directory, policy.arch, extra_sharded_state=_extra(policy, True)
    )
    _load_optimizer_state(policy, extra["optimizer"])
    policy.scheduler.load_state_dict(extra["scheduler"])
    return meta


__all__ = [
    "lora_record_of",
    "FULLY_RESHARDABLE",
    "PER_PARAMETER",
    "RESHARDABLE_FORMATS",
    "checkpoint_metadata",
    "load_train_checkpoint",
    "optimizer_format",
    "resume_note",
    "run_layout",
    "same_ranks",
    "save_train_checkpoint",
]
