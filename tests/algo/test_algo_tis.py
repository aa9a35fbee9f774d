"""Importance-sampling correction of the engine/trainer mismatch (algo/tis.py), hand-computed."""

import math

import pytest
import torch

from megatron_dapo.algo import aggregate_loss, policy_loss
from megatron_dapo.algo.tis import TIS_MODES, loss_token_weights, mismatch_kl, tis_weights

L2, L3 = math.log(2.0), math.log(3.0)


def _inputs():
    # rho = pi_old / pi_eng per token: row 0: [1, 3, 1/3]; row 1: [2, 1/2, (masked)]
    old = torch.tensor([[0.0, L3, -L3], [L2, -L2, 0.0]])
    eng = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return old, eng, mask


def test_token_truncate_caps_at_C():
    old, eng, mask = _inputs()
    w, m = tis_weights(old, eng, mask, "token-truncate", cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.0, 2.0, 1 / 3], [2.0, 0.5, 1.0]]), atol=1e-6)
    # mean over the 5 valid tokens: (1 + 2 + 1/3 + 2 + 0.5) / 5; truncated: only rho = 3
    assert m["tis_weight_mean"].item() == pytest.approx((1 + 2 + 1 / 3 + 2 + 0.5) / 5, abs=1e-6)
    assert m["tis_clip_frac"].item() == pytest.approx(1 / 5, abs=1e-6)


def test_token_mask_drops_ratios_outside_the_band():
    old, eng, mask = _inputs()
    w, m = tis_weights(old, eng, mask, "token-mask", cap=2.0)
    # [1/2, 2] keeps 1, 2, 1/2 (edges included), drops 3 and 1/3
    assert w.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert m["tis_clip_frac"].item() == pytest.approx(2 / 5, abs=1e-6)
    assert m["tis_weight_mean"].item() == pytest.approx(3 / 5, abs=1e-6)


def test_sequence_mask_uses_the_geometric_mean_ratio():
    # row 0: log rho = [ln 3, ln 3] -> mean ln 3 -> 3 > 2: dropped; row 1: [ln 3, -ln 3] -> 1: kept
    old = torch.tensor([[L3, L3], [L3, -L3]])
    eng = torch.zeros(2, 2)
    w, m = tis_weights(old, eng, torch.ones(2, 2), "sequence-mask", cap=2.0)
    assert w.tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert m["tis_clip_frac"].item() == pytest.approx(0.5)
    # a masked position does not enter the sequence mean: row 0 valid only on ln(1.5)
    w, _ = tis_weights(
        torch.tensor([[math.log(1.5), 10.0]]), torch.zeros(1, 2), torch.tensor([[1, 0]]), "sequence-mask", cap=2.0
    )
    assert w.tolist() == [[1.0, 1.0]]


def test_none_mode_is_identity_but_still_measures_the_mismatch():
    old, eng, mask = _inputs()
    w, m = tis_weights(old, eng, mask, "none", cap=2.0)
    assert torch.equal(w, torch.ones(2, 3))
    assert m["tis_clip_frac"].item() == 0.0 and m["tis_weight_mean"].item() == 1.0
    assert m["mismatch_kl"].item() > 0


def test_mismatch_kl_hand_computed():
    # k3 = rho - 1 - ln rho: rho = 2 -> 1 - ln 2 = 0.306853; rho = 1/2 -> -0.5 + ln 2 = 0.193147
    kl = mismatch_kl(torch.tensor([[L2, -L2, 5.0]]), torch.zeros(1, 3), torch.tensor([[1, 1, 0]]))
    assert torch.allclose(kl, torch.tensor([[0.306853, 0.193147, 0.0]]), atol=1e-6)
    _, m = tis_weights(torch.tensor([[L2, -L2]]), torch.zeros(1, 2), torch.ones(1, 2), "token-truncate", 2.0)
    assert m["mismatch_kl"].item() == pytest.approx((0.306853 + 0.193147) / 2, abs=1e-6)
    # k3 of equal policies is 0; k3 is unbiased for KL(eng || old) on a small distribution
    assert mismatch_kl(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2)).abs().max().item() == 0.0
    p_eng = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    p_old = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    est = mismatch_kl(p_old.log()[None], p_eng.log()[None], torch.ones(1, 3))[0]
    assert (p_eng * est).sum().item() == pytest.approx((p_eng * (p_eng / p_old).log()).sum().item(), abs=1e-12)


def test_masked_positions_ignore_garbage_and_weights_carry_no_gradient():
    old = torch.tensor([[0.0, float("nan")]], requires_grad=True)
    eng = torch.tensor([[0.0, float("inf")]])
    w, m = tis_weights(old, eng, torch.tensor([[1, 0]]), "token-truncate", 2.0)
    assert w.tolist() == [[1.0, 1.0]] and not w.requires_grad
    assert all(math.isfinite(v.item()) for v in m.values())


def test_weighted_loss_zero_weight_tokens_give_no_loss_and_no_gradient():
    # the way dapo_loss_fn applies the weights: per_tok * w, then aggregate over the loss mask
    old, eng, mask = _inputs()
    lp = old.clone().requires_grad_(True)
    w, _ = tis_weights(old, eng, mask, "token-mask", cap=2.0)
    per_tok, _ = policy_loss(lp, old, torch.tensor([1.0, -1.0]), mask)
    loss = aggregate_loss(per_tok * w, mask, "token-mean")
    loss.backward()
    assert lp.grad[0, 1].item() == 0.0 and lp.grad[0, 2].item() == 0.0  # masked by TIS
    assert lp.grad[0, 0].item() != 0.0 and lp.grad[1, 0].item() != 0.0
    # with all weights 1 (ratio 1 everywhere) the loss equals the unweighted one
    per_tok1, _ = policy_loss(lp.detach(), lp.detach(), torch.tensor([1.0, -1.0]), mask)
    w1, _ = tis_weights(eng, eng, mask, "token-truncate", 2.0)
    assert (
        aggregate_loss(per_tok1 * w1, mask, "token-mean").item() == aggregate_loss(per_tok1, mask, "token-mean").item()
    )


def test_bad_input_names_the_argument():
    old, eng, mask = _inputs()
    assert TIS_MODES.names() == ("none", "token-truncate", "token-mask", "sequence-mask")
    with pytest.raises(ValueError, match="mode"):
        tis_weights(old, eng, mask, "token", 2.0)
    with pytest.raises(ValueError, match="cap"):
        tis_weights(old, eng, mask, "token-truncate", 1.0)
    with pytest.raises(ValueError, match="engine_logprobs"):
        tis_weights(old, eng[:, :2], mask, "token-truncate", 2.0)
    with pytest.raises(ValueError, match="offpolicy"):
        loss_token_weights(old, eng, mask, mask, "none", 2.0, offpolicy="drop")
    with pytest.raises(ValueError, match="seq_cap"):
        tis_weights(old, eng, mask, "sequence-mask", 2.0, seq_cap=1.0)
