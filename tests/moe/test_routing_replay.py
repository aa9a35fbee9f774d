"""Routing replay (R3) for Qwen3-MoE (docs/moe.md "Routing replay"): the engines' routed experts,
their carry-over across partial-rollout continuations and checkpoints, the trainer's replay,
the routing metrics. The e2e DAPO run with ``--routing-replay`` (EP 2, the distributed
optimizer, the driver on Ray): tests/moe/test_moe_e2e.py."""

from __future__ import annotations

import math

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
            assert r is not None and r.dtype == torch.uint8  # 8 experts: one byte per id
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

    return Sample(
        prompt_index=0,
        prompt_ids=list(prompt),
        response_ids=[],
        engine_logprobs=[],
        finish_reason="abort",
        ground_truth="1",
        token_versions=[],
    )


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
    first = e1.generate(
        [prompt], SamplingParams(max_new_tokens=3, seed=1, ignore_eos=True, return_routed_experts=True)
    )[0][0]
    extend_sample(s, dataclasses_replace(first, finish_reason="abort"), step=1, max_len=8)
    assert tuple(s.routed_experts.shape) == (len(prompt) + 2, 2, 2)
    cont = e2.generate(
        [prompt + s.response_ids], SamplingParams(max_new_tokens=5, seed=2, ignore_eos=True, return_routed_experts=True)
    )[0][0]
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
    assert back.pending[0].samples[0].to_item().routed_experts is not None
    # a prefix that came back without routing takes the continuation's rows of it
    s2 = _sample(prompt)
    extend_sample(s2, dataclasses_replace(first, finish_reason="abort", routed_experts=None), step=1, max_len=8)
    assert s2.routed_experts is None
    extend_sample(s2, cont, step=2, max_len=8)
    assert torch.equal(s2.routed_experts, cont.routed_experts)


def dataclasses_replace(o, **kw):
    import dataclasses

    return dataclasses.replace(o, **kw)


def _perturbed_engine_samples(n=4, new=10):
    """Samples generated by an engine whose routers are perturbed from the trainer's weights
    (returns the samples and the trainer's HF config and checkpoint tensors)."""
    from megatron_dapo.rollout.base import SamplingParams
    from megatron_dapo.rollout.hf_engine import HFEngine
    from tests.tiny import checkpoint_state_dict

    cfg = tiny_qwen3_moe_config()
    trainer = random_hf_model(cfg, seed=3)
    engine = random_hf_model(cfg, seed=3)
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in engine.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.add_(0.04 * torch.randn(p.shape, generator=g))
    eng = HFEngine((engine.config, dict(engine.state_dict())), seed=1)
    prompts = [torch.randint(0, cfg["vocab_size"], (5 + i,), generator=g).tolist() for i in range(n)]
    outs = eng.generate(
        prompts, SamplingParams(max_new_tokens=new, seed=5, ignore_eos=True, return_routed_experts=True)
    )
    from megatron_dapo.training.item import TrainItem

    samples = [
        TrainItem(
            tokens=o.prompt_ids + o.output_ids,
            prompt_len=len(o.prompt_ids),
            engine_logprobs=o.logprobs,
            routed_experts=o.routed_experts,
        )
        for (o,) in outs
    ]
    return samples, cfg, checkpoint_state_dict(trainer)


def _gap(lps, samples):
    return sum(abs(a - b) for x, s in zip(lps, samples) for a, b in zip(x, s.engine_logprobs.tolist())) / sum(
        len(s.engine_logprobs) for s in samples
    )


import pytest  # noqa: E402


@pytest.mark.gloo
@pytest.mark.parametrize(
    "ep,packing,cp,pp",
    [(1, False, 1, 1), (2, False, 1, 1), (2, True, 1, 1), (2, True, 2, 1), (1, False, 1, 2)],
    ids=["ep1-padded", "ep2-padded", "ep2-packed", "cp2xep2-packed", "pp2-padded"],
)
def test_replay_equals_recorded_routing_and_shrinks_gap(gloo, ep, packing, cp, pp):
    from tests.moe import replay_bodies

    samples, cfg, sd = _perturbed_engine_samples()
    ((out, equal),) = [
        g for g in gloo(2).run(replay_bodies.replay_logprobs, cfg, sd, samples, ep, packing, cp, pp) if g
    ]
    if not packing:
        assert equal  # every router used the engine's experts on every recorded position
    (lp_off, st_off), (lp_on, st_on) = out[False], out[True]
    gap_off, gap_on = _gap(lp_off, samples), _gap(lp_on, samples)
    agree = st_off[:, 0] / st_off[:, 1]
    assert float(agree.min()) < 1.0  # the perturbed routers route some tokens differently
    assert gap_on < 0.5 * gap_off, (gap_on, gap_off)
    # loads count every real token's top-2 of both layers; entropy within (0, log 8]
    n_tokens = sum(s.n_tokens for s in samples)
    assert torch.equal(st_on[:, 4:].sum(1), torch.full((2,), 2.0 * n_tokens, dtype=torch.float64))
    ent = st_on[:, 2] / st_on[:, 3]
    assert bool(((ent > 0) & (ent <= torch.log(torch.tensor(8.0)) + 1e-6)).all())


def test_sglang_routed_experts_decoding_with_the_wheels_encoder():
    """The pinned wheel's own encoder (DetokenizerManager._b64_encode_per_request) and reader
    (extract_routed_experts_from_meta_info), cut out of its source, against our decoding."""
    import base64

    import numpy as np

    from megatron_dapo.rollout.routing import decode_sglang_routed_experts
    from megatron_dapo.rollout.sglang_engine import USED_API, from_sglang_output
    from tests.rollout import sglang_wheel as sw

    src = sw.wheel()
    ns = sw.run(
        sw.extract(
            src, "sglang.srt.managers.detokenizer_manager", ["_b64_encode_per_request"], cls="DetokenizerManager"
        ),
        dict(sw._typing_names(), pybase64=base64, torch=torch),
        "sglang/srt/managers/detokenizer_manager.py",
    )
    ns = sw.run(
        sw.extract(src, "sglang.srt.state_capturer.routed_experts", ["extract_routed_experts_from_meta_info"]),
        dict(ns, np=np),
        "sglang/srt/state_capturer/routed_experts.py",
    )
    prompt, output = [1, 2, 3, 4], [5, 6, 7]
    n, L, k = len(prompt) + len(output) - 1, 2, 2
    rows = torch.randint(0, 8, (n, L, k), dtype=torch.int32)  # the host buffer's rows (int32)
    (enc,) = ns["_b64_encode_per_request"]([rows])
    out = {
        "output_ids": output,
        "text": "",
        "meta_info": {
            "finish_reason": {"type": "length"},
            "routed_experts": enc,
            "output_token_logprobs": [(-0.5, t, None) for t in output],
        },
    }
    assert np.array_equal(ns["extract_routed_experts_from_meta_info"](out), rows.reshape(-1).numpy())
    got = from_sglang_output(out, prompt, (L, k)).routed_experts
    assert got.dtype == torch.int16 and torch.equal(got, rows.to(torch.int16))  # expert count unknown
    got = from_sglang_output(out, prompt, (L, k, 128)).routed_experts
    assert got.dtype == torch.uint8 and torch.equal(got.long(), rows.long())
    assert from_sglang_output(out, prompt).routed_experts is None  # not asked
    with pytest.raises(ValueError, match="positions"):
        from_sglang_output(out, prompt + [9], (L, k))
    with pytest.raises(ValueError, match="rows of 5 layers"):
        decode_sglang_routed_experts(enc, 5, k)
    assert "enable_return_routed_experts" in USED_API["server_args"]


def test_routing_metric_functions():
    from megatron_dapo.algo.routing_metrics import layer_metrics, load_imbalance, router_entropy, topk_agreement

    a = torch.tensor([[0, 1], [2, 3], [4, 5]])
    b = torch.tensor([[1, 0], [2, 7], [6, 7]])
    assert topk_agreement(a, b).tolist() == [1.0, 0.5, 0.0]
    assert float(router_entropy(torch.full((1, 8), 1 / 8))) == pytest.approx(math.log(8))
    assert float(router_entropy(torch.tensor([[1.0, 0.0]]))) == 0.0
    assert load_imbalance(torch.tensor([4.0, 0, 0, 0])) == 4.0 and load_imbalance(torch.zeros(4)) == 1.0
    st = torch.tensor([[3.0, 4.0, 2.0, 4.0, 2, 2, 2, 2], [0.0, 0.0, 1.0, 2.0, 8, 0, 0, 0]], dtype=torch.float64)
    m = layer_metrics(st)
    assert m["moe/routing_agreement/layer_0"] == 0.75 and "moe/routing_agreement/layer_1" not in m
    assert m["moe/routing_agreement"] == 0.75 and m["moe/routing_agreement_min"] == 0.75
    assert m["moe/load_imbalance/layer_0"] == 1.0 and m["moe/load_imbalance/layer_1"] == 4.0
    assert m["moe/load_imbalance_max"] == 4.0 and m["moe/router_entropy"] == pytest.approx(0.5 * (0.5 + 0.5))


def test_diagnosis_places_routing_under_exploration_and_alerts_on_drift():
    from megatron_dapo.diagnostics.analysis import diagnose
    from megatron_dapo.diagnostics.history import History

    def rows(agree, imbalance):
        return [
            {
                "step": i + 1,
                "entropy": 0.5,
                "moe/routing_agreement_min": a,
                "moe/load_imbalance_max": imbalance,
                "moe/router_entropy": 1.5,
            }
            for i, a in enumerate(agree)
        ]

    healthy = diagnose(History.from_records(rows([0.97] * 20, 1.5))).boundary("exploration")
    assert healthy.status == "ok" and "moe/routing_agreement_min" in healthy.metrics
    drift = diagnose(History.from_records(rows([0.97] * 10 + [0.85] * 10, 1.5))).boundary("exploration")
    assert [a.kind for a in drift.alerts] == ["routing_drift"] and 11 <= drift.alerts[0].step <= 15  # (smoothed onset)
    slow = diagnose(History.from_records(rows([0.99] * 10 + [0.92] * 10, 1.5))).boundary("exploration")
    assert [a.kind for a in slow.alerts] == ["routing_drift"]  # above 0.9 but 0.07 below its early value
    collapse = diagnose(History.from_records(rows([0.97] * 20, 6.0))).boundary("exploration")
    assert [a.kind for a in collapse.alerts] == ["router_collapse"]


@pytest.mark.gloo
def test_replay_in_training_with_recompute(gloo):
    """Training with replay: full activation recompute (the router runs again inside backward)
    replays the forward's targets: the same gradient as without recompute; replay off gives
    another gradient (the routing matters)."""
    from tests.moe import replay_bodies

    samples, cfg, sd = _perturbed_engine_samples()

    def step(recompute, replay):
        (got,) = [g for g in gloo(2).run(replay_bodies.replay_train_step, cfg, sd, samples, recompute, replay) if g]
        return got

    plain, recomputed, free = step(False, True), step(True, True), step(True, False)
    assert abs(plain["grad_norm"] - recomputed["grad_norm"]) < 1e-6 * plain["grad_norm"], (plain, recomputed)
    assert abs(plain["grad_norm"] - free["grad_norm"]) > 1e-4 * plain["grad_norm"]
    assert torch.equal(plain["routing"], recomputed["routing"])  # recompute calls are not counted twice


def test_routing_replay_flag_refused_on_a_dense_model():
    from megatron_dapo.config import ConfigError
    from megatron_dapo.config.validate import validate
    from megatron_dapo.models import parse_hf_config
    from tests.moe.test_moe_config import CLUSTER, QWEN3_30B_A3B
    from tests.tiny import tiny_qwen3_config

    with pytest.raises(
        ConfigError, match=r"^--routing-replay: the model \(qwen3, --hf-checkpoint config\) has no experts"
    ):
        validate(parse_args_(CLUSTER + ["--routing-replay"]), parse_hf_config(tiny_qwen3_config()), on_gpu=True)
    cfg = parse_args_(CLUSTER + ["--routing-replay", "--expert-model-parallel-size", "8"])
    assert cfg.moe.routing_replay
    validate(cfg, parse_hf_config(QWEN3_30B_A3B), on_gpu=True)
    assert not parse_args_(CLUSTER).moe.routing_replay  # default off


def parse_args_(argv):
    from megatron_dapo.config import parse_args

    return parse_args(argv)


def test_routing_rows_follow_the_tokens_padded_packed_cp_and_sp():
    """Alignment rule: routing row t of a sample sits where its input token t sits, in packed
    (THD) micro-batches, after the CP zigzag split and the SP slice of ``token_major``, and in
    one row per sample (``routing_rows``); -1 on positions without engine routing, -2 on padding."""
    from megatron_dapo.training import packing as pk
    from megatron_dapo.training.item import TrainItem
    from megatron_dapo.training.routing_replay import token_major

    def sample(n, p):
        toks = list(range(10 * n, 10 * n + n))
        r = torch.tensor(toks[:-1], dtype=torch.int16).view(-1, 1, 1).expand(n - 1, 2, 2).clone()  # row t = token t
        return TrainItem(
            tokens=toks,
            prompt_len=p,
            advantage=1.0,
            old_logprobs=[0.0] * (n - p),
            engine_logprobs=[0.0] * (n - p),
            routed_experts=r,
        )

    def check(tokens, routed):
        have = routed[..., 0, 0] >= 0
        assert torch.equal(routed[..., 0, 0][have].long(), tokens[have])
        return have

    samples = [sample(7, 3), sample(5, 2)]
    rows = pk.routing_rows(samples, [8, 8])
    assert rows[1, 4, 0, 0] == -1 and bool((rows[1, 5:] == -2).all())
    mb = pk.packed_microbatch(samples, multiple=4)  # sequences padded to 8 and 8
    have = check(mb["tokens"], mb["routed_experts"])
    assert have.sum() == 6 + 4  # every position but each sample's last
    assert mb["routed_experts"][0, 8 + 4, 0, 0] == -1 and bool((mb["routed_experts"][0, 8 + 5 :] == -2).all())
    flat = token_major(mb["routed_experts"], tp_size=2, tp_rank=1, sequence_parallel=True)
    assert torch.equal(flat[:, 0, 0], mb["routed_experts"][0, 8:, 0, 0])
    for cp_rank in (0, 1):
        pmb = pk.packed_microbatch(samples, multiple=4, cp_size=2, cp_rank=cp_rank)
        assert pmb["routed_experts"].shape[:2] == pmb["tokens"].shape
        check(pmb["tokens"], pmb["routed_experts"])
    samples[1].routed_experts = None  # a sample without routing routes freely
    mb = pk.packed_microbatch(samples)
    assert bool((mb["routed_experts"][0, 7:12] == -1).all())


def test_the_replay_router_sets_what_megatron_cores_router_replay_sets():
    """ReplayRouter skips RouterReplay.__init__ (no global registration): every attribute the
    installed megatron-core's own __init__ sets (0.19 added static_buffer and layer_number) must
    be set on ours too, or megatron's methods that read them fail."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    from megatron_dapo.training.routing_replay import ReplayRouter

    theirs = RouterReplay()
    RouterReplay.global_router_replay_instances.remove(theirs)
    ours = ReplayRouter(layer=2, num_experts=8, pre_softmax=False)
    missing = sorted(set(vars(theirs)) - set(vars(ours)))
    assert not missing, f"RouterReplay.__init__ sets {missing}, ReplayRouter does not"
    assert ours not in RouterReplay.global_router_replay_instances
    assert ours.layer_number == 3  # megatron's 1-based layer number of the router's layer
