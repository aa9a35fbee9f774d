"""Training a Qwen3-MoE policy with expert parallelism (CPU, TP1, world 2 = DP2): one AdamW
step at EP2 (expert-data-parallel 1) equals the step at EP1 (every rank holds all experts,
expert-data-parallel 2), with megatron's distributed optimizer (a chained dense + expert
optimizer over the expert-data-parallel groups; the gradient norm, which Adam's first step
does not show, checks the reductions' scale); the load-balancing loss enters as the mean over the step's 4
micro-batches (the coefficient the router reads is 0.001 / 4)."""

import pytest
import torch

from megatron_dapo.checkpoint.mapping import hf_to_megatron
from megatron_dapo.models import parse_hf_config
from tests.moe import bodies
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_moe_config
from tests.tolerances import adam_weight_atol, max_abs

pytestmark = [pytest.mark.gloo]


@pytest.fixture(scope="module")
def moe_sd():
    cfg = tiny_qwen3_moe_config()
    return cfg, checkpoint_state_dict(random_hf_model(cfg, seed=6))


def test_ep2_step_equals_ep1(gloo, moe_sd):
    cfg, sd = moe_sd
    ep1 = gloo(2).run(bodies.train_step_at, cfg, sd, 1, True)
    ep2 = gloo(2).run(bodies.train_step_at, cfg, sd, 2, True)
    assert {o["edp"] for o in ep1} == {2} and {o["edp"] for o in ep2} == {1}
    assert all(o["aux_coeff"] == pytest.approx(0.001 / 4) for o in ep1 + ep2)
    a, b = ep1[0]["params"], ep2[0]["params"]
    assert set(a) == set(b) and any(".local_experts.7." in n for n in a)
    assert ep1[0]["grad_norm"] == pytest.approx(ep2[0]["grad_norm"], rel=1e-5)
    before = dict(hf_to_megatron(parse_hf_config(cfg), sd.__getitem__, 256))
    # tests/tolerances.py: one Adam step (lr 1e-3, eps 1e-3, clip 1.0) on gradients that differ by
    # float32 reduction order (EP 1 vs EP 2)
    atol = adam_weight_atol(1e-3, ep1[0]["grad_norm"], max_abs(before), clip_grad=1.0)
    worst = max(float((a[n] - b[n]).abs().max()) for n in a)
    print(f"EP 1 vs EP 2 after one Adam step: max |dweight| {worst:.3g}, bound {atol:.3g}")
    assert worst <= atol, (worst, atol, max(a, key=lambda n: float((a[n] - b[n]).abs().max())))
    moved = [n for n in a if not torch.equal(a[n], before[n])]
    assert any("router" in n for n in moved) and any("local_experts" in n for n in moved)


def test_load_balancing_types_train(gloo, moe_sd):
    """Every --moe-router-load-balancing-type trains at EP2 (world 2); the loss changes the
    router's update (none vs the others), its coefficient is the mean over micro-batches."""
    cfg, sd = moe_sd
    types = ["seq_aux_loss", "global_aux_loss", "none"]
    out = gloo(2).run(bodies.balancing_steps, cfg, sd, types)[0]
    for t in types:
        norm, coeff, _ = out[t]
        assert norm == norm and norm > 0, t
        assert coeff == pytest.approx(0.0 if t == "none" else 0.001 / 4), t
    base = out["none"][2]
    assert not torch.equal(out["seq_aux_loss"][2], base) and not torch.equal(out["global_aux_loss"][2], base)
