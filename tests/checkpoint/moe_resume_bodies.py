"""Gloo-rank bodies of tests/checkpoint/test_moe_resume.py (module-level: they pickle by name).

A tiny Qwen3-MoE policy (TP1, DDP over 2 ranks, distributed optimizer) trains one AdamW step at
one expert layout and saves a trainer checkpoint; another pool loads it at another EP and
trains the next step."""

from __future__ import annotations

import torch


def _policy(hf_cfg: dict, ep: int):
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.tolerances import COMPARE_ADAM_EPS

    init_parallel(1, 1, seed=1234, expert_model_parallel_size=ep)
    # eps: tests/tolerances.py (weights are compared after the steps)
    opt = OptimizerOptions(
        lr=1e-3, weight_decay=0.1, clip_grad=1.0, use_distributed_optimizer=True, adam_eps=COMPARE_ADAM_EPS
    )
    return build_policy(hf_cfg, ModelBuildOptions(), opt)


def _step(policy, seed: int) -> dict:
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.setup import train_step
    from tests.foundation.bodies import _nll_loss_fn

    data = torch.randint(0, policy.arch.vocab_size, (4, 10), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(data)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    mbs = [{"tokens": data[r : r + 1], "loss_mask": mask[r : r + 1]} for r in range(4) if r % dp == dp_rank]
    out = train_step(policy, mbs, _nll_loss_fn(policy.arch, float(mask[:, 1:].sum())))
    assert out["update_successful"]
    return out


def save_after_one_step(hf_cfg: dict, sd: dict, ep: int, ckpt_dir: str) -> None:
    from megatron_dapo.checkpoint.dist_ckpt import checkpoint_metadata
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.training.train_checkpoint import save_train_checkpoint
    from tests.checkpoint.bodies import allow_children

    allow_children()
    policy = _policy(hf_cfg, ep)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    _step(policy, 11)
    save_train_checkpoint(policy, ckpt_dir, checkpoint_metadata(hf_cfg, "fp32"))


def resume_and_step(hf_cfg: dict, ep: int, ckpt_dir: str, load_optimizer: bool = True) -> dict:
    """Load at EP ``ep`` and train the second step; the full weights after it (on DP rank 0).
    ``load_optimizer=False``: the model only, a fresh optimizer (the control)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.dist_ckpt import load_checkpoint
    from megatron_dapo.checkpoint.model_io import gather_full_weights, unwrap
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint

    policy = _policy(hf_cfg, ep)
    if load_optimizer:
        load_train_checkpoint(policy, ckpt_dir)
    else:
        load_checkpoint(unwrap(policy.model), ckpt_dir, policy.arch)
        policy.optimizer.reload_model_params()
    out = _step(policy, 12)
    full = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    return {"params": full if ps.get_data_parallel_rank() == 0 else None, "grad_norm": out["grad_norm"]}


def train_straight(hf_cfg: dict, sd: dict, ep: int) -> dict:
    """The two steps without a checkpoint in between (the reference of a resume)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights

    policy = _policy(hf_cfg, ep)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    _step(policy, 11)
    out = _step(policy, 12)
    full = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    return {"params": full if ps.get_data_parallel_rank() == 0 else None, "grad_norm": out["grad_norm"]}


def load_error(hf_cfg: dict, ep: int, ckpt_dir: str):
    """The CheckpointError text of ``load_train_checkpoint`` at EP ``ep`` (None when it loads)."""
    from megatron_dapo.checkpoint.dist_ckpt import CheckpointError
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint

    policy = _policy(hf_cfg, ep)
    try:
        load_train_checkpoint(policy, ckpt_dir)
    except CheckpointError as e:
        return str(e)
    return None
