"""The registered policy losses (--policy-loss) against hand computations: values, gradients
(autograd on the paper's objective written out directly), and the config's rules."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_dapo.algo import AlgorithmConfig, aggregate_loss, policy_loss
from megatron_dapo.algo.policy_losses import POLICY_LOSS_METRICS, POLICY_LOSSES
from megatron_dapo.config import ConfigError, parse_args

# two sequences: 3 and 2 valid tokens (the third of sequence 1 is padding holding garbage)
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, -0.7, 0.0]], dtype=torch.float64)
DELTA = torch.tensor([[0.3, -0.1, 0.05], [-0.4, 0.2, 0.0]], dtype=torch.float64)  # log r
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([0.8, -1.2], dtype=torch.float64)


def _lp():
    lp = (OLD + DELTA).clone()
    lp[1, 2] = float("nan")  # garbage on the padded position
    return lp.requires_grad_(True)


def _cfg(**kw):
    return AlgorithmConfig(**kw)


def test_the_registry_is_the_flags_choices_and_every_loss_returns_the_metric_keys():
    assert POLICY_LOSSES.names() == ("decoupled-clip", "gspo", "cispo", "dr-grpo")
    help_choices = [f for f in AlgorithmConfig.__dataclass_fields__.values() if f.name == "policy_loss"][0]
    assert tuple(help_choices.metadata["choices"]) == POLICY_LOSSES.names()
    for name in POLICY_LOSSES:
        agg = (POLICY_LOSSES.get(name).aggregation or ("token-mean",))[0]
        loss, m = POLICY_LOSSES.get(name)(_lp(), OLD, ADV, MASK, _cfg(loss_agg_mode=agg))
        assert set(m) == set(POLICY_LOSS_METRICS), name
        assert torch.isfinite(loss).all() and loss[1, 2] == 0, name  # padding: 0, NaN not leaked


def test_decoupled_clip_is_dapos_policy_loss():
    cfg = _cfg()
    got, _ = POLICY_LOSSES.get("decoupled-clip")(_lp(), OLD, ADV, MASK, cfg)
    ref, _ = policy_loss(_lp(), OLD, ADV, MASK, 0.2, 0.28, 10.0)
    assert torch.equal(got, ref)


def test_gspo_value_and_gradient_are_the_sequence_objectives():
    eps_l, eps_h = 0.02, 0.03
    cfg = _cfg(policy_loss="gspo", loss_agg_mode="seq-mean-token-mean", eps_clip_low=eps_l, eps_clip_high=eps_h)
    lp = _lp()
    per_tok, m = POLICY_LOSSES.get("gspo")(lp, OLD, ADV, MASK, cfg)
    loss = aggregate_loss(per_tok, MASK, "seq-mean-token-mean")
    loss.backward()
    # the paper's objective written out: s_i = exp(mean_t log r), -mean_i min(s A, clip(s) A)
    lp2 = (OLD + DELTA).clone().requires_grad_(True)
    valid = MASK.bool()
    terms = []
    for i in range(2):
        d = (lp2[i] - OLD[i])[valid[i]]
        s = torch.exp(d.mean())
        terms.append(-torch.min(s * ADV[i], torch.clamp(s, 1 - eps_l, 1 + eps_h) * ADV[i]))
    ref = torch.stack(terms).mean()
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-12)
    g = torch.where(valid, lp.grad, torch.zeros_like(lp.grad))
    assert torch.allclose(g, torch.where(valid, lp2.grad, torch.zeros_like(lp2.grad)), atol=1e-12)
    # sequence 0: s = exp(0.25/3) = 1.087 > 1 + eps_h with A > 0: clipped (no gradient)
    s0 = math.exp((0.3 - 0.1 + 0.05) / 3)
    assert s0 > 1 + eps_h and torch.all(g[0] == 0)
    assert m["clip_frac_high"].item() == pytest.approx(3 / 5)
    # sequence 1: s = exp(-0.1) = 0.905 < 1 - eps_l with A < 0: clipped too; the value is -clip(s) A
    assert per_tok[1, 0].item() == pytest.approx(-(1 - eps_l) * -1.2)


def test_cispo_keeps_the_gradient_of_clipped_tokens_with_a_stopped_weight():
    cfg = _cfg(policy_loss="cispo", eps_clip_low=1.0, eps_clip_high=0.2)
    lp = _lp()
    per_tok, m = POLICY_LOSSES.get("cispo")(lp, OLD, ADV, MASK, cfg)
    aggregate_loss(per_tok, MASK, "token-mean").backward()
    # hand: d/dlp of -(1/N) sum sg(clip(r)) A log pi = -clip(r) A / N on every valid token
    r = torch.exp(DELTA)
    w = torch.clamp(r, 0.0, 1.2)
    expect = torch.where(MASK.bool(), -w * ADV[:, None] / 5, torch.zeros_like(r))
    g = torch.where(MASK.bool(), lp.grad, torch.zeros_like(lp.grad))
    assert torch.allclose(g, expect, atol=1e-12)
    # token (0, 0): r = e^0.3 = 1.35 > 1.2, clipped yet its gradient is not 0 (PPO's would be)
    assert g[0, 0].item() == pytest.approx(-1.2 * 0.8 / 5)
    lp_ppo = _lp()
    aggregate_loss(policy_loss(lp_ppo, OLD, ADV, MASK, 0.2, 0.2)[0], MASK, "token-mean").backward()
    assert lp_ppo.grad[0, 0].item() == 0.0
    # r = e^0.3 and e^0.2 (1.35, 1.22) are above 1.2: two of five valid tokens
    assert m["clip_frac_high"].item() == pytest.approx(2 / 5)


def test_dr_grpo_sums_tokens_over_a_constant_length():
    L = 8
    cfg = _cfg(
        policy_loss="dr-grpo",
        loss_agg_mode="seq-mean-token-sum",
        max_response_length=L,
        overlong_buffer_length=4,
        eps_clip_low=0.2,
        eps_clip_high=0.2,
        clip_ratio_c=None,
    )
    lp = _lp()
    per_tok, _ = POLICY_LOSSES.get("dr-grpo")(lp, OLD, ADV, MASK, cfg)
    loss = aggregate_loss(per_tok, MASK, "seq-mean-token-sum")
    # hand: (1/G) sum_i (1/L) sum_t -min(r A, clip(r) A)
    r = torch.exp(DELTA)
    tok = -torch.minimum(r * ADV[:, None], torch.clamp(r, 0.8, 1.2) * ADV[:, None])
    hand = (tok * MASK).sum() / (2 * L)
    assert loss.item() == pytest.approx(hand.item(), rel=1e-12)
    # a longer wrong answer is not penalised less per token: each token's gradient is -A r/(G L)
    # when unclipped, whatever its sequence's length
    loss.backward()
    assert lp.grad[1, 1].item() == pytest.approx(1.2 * math.exp(0.2) / (2 * L))


def test_config_names_the_flag_for_a_losss_aggregation_and_an_unknown_loss():
    with pytest.raises(ValueError, match="--policy-loss gspo is defined with --loss-agg-mode seq-mean-token-mean"):
        AlgorithmConfig(policy_loss="gspo").validate()
    with pytest.raises(ValueError, match="--policy-loss must be one of decoupled-clip, gspo, cispo, dr-grpo"):
        AlgorithmConfig(policy_loss="ppo").validate()
    cfg = parse_args(
        ["--policy-loss", "dr-grpo", "--loss-agg-mode", "seq-mean-token-sum", "--advantage-estimator", "group-mean"]
    ).algo
    assert cfg.policy_loss == "dr-grpo" and cfg.validate() is cfg
    with pytest.raises((ConfigError, SystemExit)):
        parse_args(["--policy-loss", "ppo"])


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_the_trainers_loss_runs_each_registered_loss(name, monkeypatch):
    import functools

    from megatron_dapo.training import dapo_step, logprobs
    from megatron_dapo.training import packing as pk

    monkeypatch.setattr(
        dapo_step,
        "chunked_logprobs_entropy",
        functools.partial(logprobs.chunked_logprobs_entropy, tp_group=None, tp_rank=0),
    )
    V = 7
    agg = (POLICY_LOSSES.get(name).aggregation or ("token-mean",))[0]
    algo = AlgorithmConfig(policy_loss=name, loss_agg_mode=agg)
    from megatron_dapo.training.item import TrainItem

    samples = [
        TrainItem(tokens=[1, 2, 3, 4, 5], prompt_len=2, advantage=1.0, old_logprobs=[-1.0, -2.0, -1.5]),
        TrainItem(tokens=[2, 3, 6, 1], prompt_len=2, advantage=-0.5, old_logprobs=[-0.5, -2.5]),
    ]
    packed = pk.packed_microbatch(samples)
    rows = torch.randn(1, 9, V, generator=torch.Generator().manual_seed(0), dtype=torch.float32).requires_grad_(True)
    loss, _ = dapo_step.dapo_loss_fn(algo, V, packed["n_loss_tokens"], 2.0)(packed, rows)
    loss.backward()
    assert torch.isfinite(loss) and rows.grad.abs().sum() > 0
    # only the logits that score response tokens get a gradient (positions 1-3 and 5 + 1-2; a clipped one none)
    assert set(rows.grad[0].abs().sum(-1).nonzero().squeeze(1).tolist()) <= {1, 2, 3, 6, 7}
    if POLICY_LOSSES.get(name).whole_sequences:
        with pytest.raises(ValueError, match=f"--policy-loss {name} needs whole sequences"):
            dapo_step.dapo_loss_fn(algo, V, 5.0, 2.0)(dict(packed, cp_size=2), rows.detach())


def test_cispos_open_lower_bound_passes_the_clip_higher_check_that_the_clip_losses_get():
    from megatron_dapo.config import validate

    ok = parse_args(["--policy-loss", "cispo", "--eps-clip-low", "1", "--eps-clip-high", "0.2"])
    validate(ok, on_gpu=True)
    with pytest.raises(ConfigError, match="--eps-clip-high 0.2 is below --eps-clip-low 1"):
        validate(parse_args(["--eps-clip-low", "1", "--eps-clip-high", "0.2"]), on_gpu=True)
