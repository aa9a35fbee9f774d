"""Qwen3 (dense) and Qwen3-MoE built by megatron-core from the HF config give the HF model's
logits: Qwen3 at TP1/TP2 (q/k norms, head_dim != hidden / heads, tied embeddings); Qwen3-MoE
(8 experts, top-2, renormalised) at EP1, EP2, EP2 x TP2 (ETP1: the EP ranks are the TP ranks)
and PP2, two ranks each (ETP2 in test_moe_sync.py, and the checkpoint at EP2 x TP2 in
test_moe_convert.py). Each DP rank feeds other tokens, so the EP all-to-all really moves tokens
between ranks."""

import pytest
import torch

from tests.moe import bodies
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_config, tiny_qwen3_moe_config

pytestmark = [pytest.mark.gloo]

TOL = 1e-5
_HF = {}


def hf_model(name):
    """(config, HF model, its checkpoint tensors) of the tiny model ``name``, built once."""
    if name not in _HF:
        cfg = {"qwen3": tiny_qwen3_config, "qwen3_moe": tiny_qwen3_moe_config}[name]()
        model = random_hf_model(cfg, seed=3)
        _HF[name] = cfg, model, checkpoint_state_dict(model)
    return _HF[name]


def check_logits(gloo, name, world, *layout):
    cfg, model, sd = hf_model(name)
    tokens = [
        torch.randint(0, cfg["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(7 + i))
        for i in range(world)
    ]
    got = [g for g in gloo(world).run(bodies.logits, cfg, sd, tokens, *layout) if g is not None]
    assert got, "no rank reported logits"
    with torch.no_grad():
        for dp, logits in got:
            ref = model(tokens[dp]).logits
            assert logits.shape == ref.shape
            assert float((logits - ref).abs().max()) < TOL, (dp, float((logits - ref).abs().max()))
    return got


@pytest.mark.parametrize("tp", [1, 2])
def test_qwen3_logits_equal_hf(gloo, tp):
    check_logits(gloo, "qwen3", 2, tp, 1)


# (tp, pp, ep, etp, world)
MOE_LAYOUTS = [(1, 1, 1, None, 2), (1, 1, 2, None, 2), (2, 1, 2, 1, 2), (1, 2, 1, None, 2)]


@pytest.mark.parametrize(
    "tp,pp,ep,etp,world", MOE_LAYOUTS, ids=[f"tp{t}pp{p}ep{e}etp{x or t}" for t, p, e, x, _ in MOE_LAYOUTS]
)
def test_qwen3_moe_logits_equal_hf(gloo, tp, pp, ep, etp, world):
    got = check_logits(gloo, "qwen3_moe", world, tp, pp, ep, etp)
    assert len({dp for dp, _ in got}) == world // (tp * pp)  # every DP rank's own tokens checked


def test_qwen3_moe_context_parallel_with_ep(gloo):
    """CP2 x EP2 (the EP ranks are the CP ranks: each holds half of every packed sequence and
    half of the experts) gives the trainer's logprobs of CP1 x EP1."""
    cfg, _, sd = hf_model("qwen3_moe")
    ref = gloo(2).run(bodies.packed_logprobs, cfg, sd, 1, 1)[0]
    got = gloo(2).run(bodies.packed_logprobs, cfg, sd, 2, 2)[0]
    assert [len(x) for x in got] == [len(x) for x in ref] and len(ref) == 5
    assert max(max(abs(a - b) for a, b in zip(x, y)) for x, y in zip(ref, got)) < 1e-5
