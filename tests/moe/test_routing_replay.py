"""Routing replay (R3) for Qwen3-MoE (docs/moe.md "Routing replay"): the engines' routed experts,
their carry-over across partial-rollout continuations and checkpoints, the trainer's replay,
the routing metrics, and one e2e DAPO run with ``--routing-replay``."""

from __future__ import annotations

import torch

from tests.tiny import random_hf_model, tiny_qwen3_moe_config


def _engine(seed=0, **over):
    from megatron_dapo.rollout.hf_engine import HFEngine

    m = random_hf_model(tiny_qwen3_moe_config(**over), seed=seed)
    return HFEngine((m.config, dict(m.state_dict())), seed=1), m


def _own_routing(model, ids):
    """The HF model's router top-k (as sets) at every position of ``ids`` (teacher-forced)."""
    from megatron_dapo.rollout.routing import RoutingRecorder

    rec = RoutingRecorder.attach(model)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    out = rec.last(1, len(ids))[0]
    rec.remove()
    return out


def _same_sets(a, b):
    return torch.equal(a.sort(-1).values, b.sort(-1).values)


def test_hf_engine_routed_experts_blocking_and_streaming():
    from megatron_dapo.rollout.base import Request, SamplingParams

    eng, model = _engine()
    prompts = [[5, 9, 11, 3], [7, 2]]
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, n=2, seed=3, return_routed_experts=True, ignore_eos=True)
    outs = eng.generate(prompts, sp)
    for p, group in zip(prompts, outs):
        for o in group:
            r = o.routed_experts
            assert r is not None and r.dtype == torch.int16
            assert tuple(r.shape) == (len(p) + len(o.output_ids) - 1, 2, 2)  # positions x layers x top-2
            assert _same_sets(r, _own_routing(model, p + o.output_ids[:-1]))
    # without the request flag: nothing
    assert eng.generate(prompts, SamplingParams(max_new_tokens=2))[0][0].routed_experts is None
    # streaming: two requests of different prompts, one aborted mid-way
    sp1 = SamplingParams(temperature=1.0, max_new_tokens=5, seed=4, return_routed_experts=True, ignore_eos=True)
    eng.submit([Request("a", [5, 9, 11, 3], sp1), Request("b", [7, 2, 8], sp1)])
    done = eng.poll(30.0)
    rest = eng.abort_requests()
    got = {f.rid: f.output for f in done + rest}
    assert set(got) == {"a", "b"}
    for o in got.values():
        if not o.output_ids:
            continue
        r = o.routed_experts
        assert tuple(r.shape) == (len(o.prompt_ids) + len(o.output_ids) - 1, 2, 2)
        assert _same_sets(r, _own_routing(model, o.prompt_ids + o.output_ids[:-1]))
