"""Routing replay test bodies: run on every gloo rank (module-level so they pickle by name)."""

from __future__ import annotations

import torch


def replay_logprobs(hf_cfg: dict, sd: dict, samples: list, ep: int, packing: bool, cp: int = 1):
    """The trainer (weights ``sd``) on ``samples`` (with the engine's ``routed_experts``), its
    router replay off then on: rank 0 returns ``{on: (logprobs, stats)}`` and whether, with
    replay, every router used exactly the engine's experts on every position that has them."""
    import torch.distributed as dist

    from megatron_dapo.training import dapo_step as ds
    from megatron_dapo.training import packing as pk
    from megatron_dapo.training import routing_replay as rr
    from tests.moe.bodies import build_from_hf

    model, arch = build_from_hf(hf_cfg, sd, ep=ep, cp=cp)
    assert rr.install(model) == hf_cfg["num_hidden_layers"]
    model.eval()
    out = {}
    equal = None
    with torch.no_grad():
        for on in (False, True):
            rr.set_replay(model, on)
            lps = ds.compute_logprobs(model, samples, arch.vocab_size, len(samples), 256 if packing else None, packing=packing)
            if on and not packing:  # one padded micro-batch: the routers' last call saw all of it
                want = rr.token_major(pk.routing_rows(samples, [max(len(x["tokens"]) for x in samples)] * len(samples)))
                equal = True
                for r in rr.replay_routers(model):
                    t = want[:, r.layer].long()
                    have = (t >= 0).all(-1)
                    equal &= bool(have.sum() > 0) and torch.equal(r.recorded_topk_idx[have].sort(-1).values,
                                                                 t[have].sort(-1).values)
            out[on] = (lps, rr.collect_stats(model)["stats"])
    return (out, equal) if dist.get_rank() == 0 else None
