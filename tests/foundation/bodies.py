"""Test bodies that run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

import os

import torch


def build_from_hf(hf_cfg: dict, tp: int, pp: int, seed: int = 0):
    """Init parallel state, build the megatron model and load the random HF weights into it."""
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, seed=1234)
    hf = random_hf_model(hf_cfg, seed=seed)
    opts = ModelBuildOptions()
    model, arch, cfg = build_gpt_model(hf_cfg, opts)
    sd = hf.state_dict()
    load_hf_weights(
        model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp)
    )
    return hf, model, arch, cfg


def logits_vs_hf(hf_cfg: dict, tp: int, pp: int):
    """Max |megatron logits - HF logits| on the last PP stage (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.forward import forward_backward, gather_vocab

    hf, model, arch, _ = build_from_hf(hf_cfg, tp, pp)
    model.eval()
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, arch.vocab_size, (2, 12), generator=g)
    got = []

    def loss_fn(batch, logits):
        got.append(gather_vocab(logits)[..., : arch.vocab_size].detach())
        return logits.sum() * 0, {}

    with torch.no_grad():
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
        ref = hf(tokens).logits
    if not ps.is_pipeline_last_stage():
        return None
    return float((got[0] - ref).abs().max())


def _nll_loss_fn(arch, global_tokens):
    """Token-mean NLL normalised by the token count of the whole step (all micro-batches, ranks)."""
    from megatron_dapo.training.forward import token_logprobs

    def loss_fn(batch, logits):
        lp = token_logprobs(logits, batch["tokens"], arch.vocab_size)
        mask = batch["loss_mask"][:, 1:].float()
        return -(lp * mask).sum() / global_tokens, {}

    return loss_fn


def dp_optimizer_step(hf_cfg: dict, tp: int, pp: int, distributed_optimizer: bool, split: bool):
    """One AdamW step on the concatenated batch; with ``split`` each DP rank gets its own half.

    Returns the full (TP-gathered) parameters of this rank's PP stage after the step.
    """
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.setup import OptimizerOptions, build_policy, train_step
    from tests.tiny import random_hf_model
    from tests.tolerances import COMPARE_ADAM_EPS

    init_parallel(tp, pp, seed=1234)
    hf = random_hf_model(hf_cfg, seed=0)
    sd = hf.state_dict()
    # eps: tests/tolerances.py (weights are compared after the step)
    opt = OptimizerOptions(
        lr=1e-3,
        weight_decay=0.1,
        clip_grad=1.0,
        use_distributed_optimizer=distributed_optimizer,
        adam_eps=COMPARE_ADAM_EPS,
    )
    policy = build_policy(hf_cfg, ModelBuildOptions(), opt)
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    # DDP keeps fp32 main params in the optimizer: re-sync them from the loaded weights.
    policy.optimizer.reload_model_params()

    g = torch.Generator().manual_seed(11)
    data = torch.randint(0, policy.arch.vocab_size, (4, 10), generator=g)
    mask = torch.ones_like(data)
    mask[0, 7:] = 0  # unequal lengths
    mask[3, 4:] = 0
    global_tokens = float(mask[:, 1:].sum())
    if split:
        dp_rank, dp = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        rows = torch.arange(4).chunk(dp)[dp_rank]
    else:
        rows = torch.arange(4)
    mbs = [{"tokens": data[r : r + 1], "loss_mask": mask[r : r + 1]} for r in rows.tolist()]
    out = train_step(policy, mbs, _nll_loss_fn(policy.arch, global_tokens))
    assert out["update_successful"]
    full = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    return {"params": full, "grad_norm": out["grad_norm"], "dp": ps.get_data_parallel_world_size()}


_HELD = []  # groups a body keeps alive on purpose (test_destroy_parallel)


def hold_new_groups(n: int) -> int:
    """Make ``n`` gloo groups and keep them referenced, as a leaking model would."""
    import torch.distributed as dist

    _HELD.extend(dist.new_group(backend="gloo") for _ in range(n))
    return os.getpid()


class _Records:
    """A logging handler that keeps the messages of one logger (attached to that logger itself,
    so the logger's own filters apply to what it sees, as to every other handler)."""

    def __init__(self, name: str):
        import logging

        self.messages: list = []
        self.log = logging.getLogger(name)
        self.handler = logging.Handler()
        self.handler.emit = lambda r: self.messages.append(r.getMessage())  # type: ignore[method-assign]
        self.level = self.log.level

    def __enter__(self):
        import logging

        self.log.addHandler(self.handler)
        self.log.setLevel(logging.DEBUG)
        return self.messages

    def __exit__(self, *exc):
        self.log.removeHandler(self.handler)
        self.log.setLevel(self.level)


def build_messages(hf_cfg: dict, dist_opt: bool) -> dict:
    """Build the policy (model, DDP, optimizer) on this rank and return what megatron-core's GPTModel
    and DDP loggers said, with our wrapper and, as the control, with DDP built again without the
    layout and the model built again without the deprecation filter."""
    from megatron.core.distributed import DistributedDataParallel

    from megatron_dapo import platform_imports
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, provider
    from megatron_dapo.training.setup import OptimizerOptions, build_policy, wrap_ddp

    init_parallel(1, 1, 1, seed=0)
    gpt, ddp = "megatron.core.models.gpt.gpt_model", "megatron.core.distributed.distributed_data_parallel"
    with _Records(gpt) as gpt_said, _Records(ddp) as ddp_said:
        policy = build_policy(
            hf_cfg, ModelBuildOptions(), OptimizerOptions(lr=1e-3, use_distributed_optimizer=dist_opt)
        )
    out = {"gpt": list(gpt_said), "ddp": list(ddp_said)}
    import logging

    log = logging.getLogger(gpt)
    ours = [f for f in log.filters if isinstance(f, platform_imports._DropLinesStartingWith)]
    quiet = provider.quiet_gptmodel_deprecation
    for f in ours:
        log.removeFilter(f)
    provider.quiet_gptmodel_deprecation = lambda: None  # the control: a build that does not filter
    try:
        with _Records(gpt) as said:
            provider.build_gpt_model(hf_cfg, ModelBuildOptions())
        out["gpt_unfiltered"] = list(said)
    finally:
        provider.quiet_gptmodel_deprecation = quiet
        for f in ours:
            log.addFilter(f)
    inner = policy.model.module
    wrapped = wrap_ddp(inner, inner.config, dist_opt)
    with _Records(ddp) as said:
        DistributedDataParallel(config=inner.config, ddp_config=wrapped.ddp_config, module=inner)
    out["ddp_without_layout"] = list(said)
    return out
