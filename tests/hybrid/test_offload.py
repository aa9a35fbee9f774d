"""Offload releases every param/grad/optimizer storage; onload restores them bitwise."""

import pytest

from tests.hybrid import bodies
from tests.tiny import tiny_qwen2_config

pytestmark = [pytest.mark.gloo]


@pytest.mark.parametrize(
    "tp,pp,distributed_optimizer",
    [(2, 1, False), (1, 1, True)],  # world 2: TP2 / DP2 with the distributed optimizer
)
def test_offload_onload_bitwise(gloo, tp, pp, distributed_optimizer):
    outs = gloo(2).run(bodies.offload_roundtrip, tiny_qwen2_config(), tp, pp, distributed_optimizer)
    for o in outs:
        assert o["resident"] > 0 and o["freed"] > 0
        assert o["released"], "a storage kept its memory while offloaded"
        assert o["resident_off"] == 0
        assert o["equal"], "offload -> onload changed a parameter, gradient or optimizer state"
        assert o["same_training"], "training after offload/onload differs from training without"
