"""Gloo-rank bodies of the resume-on-another-layout tests (module-level: they pickle by name).

A trainer (``build_policy``: DDP + megatron optimizer + LR schedule) at one layout trains two
DAPO optimizer steps from a tiny random Qwen2 and saves a trainer checkpoint
(``save_train_checkpoint``); another pool, at another layout, loads it
(``load_train_checkpoint``) and trains the next step on the same global mini-batch (split
over its own DP ranks by ``dp_shards``). What comes back: the step's loss terms, grad norm,
learning rate and the full weights after it, which the test compares with a resume at the
saving layout.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from tests.training.packing_bodies import _samples, loss_sums

# micro-batch size 2 (padded); with CP packed micro-batches of at most MAX_TOKENS tokens. The
# loss is normalised over the whole step, so the grouping changes only the rounding.
MBS, MAX_TOKENS = 2, 48
VOCAB_TENSORS = ("embedding.word_embeddings.weight", "output_layer.weight")


def _layout(layout: dict):
    return (layout.get("tp", 1), layout.get("pp", 1), layout.get("cp", 1), bool(layout.get("dist_opt", False)))


def _policy(hf_cfg: dict, layout: dict):
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy

    tp, pp, cp, dist_opt = _layout(layout)
    init_parallel(tp, pp, cp, seed=1234)
    # warm-up 3 optimizer steps: the LR schedule's position is part of what must resume
    return build_policy(
        hf_cfg,
        ModelBuildOptions(context_parallel_size=cp),
        OptimizerOptions(
            lr=1e-3, weight_decay=0.1, clip_grad=1.0, use_distributed_optimizer=dist_opt, lr_warmup_iters=3
        ),
    )


def _minibatch(vocab: int, step: int) -> list:
    """Mini-batch ``step`` (the same at every layout): 6 samples with fixed old logprobs."""
    samples = _samples(vocab, n=6, seed=100 + step)
    g = torch.Generator().manual_seed(200 + step)
    return [replace(s, old_logprobs=-3.0 + 0.3 * torch.randn(s.response_len, generator=g)) for s in samples]


def _train_step(policy, step: int) -> dict:
    from megatron.core import parallel_state as ps

    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.driver.batch import dp_shards
    from megatron_dapo.training.dapo_step import train_on_minibatch

    shard = dp_shards(_minibatch(policy.arch.vocab_size, step), ps.get_data_parallel_world_size())[
        ps.get_data_parallel_rank()
    ]
    cp = ps.get_context_parallel_world_size() > 1  # CP: packed micro-batches, which need a token budget
    out = train_on_minibatch(
        policy,
        shard,
        AlgorithmConfig(entropy_coef=0.01),
        policy.arch.vocab_size,
        MBS,
        MAX_TOKENS if cp else None,
        packing=cp,
    )
    assert out.update_successful, out
    return out


def _is_reporter() -> bool:
    """Last PP stage, TP rank 0, CP rank 0 of each DP rank (what the driver sums)."""
    from megatron.core import parallel_state as ps

    return (
        ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0
    )


def save_trained(hf_cfg: dict, layout: dict, ckpt_dir: str, steps: int = 2) -> None:
    """Train ``steps`` optimizer steps from the random HF weights, then save a trainer checkpoint."""
    from megatron_dapo.checkpoint.dist_ckpt import checkpoint_metadata
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.training.train_checkpoint import save_train_checkpoint
    from tests.checkpoint.bodies import allow_children
    from tests.tiny import random_hf_model

    allow_children()
    policy = _policy(hf_cfg, layout)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    for k in range(steps):
        _train_step(policy, k)
    save_train_checkpoint(policy, ckpt_dir, checkpoint_metadata(hf_cfg, "fp32", extra={"step": steps}))


def resume_and_step(hf_cfg: dict, layout: dict, ckpt_dir: str, step: int = 2, load_optimizer: bool = True) -> dict:
    """Load the checkpoint at ``layout`` and train mini-batch ``step``. ``load_optimizer=False``
    (the control): the model only, a fresh optimizer and schedule.

    Returns on every rank ``{"reporter", "sums", "grad_norm", "lr", "weights"}``; ``weights``
    (this PP stage's full tensors, TP-gathered) only on DP rank 0, TP rank 0, CP rank 0."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.dist_ckpt import load_checkpoint
    from megatron_dapo.checkpoint.model_io import gather_full_weights, unwrap
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint

    policy = _policy(hf_cfg, layout)
    if load_optimizer:
        load_train_checkpoint(policy, ckpt_dir)
    else:
        load_checkpoint(unwrap(policy.model), ckpt_dir, policy.arch)
        policy.optimizer.reload_model_params()
    out = _train_step(policy, step)
    # the vocabulary rows without the padding (which differs between TP sizes)
    weights = {
        n: (t[: policy.arch.vocab_size] if n in VOCAB_TENSORS else t).clone()
        for n, t in gather_full_weights(policy.model, policy.arch)
    }
    keep = (
        ps.get_data_parallel_rank() == 0
        and ps.get_tensor_model_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
    )
    return {
        "reporter": _is_reporter(),
        "sums": loss_sums(out),
        "grad_norm": out.grad_norm,
        "lr": out.lr,
        "weights": weights if keep else None,
    }


def load_error(hf_cfg: dict, layout: dict, ckpt_dir: str):
    """The CheckpointError text of ``load_train_checkpoint`` at ``layout`` (None when it loads)."""
    from megatron_dapo.checkpoint.dist_ckpt import CheckpointError
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint

    policy = _policy(hf_cfg, layout)
    try:
        load_train_checkpoint(policy, ckpt_dir)
    except CheckpointError as e:
        return str(e)
    return None


def train_straight(hf_cfg: dict, layout: dict, steps: int = 3) -> dict:
    """``steps`` optimizer steps without a checkpoint in between; the weights as :func:`resume_and_step`."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights
    from tests.tiny import random_hf_model

    policy = _policy(hf_cfg, layout)
    sd = random_hf_model(hf_cfg, seed=0).state_dict()
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    for k in range(steps):
        out = _train_step(policy, k)
    weights = {
        n: (t[: policy.arch.vocab_size] if n in VOCAB_TENSORS else t).clone()
        for n, t in gather_full_weights(policy.model, policy.arch)
    }
    keep = (
        ps.get_data_parallel_rank() == 0
        and ps.get_tensor_model_parallel_rank() == 0
        and ps.get_context_parallel_rank() == 0
    )
    return {
        "reporter": _is_reporter(),
        "sums": loss_sums(out),
        "grad_norm": out.grad_norm,
        "lr": out.lr,
        "weights": weights if keep else None,
    }


def loaded_state(hf_cfg: dict, layout: dict, ckpt_dir: str) -> dict:
    """Load the trainer checkpoint at ``layout`` (one rank, TP1) and return what it restored:
    ``{"weights": {name: tensor}, "adam": {f"{name}.{exp_avg|exp_avg_sq}": tensor}, "lr": float,
    "step": int}`` (the weights by their megatron names, the Adam state keyed by the parameter it
    belongs to), for a comparison across megatron-core releases."""
    from megatron_dapo.checkpoint.model_io import gather_full_weights, unwrap
    from megatron_dapo.training.train_checkpoint import load_train_checkpoint

    policy = _policy(hf_cfg, layout)
    load_train_checkpoint(policy, ckpt_dir)
    weights = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    by_id = {id(p): n for n, p in unwrap(policy.model).named_parameters()}
    inner = policy.optimizer.optimizer  # megatron's wrapper around torch's Adam
    adam = {}
    for group in inner.param_groups:
        for p in group["params"]:
            name = by_id[id(p)]
            for k in ("exp_avg", "exp_avg_sq"):
                adam[f"{name}.{k}"] = inner.state[p][k].detach().clone()
    return {
        "weights": weights,
        "adam": adam,
        "lr": policy.optimizer.param_groups[0]["lr"],
        "step": int(policy.scheduler.num_steps),
    }
