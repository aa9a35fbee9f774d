"""Test bodies that run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

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
    load_hf_weights(model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp))
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
