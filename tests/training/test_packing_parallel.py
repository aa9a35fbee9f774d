"""Packed (THD) micro-batches and context parallelism on real megatron-core models (gloo, tiny Qwen2, fp32).

The trainer's two groupings of its THD micro-batches (consecutive samples, at most
--micro-batch-size 2, vs token-budget packing; before #26.2 the first was a right-padded path):
the same per-sample logprobs (within 1e-6) and the same gradients of the DAPO loss (within
1e-6) at TP1, TP2 and PP2. CP2 (and CP2 x TP2) vs CP1:
logprobs within 1e-6, gradients (summed over the CP group, as DDP does over DP x CP) within
1e-5. The chunked vocab-parallel logprobs/entropy match a float64 full-vocabulary reference
at TP2, gradients included.
"""

import pytest

from tests.tiny import tiny_qwen2_config
from tests.tolerances import adam_weight_atol, max_abs
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


def test_train_on_minibatch_dp2_padded_equals_cp2_packed(gloo):
    """The whole trainer step: DP 2 with consecutive THD micro-batches (micro-batch size 2; a
    right-padded path before #26.2) on token-balanced shards vs CP 2 with token-budget packed
    ones on the whole mini-batch (and DP 2 packed): same step token count, metric sums, gradient
    norm and updated weights (within the Adam bound of tests/tolerances.py)."""
    from tests.tiny import tiny_qwen2_config

    dp = gloo(2).run(bodies.minibatch_step, tiny_qwen2_config(), 1, False, True)
    cp = gloo(2).run(bodies.minibatch_step, tiny_qwen2_config(), 2, False, False)
    dp_packed = gloo(2).run(bodies.minibatch_step, tiny_qwen2_config(), 1, True, True)
    # tests/tolerances.py: one Adam step (lr 1e-4, eps 1e-3, clip 1.0) on gradients that differ by reduction order
    atol = adam_weight_atol(1e-4, dp[0]["grad_norm"], max_abs(dp[0]["params"]), clip_grad=1.0)
    assert max(float((dp[0]["params"][n] - dp_packed[0]["params"][n]).abs().max()) for n in dp[0]["params"]) <= atol
    a, b = dp[0], cp[0]
    assert a["tokens"] == b["tokens"] > 0
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for k in ("pg_loss", "entropy", "approx_kl", "ratio_mean"):
        sa, ca = (sum(o["sums"][k][i] for o in dp) for i in (0, 1))  # the driver sums DP ranks
        (sb, cb) = b["sums"][k]  # CP ranks' shares already summed by the worker
        assert cp[1]["sums"][k] == b["sums"][k]
        assert ca == cb and sa == pytest.approx(sb, rel=1e-5, abs=1e-6), k
    worst = max(float((a["params"][n] - b["params"][n]).abs().max()) for n in a["params"])
    assert worst <= atol, (worst, atol)
    assert 1.0 <= dp[0]["imbalance"] < 1.3 and cp[0]["imbalance"] == 1.0  # DP 1 under CP 2
