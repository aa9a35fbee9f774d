"""The hybrid step order, with an engine that refuses work while released and checks residency."""

import pytest

from tests.hybrid import bodies
from tests.tiny import tiny_qwen2_config

pytestmark = [pytest.mark.gloo]

STEP = [
    "generate",
    "engine_release",
    "trainer_onload",
    "train",
    "engine_resume_weights",
    "sync_weights",
    "probe_megatron",
    "trainer_offload",
    "engine_resume_kv_cache",
    "probe_engine",
]
INIT = STEP[4:]


def test_phase_order_pp2(gloo):
    outs = gloo(2).run(bodies.phase_order, tiny_qwen2_config(), 1, 2)
    for o in outs:
        assert o["events"] == INIT + STEP + STEP
        assert o["generate_in_init"] and o["train_in_rollout"]
        assert o["resident_in_rollout"] == 0
        assert all(r > 0 for r in o["resident_in_train"])
        assert all(p is not None and p < 1e-5 for p in o["probe"]), o["probe"]
    e = outs[0]
    assert e["released_refusals"] == [(True, True, True)] * 2
    one = ["release:weights,kv_cache", "resume:weights", "update_weights", "finish_weight_update", "resume:kv_cache"]
    assert e["calls"] == ["resume:weights", "update_weights", "finish_weight_update", "resume:kv_cache"] + (
        ["generate"] + one
    ) * 2
    assert e["rollouts"] and len(e["rollouts"][0]) == 3
    assert outs[1]["calls"] is None
