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


def _sample(prompt):
    from megatron_dapo.driver.batch import Sample

    return Sample(prompt_index=0, prompt_ids=list(prompt), response_ids=[], engine_logprobs=[], finish_reason="abort",
                  ground_truth="1", token_versions=[])


def test_partial_rollout_carry_over_and_state_dict(tmp_path):
    """A prefix aborted after 3 tokens, continued by an engine with OTHER weights: the prefix's
    positions keep the routing they were generated under, the continuation adds its own; the
    rollout manager's state_dict (trainer_state.pt) keeps it."""
    from megatron_dapo.driver.batch import Group
    from megatron_dapo.driver.rollout_manager import CarryOver, extend_sample
    from megatron_dapo.rollout.base import SamplingParams

    e1, m1 = _engine(seed=0)
    e2, m2 = _engine(seed=5)
    prompt = [5, 9, 11, 3]
    s = _sample(prompt)
    first = e1.generate([prompt], SamplingParams(max_new_tokens=3, seed=1, ignore_eos=True, return_routed_experts=True))[0][0]
    extend_sample(s, dataclasses_replace(first, finish_reason="abort"), step=1, max_len=8)
    assert tuple(s.routed_experts.shape) == (len(prompt) + 2, 2, 2)
    cont = e2.generate([prompt + s.response_ids],
                       SamplingParams(max_new_tokens=5, seed=2, ignore_eos=True, return_routed_experts=True))[0][0]
    extend_sample(s, cont, step=2, max_len=8)
    assert len(s.response_ids) == 8 and s.finish_reason == "length"
    r = s.routed_experts
    assert tuple(r.shape) == (len(prompt) + 8 - 1, 2, 2)
    n1 = len(prompt) + 2
    assert torch.equal(r[:n1], first.routed_experts)  # generated under the first weights
    full2 = _own_routing(m2, prompt + s.response_ids[:-1])
    assert _same_sets(r[n1:], full2[n1:])
    assert not _same_sets(r, full2)  # the two routers differ somewhere on the prefix
    # state_dict round trip through torch.save (the driver's trainer_state.pt)
    carry = CarryOver()
    carry.pending = [Group(0, [s])]
    torch.save(carry.state_dict(), tmp_path / "st.pt")
    back = CarryOver()
    back.load_state_dict(torch.load(tmp_path / "st.pt", weights_only=False))
    assert torch.equal(back.pending[0].samples[0].routed_experts, r)
    assert back.pending[0].samples[0].to_worker()["routed_experts"] is not None


def dataclasses_replace(o, **kw):
    import dataclasses

    return dataclasses.replace(o, **kw)
