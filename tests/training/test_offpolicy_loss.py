"""The DAPO loss with importance weights (--tis-mode) and stale partial-rollout tokens
(--partial-rollout-offpolicy): THD micro-batches, loss and gradient."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from megatron_dapo.algo import AlgorithmConfig
from megatron_dapo.training import dapo_step, logprobs
from megatron_dapo.training import packing as pk
from megatron_dapo.training.item import TrainItem
from megatron_dapo.training.token_weights import weigh_items

V = 7


@pytest.fixture(autouse=True)
def _no_tp(monkeypatch):
    # the real chunked logprob/entropy kernel, single shard (no megatron parallel state)
    monkeypatch.setattr(
        dapo_step,
        "chunked_logprobs_entropy",
        functools.partial(logprobs.chunked_logprobs_entropy, tp_group=None, tp_rank=0),
    )


def _logits(shape):
    return torch.randn(shape + (V,), generator=torch.Generator().manual_seed(1))


def _samples():
    a = ([1, 2, 3, 4, 5, 6], 1.0)
    b = ([3, 1, 4, 1, 5], -1.0)
    lp = torch.log_softmax(_logits((2, 6)), -1)  # the padded batch is [2, 6]
    out = []
    for i, (toks, adv) in enumerate((a, b)):
        # old = the current policy's logprobs (ratio 1: no clipping), engine = old
        old = [lp[i, t - 1, toks[t]].item() for t in range(2, len(toks))]
        out.append(TrainItem(tokens=toks, prompt_len=2, advantage=adv, old_logprobs=old, engine_logprobs=old))
    return out


def _loss_and_grad(samples, algo, offpolicy=None):
    batch = pk.packed_microbatch(weigh_items(samples, algo, offpolicy))
    # the logits of each sample's tokens are those of its row of a [2, 6] batch
    rows = _logits((2, 6))
    logits = torch.cat([rows[i, : x.n_tokens] for i, x in enumerate(samples)]).unsqueeze(0).requires_grad_(True)
    n_tok = float(batch["n_loss_tokens"])
    loss, stats = dapo_step.dapo_loss_fn(algo, V, n_tok, 2.0)(batch, logits)
    loss.backward()
    # the logits at position t score token t + 1: gradient per scored token, one row per sample
    g = logits.grad[0].abs().sum(-1)
    grad = torch.zeros(2, 5)
    start = 0
    for i, x in enumerate(samples):
        grad[i, : x.n_tokens - 1] = g[start : start + x.n_tokens - 1]
        start += x.n_tokens
    return loss.detach(), grad, stats


def test_stale_tokens_masked_contribute_no_loss_and_no_gradient():
    algo = AlgorithmConfig()
    samples = _samples()
    samples[0].stale_len = 2  # response tokens 0, 1 of sample a (tokens 3, 4 at positions 2, 3)
    loss, grad, stats = _loss_and_grad(samples, algo, offpolicy="mask")
    assert grad[0, 1].item() == 0.0 and grad[0, 2].item() == 0.0  # score tokens 2 and 3
    assert grad[0, 3].item() > 0 and grad[1, 1].item() > 0
    s, c = stats.offpolicy_token_frac
    assert (float(s), float(c)) == (2.0, 7.0)
    # the mismatch metrics cover the tokens of the current weights only
    assert float(stats.mismatch_kl[1]) == 5.0 and float(stats.tis_weight_mean[1]) == 5.0
    # the same batch without the stale tokens' losses: removing them changes the loss only there
    fresh, _, _ = _loss_and_grad(_samples(), algo)
    assert not torch.isclose(loss, fresh)
    # with "correct" and equal engine/old logprobs the weight is 1: the fresh loss
    corrected, _, _ = _loss_and_grad(samples, algo, offpolicy="correct")
    assert torch.isclose(corrected, fresh)


def test_the_stale_tokens_ratio_tail_and_log_ratio_are_counted_by_hand():
    """``is_ratio_tail_frac`` / ``stale_log_ratio_mean``: over the stale loss tokens only, the
    share with pi_old / pi_engine > RATIO_TAIL and the mean log(pi_old / pi_engine)."""
    from megatron_dapo.algo.staleness import RATIO_TAIL

    samples = _samples()
    samples[0].stale_len = 3  # response tokens 0..2 of sample a: stale, corrected
    shifts = [math.log(RATIO_TAIL) + 0.5, -0.2, 0.3]  # log(pi_old / pi_engine) of the three
    old = samples[0].old_logprobs
    samples[0].engine_logprobs = old - torch.tensor(shifts + [0.0] * (len(old) - 3), dtype=old.dtype)
    _, _, stats = _loss_and_grad(samples, AlgorithmConfig(), offpolicy="correct")
    tail, n = (float(x) for x in stats.is_ratio_tail_frac)
    assert (tail, n) == (1.0, 3.0)  # one of the three stale tokens above the threshold
    lr_sum, n2 = (float(x) for x in stats.stale_log_ratio_mean)
    assert n2 == 3.0 and math.isclose(lr_sum, sum(shifts), rel_tol=1e-5, abs_tol=1e-5)
    _, _, fresh = _loss_and_grad(_samples(), AlgorithmConfig())
    assert [float(x) for x in fresh.is_ratio_tail_frac] == [0.0, 0.0]  # no stale token: nothing counted


@pytest.mark.parametrize("mode", ["token-truncate", "token-mask"])
def test_tis_weights_scale_the_token_losses(mode):
    samples = _samples()
    samples[1].engine_logprobs[1] = samples[1].old_logprobs[1] - math.log(3.0)  # rho = 3 > C = 2
    algo = AlgorithmConfig(tis_mode=mode, tis_cap=2.0)
    base, g_base, _ = _loss_and_grad(_samples(), AlgorithmConfig())
    loss, grad, stats = _loss_and_grad(samples, algo)
    tok = (1, 2)  # sample b's response token 1: scored at position 2
    if mode == "token-mask":
        assert grad[tok].item() == 0.0
    else:  # weight 2: twice the gradient
        assert grad[tok].item() == pytest.approx(2 * g_base[tok].item(), rel=1e-5)
    others = torch.ones_like(grad, dtype=torch.bool)
    others[tok] = False
    # a rejected token leaves the token-mean denominator (7 -> 6 tokens); a truncated one stays
    scale = 7.0 / 6.0 if mode == "token-mask" else 1.0
    assert torch.allclose(grad[others], scale * g_base[others])
    s, c = stats.tis_clip_frac
    assert float(s) == pytest.approx(1.0) and float(c) == 7.0
    s, c = stats.mismatch_kl
    assert float(s) == pytest.approx(3 - 1 - math.log(3.0), rel=1e-5)


def test_packed_rows_carry_engine_logprobs_and_stale_prefix():
    samples = _samples()
    samples[0].stale_len = 3
    samples[1].engine_logprobs = None  # none: the old logprobs stand in (ratio 1)
    row = pk.pack_samples(samples)
    # sample a: response tokens at label positions 1..4; sample b at 6 + 1 .. 6 + 3
    assert row["stale"][0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    assert torch.equal(row["engine_logprobs"][0, 7:10], row["old_logprobs"][0, 7:10])
    assert row["engine_logprobs"][0, 1:5].tolist() == pytest.approx(samples[0].engine_logprobs.tolist())


def test_the_interpolated_proximal_loss_is_the_corrected_loss_at_the_interpolated_anchor():
    """--proximal-logprobs interpolate: items carry the engine's logprobs as ``old_logprobs`` and
    ``prox_alpha``; the loss must equal (value and gradient) the corrected loss whose old
    logprobs are the A-3PO proximal policy log pi_b + alpha (log pi_theta - log pi_b), computed
    here by hand from the same logits, with the off-policy weight min(pi_prox / pi_b, C)."""
    algo = AlgorithmConfig(tis_cap=1.5)
    lp = torch.log_softmax(_logits((2, 6)), -1)
    base = _samples()
    behav = []
    for i, x in enumerate(base):
        toks = x.tokens.tolist()
        cur = torch.tensor([lp[i, t - 1, toks[t]].item() for t in range(2, len(toks))])
        gen = torch.Generator().manual_seed(7 + i)
        behav.append(cur - 0.6 * torch.randn(cur.shape, generator=gen))  # the behaviour policy's
    alphas = [torch.full((4,), 0.5), torch.tensor([2 / 3, 2 / 3, 2 / 3])]  # lags 1 and 2

    def items(interpolated: bool):
        out = []
        for x, b, a in zip(base, behav, alphas):
            n = x.response_len
            if interpolated:
                old, alpha = b.clone(), a
            else:
                cur = torch.tensor([lp[len(out), t - 1, x.tokens[t]].item() for t in range(x.prompt_len, x.n_tokens)])
                old, alpha = b + a * (cur - b), None  # the hand-made anchor
            out.append(
                TrainItem(
                    tokens=x.tokens,
                    prompt_len=x.prompt_len,
                    advantage=x.advantage,
                    old_logprobs=old,
                    engine_logprobs=b,
                    stale_len=n,
                    prox_alpha=alpha,
                )
            )
        return out

    got_loss, got_grad, got = _loss_and_grad(items(True), algo, offpolicy="correct")
    want_loss, want_grad, want = _loss_and_grad(items(False), algo, offpolicy="correct")
    assert torch.allclose(got_loss, want_loss, atol=1e-6), (got_loss, want_loss)
    assert torch.allclose(got_grad, want_grad, atol=1e-6)
    assert float(got.is_weight_mean[0]) == pytest.approx(float(want.is_weight_mean[0]), abs=1e-5)
    assert float(want.tis_clip_frac[1]) == 0.0 and float(got.is_weight_mean[0]) != pytest.approx(7.0)  # not all 1
    # the behaviour policy as the anchor (alpha 0) is another loss: the interpolation is used
    plain, _, _ = _loss_and_grad(
        [dataclasses.replace(x, prox_alpha=None, weights=None) for x in items(True)], algo, offpolicy="correct"
    )
    assert not torch.isclose(plain, got_loss)
