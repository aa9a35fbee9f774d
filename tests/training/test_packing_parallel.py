"""Packed (THD) micro-batches and context parallelism on real megatron-core models (gloo, tiny Qwen2, fp32).

Packed vs padded micro-batches: the same per-sample logprobs (within 1e-6) and the same
gradients of the DAPO loss (within 1e-6) at TP1, TP2 and PP2. CP2 (and CP2 x TP2) vs CP1:
logprobs within 1e-6, gradients (summed over the CP group, as DDP does over DP x CP) within
1e-5. The chunked vocab-parallel logprobs/entropy match a float64 full-vocabulary reference
at TP2, gradients included.
"""

import pytest

from tests.tiny import tiny_qwen2_config
from tests.training import packing_bodies as bodies

pytestmark = [pytest.mark.gloo]


@pytest.mark.parametrize("tp,pp,world", [(1, 1, 2), (2, 1, 2), (1, 2, 2)])
def test_packed_equals_padded(gloo, tp, pp, world):
    outs = gloo(world).run(bodies.packed_vs_padded, tiny_qwen2_config(), tp, pp)
    lps = [o["lp"] for o in outs if o["lp"] is not None]
    assert lps and max(lps) < 1e-6, outs
    assert all(o["grad_scale"] > 1e-4 for o in outs), outs  # the loss reaches every rank's weights
    assert max(o["grad"] for o in outs) < 1e-6, outs
    assert all(o["n_mb"][1] >= 2 for o in outs), outs  # several packs, several sequences each


@pytest.mark.parametrize("tp,cp,world", [(1, 2, 2), (2, 2, 4)])
def test_context_parallel_equals_cp1(gloo, tp, cp, world):
    outs = gloo(world).run(bodies.cp_vs_no_cp, tiny_qwen2_config(), tp, cp)
    assert all(o["lens"] for o in outs), outs
    assert max(o["lp"] for o in outs) < 1e-6, outs
    assert max(o["grad"] for o in outs) < 1e-5, outs
    for o in outs:
        ref, got = o["grad_norm"]
        assert ref > 1e-3 and abs(ref - got) < 1e-5 * ref, outs


def test_chunked_logprobs_entropy_tp2(gloo):
    outs = gloo(2).run(bodies.chunked_logprobs_tp)
    for o in outs:
        assert o["lp"] < 1e-5 and o["ent"] < 1e-5 and o["grad"] < 1e-5, outs  # float32 math vs float64
