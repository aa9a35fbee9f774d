"""Gloo-rank bodies for packed sequences and context parallelism (module-level: they pickle by name)."""

from __future__ import annotations

from dataclasses import replace

import torch

from megatron_dapo.training.item import TrainItem


def _samples(vocab: int, n: int = 5, seed: int = 5):
    """Samples of unequal lengths (prompt 2-4 tokens), one overlong-filtered (train False)."""
    g = torch.Generator().manual_seed(seed)
    lens = [9, 17, 6, 13, 22, 11, 8][:n]
    out = []
    for i, L in enumerate(lens):
        toks = torch.randint(3, vocab, (L,), generator=g).tolist()
        out.append(
            TrainItem(tokens=toks, prompt_len=2 + i % 3, advantage=float(torch.randn(1, generator=g)), train=i != 2)
        )
    return out


def _build(hf_cfg: dict, tp: int, pp: int, cp: int):
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions, build_gpt_model, padded_vocab_size
    from tests.tiny import random_hf_model

    init_parallel(tp, pp, cp, seed=1234)
    hf = random_hf_model(hf_cfg, seed=0)
    opts = ModelBuildOptions(context_parallel_size=cp)
    model, arch, cfg = build_gpt_model(hf_cfg, opts)
    cfg.calculate_per_token_loss = True  # micro-batch losses summed as given, as the trainer runs (no DDP here)
    sd = hf.state_dict()
    load_hf_weights(
        model, arch, lambda n: sd[n], padded_vocab_size(arch.vocab_size, opts.make_vocab_size_divisible_by, tp)
    )
    return model, arch


def _logprobs_and_grads(model, arch, samples, packing: bool, max_tokens):
    """compute_logprobs, then one DAPO loss backward (entropy bonus on); grads by parameter name."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.training import dapo_step as ds
    from megatron_dapo.training.forward import forward_backward

    lps = ds.compute_logprobs(model, samples, arch.vocab_size, 2, max_tokens, packing=packing)
    algo = AlgorithmConfig(entropy_coef=0.01)
    g_tok = float(sum(s.response_len for s in samples if s.train))
    g_seq = float(sum(1 for s in samples if s.train))
    mbs, _ = ds.make_microbatches(model, samples, 2, max_tokens, packing)
    model.zero_grad(set_to_none=True)
    forward_backward(model, mbs, ds.dapo_loss_fn(algo, arch.vocab_size, g_tok, g_seq), forward_only=False)
    grads = {
        n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()
    }
    if ps.get_context_parallel_world_size() > 1:  # each CP rank holds its share of the gradient
        for t in grads.values():
            torch.distributed.all_reduce(t, group=ps.get_context_parallel_group())
    return lps, grads, len(mbs)


def _with_old(samples, lps, seed=9):
    g = torch.Generator().manual_seed(seed)
    return [
        replace(s, old_logprobs=torch.tensor(lp) + 0.05 * torch.randn(len(lp), generator=g))
        for s, lp in zip(samples, lps)
    ]


def _diff(a, b) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def packed_vs_padded(hf_cfg: dict, tp: int, pp: int):
    """Logprobs and gradients of consecutive (micro-batch size 2) vs token-budget packed THD
    micro-batches under TP/PP (per rank)."""
    from megatron.core import parallel_state as ps

    model, arch = _build(hf_cfg, tp, pp, 1)
    samples = _samples(arch.vocab_size)
    lp0 = _logprobs_list(model, arch, samples)
    samples = _with_old(samples, lp0)
    lp_pad, g_pad, n_pad = _logprobs_and_grads(model, arch, samples, False, None)
    lp_pack, g_pack, n_pack = _logprobs_and_grads(model, arch, samples, True, 40)
    out = {
        "grad": _diff(g_pad, g_pack),
        "grad_scale": max(float(t.abs().max()) for t in g_pad.values()),
        "n_mb": (n_pad, n_pack),
        "lp": None,
    }
    if ps.is_pipeline_last_stage():
        assert [len(x) for x in lp_pad] == [s.response_len for s in samples]
        out["lp"] = max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(lp_pad, lp_pack))
    return out


def _logprobs_list(model, arch, samples):
    from megatron.core import parallel_state as ps

    from megatron_dapo.training import dapo_step as ds

    lps = ds.compute_logprobs(model, samples, arch.vocab_size, 2, None, packing=False)
    # every PP stage needs the old logprobs: broadcast them from the last stage
    obj = [lps]
    if ps.get_pipeline_model_parallel_world_size() > 1:
        src = ps.get_pipeline_model_parallel_last_rank()
        torch.distributed.broadcast_object_list(obj, src=src, group=ps.get_pipeline_model_parallel_group())
    return obj[0]


def cp_vs_no_cp(hf_cfg: dict, tp: int, cp: int):
    """Packed logprobs and summed gradients at CP ``cp`` vs CP 1 (same TP), on every rank."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.distributed import destroy_parallel

    model, arch = _build(hf_cfg, tp, 1, 1)
    samples = _samples(arch.vocab_size)
    samples = _with_old(samples, _logprobs_list(model, arch, samples))
    lp_ref, g_ref, _ = _logprobs_and_grads(model, arch, samples, True, 48)
    destroy_parallel()
    model, arch = _build(hf_cfg, tp, 1, cp)
    assert ps.get_context_parallel_world_size() == cp
    lp_cp, g_cp, n_mb = _logprobs_and_grads(model, arch, samples, True, 48)
    lp = max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(lp_ref, lp_cp))
    gn_ref = float(torch.sqrt(sum((t.double() ** 2).sum() for t in g_ref.values())))
    gn_cp = float(torch.sqrt(sum((t.double() ** 2).sum() for t in g_cp.values())))
    return {
        "lp": lp,
        "grad": _diff(g_ref, g_cp),
        "grad_norm": (gn_ref, gn_cp),
        "n_mb": n_mb,
        "lens": [len(x) for x in lp_cp] == [s.response_len for s in samples],
    }


def chunked_logprobs_tp(seed: int = 0):
    """Chunked vocab-parallel logprobs/entropy and their gradients at TP2 vs a float64 full-vocab reference."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.training.logprobs import chunked_logprobs_entropy

    init_parallel(2, 1, 1)
    r = ps.get_tensor_model_parallel_rank()
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(2, 9, 64, generator=g, dtype=torch.float64) * 3
    target = torch.randint(0, 60, (2, 9), generator=g)
    w1, w2 = torch.randn(2, 9, generator=g), torch.randn(2, 9, generator=g)
    true_vocab, T = 60, 0.7
    shard = full[..., r * 32 : (r + 1) * 32].float().clone().requires_grad_(True)
    lp, ent = chunked_logprobs_entropy(shard, target, true_vocab, T, chunk_size=5)
    ((lp * w1).sum() + (ent * w2).sum()).backward()
    ref_x = full.clone().requires_grad_(True)
    z = ref_x[..., :true_vocab] / T
    ref_lp = torch.log_softmax(z, -1).gather(-1, target[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    ((ref_lp * w1).sum() + (ref_ent * w2).sum()).backward()
    ref_g = ref_x.grad[..., r * 32 : (r + 1) * 32]
    return {
        "lp": float((lp.double() - ref_lp).abs().max()),
        "ent": float((ent.double() - ref_ent).abs().max()),
        "grad": float((shard.grad.double() - ref_g).abs().max()),
    }


def minibatch_step(hf_cfg: dict, cp: int, packing: bool, shard: bool):
    """One ``train_on_minibatch`` optimizer step on 2 ranks: DP 2 (each its own Karmarkar-Karp
    shard when ``shard``) or CP 2 (both ranks the whole mini-batch). Returns the full
    parameters after the step, the reduced metric sums, the grad norm and the imbalance."""
    from megatron.core import parallel_state as ps

    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.checkpoint.model_io import gather_full_weights, load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.driver.batch import dp_shards
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.dapo_step import train_on_minibatch
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.tiny import random_hf_model
    from tests.tolerances import COMPARE_ADAM_EPS

    init_parallel(1, 1, cp, seed=1234)
    hf = random_hf_model(hf_cfg, seed=0)
    sd = hf.state_dict()
    # eps: tests/tolerances.py (weights are compared after the step)
    policy = build_policy(
        hf_cfg,
        ModelBuildOptions(context_parallel_size=cp),
        OptimizerOptions(lr=1e-4, clip_grad=1.0, adam_eps=COMPARE_ADAM_EPS),
    )
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    samples = _samples(policy.arch.vocab_size, n=6)
    g = torch.Generator().manual_seed(9)
    samples = [replace(s, old_logprobs=-3.0 + 0.3 * torch.randn(s.response_len, generator=g)) for s in samples]
    if shard:
        samples = dp_shards(samples, ps.get_data_parallel_world_size())[ps.get_data_parallel_rank()]
    out = train_on_minibatch(
        policy, samples, AlgorithmConfig(entropy_coef=0.01), policy.arch.vocab_size, 2, 48, packing=packing
    )
    assert out.update_successful
    full = {n: t.clone() for n, t in gather_full_weights(policy.model, policy.arch)}
    return {
        "params": full,
        "sums": loss_sums(out),
        "grad_norm": out.grad_norm,
        "imbalance": out.dp_token_imbalance,
        "tokens": out.global_tokens,
    }


def _pin_samples(vocab: int):
    """Six samples of unequal lengths with every field the loss reads: old logprobs (set by the
    caller), the engine's, a reference policy's, one overlong-filtered, one with a stale prefix."""
    samples = _samples(vocab, n=6)
    g = torch.Generator().manual_seed(11)
    out = []
    for i, s in enumerate(samples):
        n = s.response_len
        out.append(
            replace(
                s,
                engine_logprobs=-3.0 + 0.3 * torch.randn(n, generator=g),
                ref_logprobs=-3.0 + 0.3 * torch.randn(n, generator=g),
                stale_len=3 if i == 1 else 0,
            )
        )
    return out


def pinned_step(hf_cfg: dict, packing: bool):
    """Old logprobs, then one ``train_on_minibatch`` step (KL to a reference, --tis-mode
    token-truncate, --partial-rollout-offpolicy correct, an entropy bonus) on one rank, from
    the same random weights: what the pinned test compares across batching paths."""
    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training.dapo_step import compute_logprobs, train_on_minibatch
    from megatron_dapo.training.setup import OptimizerOptions, build_policy
    from tests.tiny import random_hf_model

    init_parallel(1, 1, 1, seed=1234)
    hf = random_hf_model(hf_cfg, seed=0)
    sd = hf.state_dict()
    policy = build_policy(hf_cfg, ModelBuildOptions(), OptimizerOptions(lr=1e-4, clip_grad=1.0))
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    V = policy.arch.vocab_size
    samples = _pin_samples(V)
    budget = 40 if packing else None
    lps = compute_logprobs(policy, samples, V, 2, budget, temperature=0.9, packing=packing)
    g = torch.Generator().manual_seed(9)
    samples = [
        replace(s, old_logprobs=torch.tensor(lp) + 0.05 * torch.randn(len(lp), generator=g))
        for s, lp in zip(samples, lps)
    ]
    algo = AlgorithmConfig(entropy_coef=0.01, kl_coef=0.05, tis_mode="token-truncate", tis_cap=1.5)
    out = train_on_minibatch(policy, samples, algo, V, 2, budget, temperature=0.9, packing=packing, offpolicy="correct")
    assert out.update_successful
    return {
        "lps": lps,
        "means": {k: s / c for k, (s, c) in loss_sums(out).items() if c},
        "grad_norm": out.grad_norm,
        "num_microbatches": out.num_microbatches,
        "tokens": out.global_tokens,
    }


def loss_sums(out) -> dict:
    """A ``StepStats``' loss metric pairs by name: ``{name: (sum, count)}``."""
    return {k: getattr(out.loss, k) for k in out.loss.pair_names()}
