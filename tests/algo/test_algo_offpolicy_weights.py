"""One importance weight per token: every --tis-mode x --partial-rollout-offpolicy combination
against a hand computation with rho != 1 (algo.tis.loss_token_weights), and the loss that the
trainer builds from it (weigh_items -> packed_microbatch -> dapo_loss_fn): a stale token never
gets the TIS weight on top of its off-policy weight, and a token that carries no gradient
leaves the token-mean denominator."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from megatron_dapo.algo import AlgorithmConfig, policy_loss
from megatron_dapo.algo.tis import TIS_MODES, TIS_SEQ_CAP_DEFAULT, loss_token_weights
from megatron_dapo.training import dapo_step, logprobs
from megatron_dapo.training import packing as pk
from megatron_dapo.training.item import TrainItem
from megatron_dapo.training.token_weights import weigh_items

C = 2.0
# sample 0: two stale tokens (rho 3 and 0.6), then two fresh ones (rho 1.5 and 0.4);
# sample 1: three fresh tokens with rho 1.2, 0.9, 1.1
RHO = [[3.0, 0.6, 1.5, 0.4], [1.2, 0.9, 1.1]]
STALE = [2, 0]
OFFPOLICY = (None, "mask", "correct")


def _hand(mode: str, offpolicy, seq_cap: float):
    """The expected (weight, keep) of every token, written out from the rule's table."""
    out = []
    for rho, n_stale in zip(RHO, STALE):
        stale = [offpolicy is not None and t < n_stale for t in range(len(rho))]
        fresh_rho = [r for r, s in zip(rho, stale) if not s]
        geo = math.exp(sum(math.log(r) for r in fresh_rho) / len(fresh_rho))
        seq_ok = 1.0 / seq_cap <= geo <= seq_cap
        w, keep = [], []
        for r, s in zip(rho, stale):
            if s:  # the off-policy weight, never the TIS one
                w.append(0.0 if offpolicy == "mask" else min(r, C))
                keep.append(offpolicy == "correct")
            elif mode == "none":
                w.append(1.0), keep.append(True)
            elif mode == "token-truncate":
                w.append(min(r, C)), keep.append(True)
            elif mode == "token-mask":
                ok = 1.0 / C <= r <= C
                w.append(1.0 if ok else 0.0), keep.append(ok)
            else:
                w.append(1.0 if seq_ok else 0.0), keep.append(seq_ok)
        out.append((w, keep))
    return out


def _tensors():
    n = max(len(r) for r in RHO)
    eng = torch.full((2, n), -2.0, dtype=torch.float64)
    old, mask, stale = eng.clone(), torch.zeros(2, n), torch.zeros(2, n)
    for i, (rho, k) in enumerate(zip(RHO, STALE)):
        old[i, : len(rho)] = eng[i, : len(rho)] + torch.log(torch.tensor(rho, dtype=torch.float64))
        mask[i, : len(rho)] = 1
        stale[i, :k] = 1
    old[1, 3] = float("nan")  # garbage on a padded position must not matter
    return old, eng, mask, stale


@pytest.mark.parametrize(
    "mode,offpolicy,seq_cap",
    [
        (m, o, c)
        for m, o in itertools.product(TIS_MODES, OFFPOLICY)
        for c in ((2.0, TIS_SEQ_CAP_DEFAULT) if m == "sequence-mask" else (2.0,))
    ],
)
def test_every_combination_matches_the_hand_computation(mode, offpolicy, seq_cap):
    old, eng, mask, stale = _tensors()
    r = loss_token_weights(old, eng, mask, stale, mode, C, seq_cap, offpolicy)
    for i, (w, keep) in enumerate(_hand(mode, offpolicy, seq_cap)):
        n = len(w)
        assert r.weight[i, :n].tolist() == pytest.approx(w, abs=1e-9), (i, r.weight[i])
        assert r.keep[i, :n].tolist() == keep, (i, r.keep[i])
        assert not r.keep[i, n:].any() and (r.weight[i, n:] == 0).all()  # padding


def test_the_sequence_band_is_its_own_and_sits_close_to_one():
    # sample 0's fresh tokens (offpolicy=mask): geometric mean sqrt(1.5 * 0.4) = 0.775, inside
    # the token band [1/2, 2] but far outside the default sequence band [1/1.001, 1.001]
    old, eng, mask, stale = _tensors()
    loose = loss_token_weights(old, eng, mask, stale, "sequence-mask", C, 2.0, "mask")
    tight = loss_token_weights(old, eng, mask, stale, "sequence-mask", C, None, "mask")  # seq_cap None: the token cap
    default = loss_token_weights(old, eng, mask, stale, "sequence-mask", C, TIS_SEQ_CAP_DEFAULT, "mask")
    assert loose.keep[0, 2:4].all() and tight.keep[0, 2:4].all()
    assert not default.keep[0].any() and not default.keep[1, :3].any()  # 0.9 * 1.2 * 1.1 = 1.188: out too
    assert default.clipped[0, 2:4].all() and not default.clipped[0, :2].any()  # stale tokens are not TIS-clipped


# ------------------------------------------------------------------ the loss the trainer builds

V = 7


@pytest.fixture(autouse=True)
def _no_tp(monkeypatch):
    monkeypatch.setattr(
        dapo_step,
        "chunked_logprobs_entropy",
        functools.partial(logprobs.chunked_logprobs_entropy, tp_group=None, tp_rank=0),
    )


def _logits(shape, seed=1):
    return torch.randn(shape + (V,), generator=torch.Generator().manual_seed(seed))


def _samples():
    """Two samples whose old logprobs are the current policy's (so the PPO ratio is 1 and the
    per-token loss is -A) and whose engine logprobs make rho = RHO."""
    out = []
    lp = torch.log_softmax(_logits((2, 6)), -1)
    for i, (rho, k) in enumerate(zip(RHO, STALE)):
        toks = [1, 2] + [3 + (t + i) % 4 for t in range(len(rho))]
        old = [lp[i, 1 + t, toks[2 + t]].item() for t in range(len(rho))]
        out.append(
            TrainItem(
                tokens=toks,
                prompt_len=2,
                advantage=(1.0, -0.5)[i],
                train=True,
                old_logprobs=old,
                engine_logprobs=[o - math.log(r) for o, r in zip(old, rho)],
                stale_len=k,
            )
        )
    return out


@pytest.mark.parametrize("mode,offpolicy", list(itertools.product(TIS_MODES, OFFPOLICY)))
def test_the_trainers_loss_is_the_hand_weighted_token_mean(mode, offpolicy):
    algo = AlgorithmConfig(tis_mode=mode, tis_cap=C, tis_seq_cap=2.0)
    samples = weigh_items(_samples(), algo, offpolicy)
    batch = pk.packed_microbatch(samples)
    n_tok = float(batch["n_loss_tokens"])
    logits = _packed_logits(samples, _logits((2, 6)))
    loss, stats = dapo_step.dapo_loss_fn(algo, V, n_tok, 2.0)(batch, logits)
    hand = _hand(mode, offpolicy, 2.0)
    kept = sum(sum(k) for _, k in hand)
    assert n_tok == kept  # the denominator counts only the tokens the step learns from
    adv = [1.0, -0.5]
    # ratio 1: each token's PPO loss is -A; the step's loss is sum(w * -A) / kept
    expect = sum(-a * wt for (w, k), a in zip(hand, adv) for wt, kk in zip(w, k) if kk) / kept
    assert loss.item() == pytest.approx(expect, abs=1e-5)
    # the logged weight and clip fraction are over the fresh tokens only
    s, c = stats.tis_weight_mean
    n_fresh = sum(len(r) - (k if offpolicy else 0) for r, k in zip(RHO, STALE))
    assert float(c) == n_fresh
    s_off, c_off = stats.offpolicy_token_frac
    assert (float(s_off), float(c_off)) == (2.0, 7.0)  # the stale tokens of trained samples, weighted or not


def _packed_logits(samples, padded_logits):
    """Each sample's row of a ``[2, 6]`` batch of logits, laid out as one packed row."""
    rows = [padded_logits[i, : x.n_tokens] for i, x in enumerate(samples)]
    return torch.cat(rows, 0).unsqueeze(0)


def test_policy_loss_with_ratio_one_is_minus_the_advantage():
    # the premise of the hand computation above
    lp = torch.tensor([[-1.0, -2.0]])
    per_tok, _ = policy_loss(lp, lp, torch.tensor([0.7]), torch.ones(1, 2), 0.2, 0.28, 3.0)
    assert per_tok[0].tolist() == pytest.approx([-0.7, -0.7])
