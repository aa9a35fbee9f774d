"""The trainer's numbers on a tiny model, pinned (#26.2): old logprobs, the step's metric means
and the gradient norm of one ``train_on_minibatch`` step with every loss input in use (KL to a
reference, --tis-mode token-truncate, a stale --partial-rollout prefix under "correct", an
overlong-filtered sample, an entropy bonus, temperature 0.9), for micro-batches of at most
--micro-batch-size 2 responses (3 micro-batches) and for token-budget packing (--use-packing,
40 tokens: 2 micro-batches).

The pinned values were recorded at fe295dd, when these were two batching paths (right-padded
``collate`` and THD ``pack_samples``, with their own logprob and loss-input code), which
agreed with each other within float32 rounding (the values below are the padded path's; the
packed path's differed by at most 2e-7 relative). The single THD path must keep them (gloo,
one rank, fp32, CPU)."""

import math

import pytest

from tests.tiny import tiny_qwen2_config
from tests.training import packing_bodies as bodies

pytestmark = [pytest.mark.gloo]

LP_SUM = -332.8816933631897  # sum of every response token's old logprob (60 tokens, 6 samples)
MEANS = {  # the step's token-weighted metric means
    "pg_loss": 0.05913766653373324,
    "entropy": 5.5303892771403,
    "approx_kl": 0.020951467855223293,
    "ratio_mean": 0.9803927849079,
    "kl": 9.585837923247238,
    "tis_weight_mean": 0.09157488562844017,
    "mismatch_kl": 1.5648040424693714,
    "offpolicy_token_frac": 0.05172413793103448,
    "clip_frac_low": 0.0,
    "clip_frac_high": 0.0,
    "dual_clip_frac": 0.0,
    "tis_clip_frac": 0.0,
}
GRAD_NORM = 1.2263830746178896
TOKENS = 58.0  # the step's loss tokens (the overlong-filtered sample's 2 are not)


@pytest.fixture(scope="module")
def runs(gloo):
    pool = gloo(1)
    return {p: pool.run(bodies.pinned_step, tiny_qwen2_config(), p)[0] for p in (False, True)}


@pytest.mark.parametrize("packing,n_mb", [(False, 3), (True, 2)])
def test_step_keeps_the_pinned_values(runs, packing, n_mb):
    r = runs[packing]
    assert r["num_microbatches"] == n_mb and r["tokens"] == TOKENS
    assert sum(map(sum, r["lps"])) == pytest.approx(LP_SUM, rel=1e-6)
    assert r["grad_norm"] == pytest.approx(GRAD_NORM, rel=1e-5)
    # every pinned mean, plus the importance weights' moments added after the pins (issue 40): no
    # value was recorded for them, so they are held to what they must satisfy
    added = {"is_weight_mean", "is_weight_sq_mean", "is_ratio_tail_frac", "stale_log_ratio_mean"}
    assert set(r["means"]) == set(MEANS) | added
    for k, v in MEANS.items():
        assert r["means"][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    w, w2 = r["means"]["is_weight_mean"], r["means"]["is_weight_sq_mean"]
    assert 0 < w and w * w <= w2 * (1 + 1e-6)  # mean(w)^2 <= mean(w^2): ESS / N in (0, 1]
    assert w <= 1.5  # the body's --tis-cap 1.5 bounds every weight (fresh: TIS, stale: the correction)
    # over the stale prefix's tokens: a share, and a finite mean log-ratio
    assert 0.0 <= r["means"]["is_ratio_tail_frac"] <= 1.0 and math.isfinite(r["means"]["stale_log_ratio_mean"])


def test_both_groupings_agree_per_token(runs):
    a, b = runs[False]["lps"], runs[True]["lps"]
    assert [len(x) for x in a] == [len(x) for x in b] == [7, 14, 2, 11, 19, 7]
    assert max(abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)) < 1e-6
