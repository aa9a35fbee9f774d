"""Distributed optimizer at TP1xDP2 with different data per rank equals a single-rank step."""

import pytest
import torch

from tests.foundation import bodies
from tests.tiny import tiny_qwen2_config
from tests.tolerances import adam_weight_atol, max_abs

pytestmark = [pytest.mark.gloo]


@pytest.fixture(scope="module")
def single_rank_reference(gloo):
    # TP1 x PP2 on two ranks has DP1: every rank sees the whole batch (the single-batch step).
    outs = gloo(2).run(bodies.dp_optimizer_step, tiny_qwen2_config(), 1, 2, False, False)
    merged = {}
    for o in outs:
        assert o["dp"] == 1
        merged.update(o["params"])
    return merged, outs[0]["grad_norm"]


@pytest.mark.parametrize("distributed_optimizer", [True, False])
def test_dp2_step_equals_single_batch_step(gloo, single_rank_reference, distributed_optimizer):
    ref, ref_norm = single_rank_reference
    outs = gloo(2).run(bodies.dp_optimizer_step, tiny_qwen2_config(), 1, 1, distributed_optimizer, True)
    assert all(o["dp"] == 2 for o in outs)
    for o in outs:
        assert o["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
        assert set(o["params"]) == set(ref)
        # tests/tolerances.py: one Adam step (lr 1e-3, eps 1e-3, clip 1.0), DP 2 vs one rank
        atol = adam_weight_atol(1e-3, ref_norm, max_abs(ref), clip_grad=1.0)
        for name, t in o["params"].items():
            assert torch.allclose(t, ref[name], atol=atol, rtol=0), (name, float((t - ref[name]).abs().max()), atol)
        print(
            f"DP 2 vs one rank after one Adam step: max |dweight| "
            f"{max(float((t - ref[n]).abs().max()) for n, t in o['params'].items()):.3g}, bound {atol:.3g}"
        )
    assert outs[0]["grad_norm"] > 0


def test_megatron_core_0_19s_build_messages_are_answered(gloo):
    """megatron-core 0.19's DDP warns when the distributed optimizer's ``full_param_layout`` is not
    passed, and its GPTModel logs a deprecation on every build (docs/design.md, "megatron-core
    releases"): the wrapper passes the layout, the builder drops that one line. The controls (DDP
    without the layout, a build without the filter) show each message where the release has it;
    on 0.16.1, which has neither, they are silent too."""
    from packaging.version import Version

    from megatron_dapo.checkpoint.dist_ckpt import megatron_core_version
    from megatron_dapo.models.provider import GPTMODEL_DEPRECATION

    said = gloo(1).run(bodies.build_messages, tiny_qwen2_config(), True)[0]
    assert not [m for m in said["ddp"] if "full_param_layout" in m], said["ddp"]
    assert not [m for m in said["gpt"] if m.startswith(GPTMODEL_DEPRECATION)], said["gpt"]
    new_release = Version(megatron_core_version()) >= Version("0.19")
    assert any("full_param_layout" in m for m in said["ddp_without_layout"]) == new_release, said
    assert any(m.startswith(GPTMODEL_DEPRECATION) for m in said["gpt_unfiltered"]) == new_release, said
