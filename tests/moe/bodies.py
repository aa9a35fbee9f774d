"""Mixture-of-experts test bodies: run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

import torch


def build_from_hf(hf_cfg: dict, sd: dict, tp: int = 1, pp: int = 1, ep: int = 1, etp=None, opts=None):
    """Parallel state with EP/ETP and the megatron model with the HF tensors ``sd`` (the HF
    checkpoint's names, ``tests.tiny.checkpoint_state_dict``) loaded. Returns (model, arch)."""
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size

    init_parallel(tp, pp, seed=1234, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    opts = opts or ModelBuildOptions()
    model, arch, _ = build_gpt_model(hf_cfg, opts)
    load_hf_weights(model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp))
    return model, arch


def megatron_logits(model, arch, tokens):
    """Full-vocab logits of ``tokens`` on the last PP stage (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.training.forward import forward_backward, gather_vocab

    got = []

    def loss_fn(batch, logits):
        got.append(gather_vocab(logits)[..., : arch.vocab_size].detach().float())
        return logits.sum() * 0, {}

    model.eval()
    with torch.no_grad():
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
    return got[0] if ps.is_pipeline_last_stage() else None


def logits(hf_cfg: dict, sd: dict, tokens_by_dp: list, tp: int, pp: int, ep: int = 1, etp=None):
    """``(dp rank, logits)`` of ``tokens_by_dp[dp rank]`` on the last stage's TP rank 0 (None
    elsewhere). Each DP rank feeds other tokens, so the EP all-to-all moves tokens of
    different sequences between ranks."""
    from megatron.core import parallel_state as ps

    model, arch = build_from_hf(hf_cfg, sd, tp, pp, ep, etp)
    dp = ps.get_data_parallel_rank()
    got = megatron_logits(model, arch, tokens_by_dp[dp])
    if got is None or ps.get_tensor_model_parallel_rank() != 0:
        return None
    return dp, got


def checkpoint_logits(hf_cfg: dict, ckpt_dir: str, tokens, tp: int, pp: int, ep: int = 1, etp=None):
    """Load the torch_dist checkpoint at TP x PP x EP (x ETP) and return the logits of
    ``tokens`` on the last stage's TP rank 0 of DP rank 0 (None elsewhere)."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.checkpoint.dist_ckpt import load_checkpoint
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model

    # a seed unlike the HF model's: the weights must come from the checkpoint
    init_parallel(tp, pp, seed=4321, expert_model_parallel_size=ep, expert_tensor_parallel_size=etp)
    model, arch, _ = build_gpt_model(hf_cfg, ModelBuildOptions())
    load_checkpoint(model, ckpt_dir, arch)
    got = megatron_logits(model, arch, tokens)
    if got is None or ps.get_tensor_model_parallel_rank() != 0 or ps.get_data_parallel_rank() != 0:
        return None
    return got
