"""Resume a Qwen3-MoE trainer checkpoint (model + distributed optimizer: at EP > 1 megatron-core
chains a dense and an expert optimizer, each over its own data-parallel group). CPU, gloo, 2 ranks.

* Saved after one AdamW step at EP2 and resumed at EP2, the second step equals two steps
  without a checkpoint (before the fix, every such resume failed with ``KeyError: 'step'``:
  the torch-Adam workaround of train_checkpoint handled one optimizer only); a control that
  loads the model alone (fresh optimizer) differs.
* Resumed on 4 ranks at EP2 (expert-data-parallel 2 instead of 1, DP 4 instead of 2): the
  expert and dense optimizer states reshard; max |dweight| 3.0e-8 against the straight run
  (at Adam eps 1e-8; the bound is tests/tolerances.py's, at eps 1e-3).
* Resumed at EP1, where megatron-core builds one optimizer for all parameters, the optimizer
  state cannot go in: one CheckpointError line naming --expert-model-parallel-size."""

import pytest

from tests.checkpoint import moe_resume_bodies as bodies
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_moe_config
from tests.tolerances import adam_weight_atol, max_abs

pytestmark = [pytest.mark.gloo]


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def saved(gloo, tmp_path_factory):
    cfg = tiny_qwen3_moe_config()
    sd = checkpoint_state_dict(random_hf_model(cfg, seed=6))
    ckpt = str(tmp_path_factory.mktemp("moe_resume") / "ep2")
    gloo(2).run(bodies.save_after_one_step, cfg, sd, 2, ckpt)
    return cfg, sd, ckpt


def test_resume_at_ep2_continues_the_run(gloo, saved):
    cfg, sd, ckpt = saved
    straight = gloo(2).run(bodies.train_straight, cfg, sd, 2)
    resumed = gloo(2).run(bodies.resume_and_step, cfg, 2, ckpt)
    control = gloo(2).run(bodies.resume_and_step, cfg, 2, ckpt, False)
    assert resumed[0]["grad_norm"] == pytest.approx(straight[0]["grad_norm"], rel=1e-6)
    d = _max_diff(straight[0]["params"], resumed[0]["params"])
    c = _max_diff(straight[0]["params"], control[0]["params"])
    print(f"resumed vs straight: max |dweight| {d:.3g}; control {c:.3g}")
    assert d <= 2e-6, d
    assert c >= 1e-4, c  # the optimizer state matters: without it the step differs


def test_resume_at_ep1_is_one_clear_error(gloo, saved):
    cfg, _, ckpt = saved
    errs = gloo(2).run(bodies.load_error, cfg, 1, ckpt)
    for e in errs:
        assert e is not None and "\n" not in e, e
        assert "2 chained optimizer(s), this layout builds 1" in e and "--expert-model-parallel-size > 1" in e, e


def test_resume_on_four_ranks_reshards_the_expert_state(gloo, saved):
    """Saved on 2 ranks at EP2 (expert-data-parallel 1), resumed on 4 at EP2 (EDP 2, DP 4): the
    expert optimizer's state is resharded over another EDP, the dense one over another DP; the
    step equals the straight 2-rank run's up to the reduction order."""
    cfg, sd, ckpt = saved
    straight = gloo(2).run(bodies.train_straight, cfg, sd, 2)
    resumed = gloo(4).run(bodies.resume_and_step, cfg, 2, ckpt)
    d = _max_diff(straight[0]["params"], resumed[0]["params"])
    print(f"4 ranks (EDP 2) vs 2 ranks (EDP 1): max |dweight| {d:.3g}")
    assert resumed[0]["grad_norm"] == pytest.approx(straight[0]["grad_norm"], rel=1e-5)
    # tests/tolerances.py: two Adam steps (lr 1e-3, eps 1e-3, clip 1.0), the second on gradients
    # reduced over another expert-data-parallel group (another summation order)
    atol = adam_weight_atol(1e-3, straight[0]["grad_norm"], max_abs(straight[0]["params"]), steps=2, clip_grad=1.0)
    assert d <= atol, (d, atol)
