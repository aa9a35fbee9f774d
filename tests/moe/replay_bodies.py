"""Routing replay test bodies: run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

from dataclasses import replace

import torch


def replay_logprobs(hf_cfg: dict, sd: dict, samples: list, ep: int, packing: bool, cp: int = 1, pp: int = 1):
    """The trainer (weights ``sd``) on ``samples`` (with the engine's ``routed_experts``), its
    router replay off then on: rank 0 returns ``{on: (logprobs, stats)}`` and whether, with
    replay, every router used exactly the engine's experts on every position that has them."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from megatron_dapo.training import dapo_step as ds
    from megatron_dapo.training import packing as pk
    from megatron_dapo.training import routing_replay as rr
    from tests.moe.bodies import build_from_hf

    model, arch = build_from_hf(hf_cfg, sd, pp=pp, ep=ep, cp=cp)
    assert rr.install(model) == hf_cfg["num_hidden_layers"] // pp
    model.eval()
    out = {}
    equal = None
    with torch.no_grad():
        for on in (False, True):
            rr.set_replay(model, on)
            lps = ds.compute_logprobs(
                model, samples, arch.vocab_size, len(samples), 256 if packing else None, packing=packing
            )
            if on and not packing:  # one micro-batch of all samples: the routers' last call saw all of it
                want = rr.token_major(pk.pack_samples(samples)["routed_experts"])
                equal = True
                for r in rr.replay_routers(model):
                    t = want[:, r.layer].long()
                    have = (t >= 0).all(-1)
                    equal &= bool(have.sum() > 0) and torch.equal(
                        r.recorded_topk_idx[have].sort(-1).values, t[have].sort(-1).values
                    )
            out[on] = (lps, rr.collect_stats(model)["stats"])
    if pp > 1:  # each stage checked its own layers; the last stage reports the logprobs
        flags = [None] * dist.get_world_size()
        dist.all_gather_object(flags, equal)
        equal = all(flags)
        return (out, equal) if ps.is_pipeline_last_stage() else None
    return (out, equal) if dist.get_rank() == 0 else None


def replay_train_step(hf_cfg: dict, sd: dict, samples: list, recompute: bool, replay: bool):
    """One DAPO optimizer step at EP2 (DP2: rank r trains samples r, r + 2, ...) with the router
    replay on or off, full activation recompute or none: the grad norm and the routing stats."""
    import torch.distributed as dist

    from megatron_dapo.algo.config import AlgorithmConfig
    from megatron_dapo.checkpoint.model_io import load_hf_weights
    from megatron_dapo.distributed import init_parallel
    from megatron_dapo.models import ModelBuildOptions
    from megatron_dapo.training import dapo_step as ds
    from megatron_dapo.training import routing_replay as rr
    from megatron_dapo.training.setup import OptimizerOptions, build_policy

    init_parallel(1, 1, seed=1234, expert_model_parallel_size=2)
    rc = dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1) if recompute else {}
    policy = build_policy(hf_cfg, ModelBuildOptions(**rc), OptimizerOptions(lr=1e-3, clip_grad=0.0))
    load_hf_weights(policy.model, policy.arch, lambda n: sd[n], policy.padded_vocab)
    policy.optimizer.reload_model_params()
    rr.install(policy.model)
    rr.set_replay(policy.model, replay)
    mine = [replace(s, advantage=1.0 if i % 2 else -1.0) for i, s in enumerate(samples)][dist.get_rank() :: 2]
    old = ds.compute_logprobs(policy, mine, policy.arch.vocab_size, 2)
    mine = [replace(s, old_logprobs=lp) for s, lp in zip(mine, old)]
    out = ds.train_on_minibatch(policy, mine, AlgorithmConfig(), policy.arch.vocab_size, 1)
    assert all(not r.replay_backward_list for r in rr.replay_routers(policy.model))  # every target consumed/cleared
    return {"grad_norm": out.grad_norm, "routing": out.routing["stats"]} if dist.get_rank() == 0 else None
