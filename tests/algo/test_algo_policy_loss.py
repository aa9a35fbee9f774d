"""policy_loss and aggregate_loss: hand-computed values, the paper objective, properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_dapo.algo import aggregate_loss, count_valid_sequences, count_valid_tokens, policy_loss

SETTINGS = settings(max_examples=50, deadline=None)


def _close(t, expected, atol):
    torch.testing.assert_close(t.to(torch.float64), torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def _logr(ratios):
    return torch.log(torch.tensor(ratios, dtype=torch.float64))


# --------------------------------------------------------------------- hand-computed
# Row 0 has A = +1 and ratios 1.5, 0.5, 1.1; row 1 has A = -1 and ratios 0.5, 1.5, 20.
# eps_low 0.2, eps_high 0.28: loss = max(-A r, -A clip(r, 0.8, 1.28))
#   (A=+1, r=1.5): max(-1.5, -1.28) = -1.28      upper clip active
#   (A=+1, r=0.5): max(-0.5, -0.8)  = -0.5
#   (A=+1, r=1.1): max(-1.1, -1.1)  = -1.1
#   (A=-1, r=0.5): max( 0.5,  0.8)  =  0.8       lower clip active
#   (A=-1, r=1.5): max( 1.5,  1.28) =  1.5
#   (A=-1, r=20) : max(20, 1.28)    = 20, dual clip c=10 caps it at -c*A = 10
RATIOS = [[1.5, 0.5, 1.1], [0.5, 1.5, 20.0]]
ADV = torch.tensor([1.0, -1.0], dtype=torch.float64)


def _case():
    old = torch.full((2, 3), -1.0, dtype=torch.float64)
    logp = old + _logr(RATIOS)
    return logp, old


def test_hand_computed_loss_no_dual_clip():
    logp, old = _case()
    loss, _ = policy_loss(logp, old, ADV, torch.ones(2, 3), eps_low=0.2, eps_high=0.28)
    _close(loss, [[-1.28, -0.5, -1.1], [0.8, 1.5, 20.0]], 1e-9)


def test_hand_computed_loss_and_metrics_dual_clip():
    logp, old = _case()
    loss, m = policy_loss(logp, old, ADV, torch.ones(2, 3), eps_low=0.2, eps_high=0.28, clip_ratio_c=10.0)
    _close(loss, [[-1.28, -0.5, -1.1], [0.8, 1.5, 10.0]], 1e-9)
    assert set(m) == {"clip_frac_low", "clip_frac_high", "dual_clip_frac", "approx_kl", "ratio_mean", "ratio_max"}
    for v in m.values():
        assert isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
    assert m["clip_frac_low"].item() == pytest.approx(1 / 6)
    assert m["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 6)
    # (1.5 + 0.5 + 1.1 + 0.5 + 1.5 + 20) / 6 = 25.1 / 6
    assert m["ratio_mean"].item() == pytest.approx(4.1833333, abs=1e-6)
    assert m["ratio_max"].item() == pytest.approx(20.0, abs=1e-5)
    # -(2 ln 1.5 + 2 ln 0.5 + ln 1.1 + ln 20) / 6 = -(0.810930 - 1.386294 + 0.095310 + 2.995732) / 6
    assert m["approx_kl"].item() == pytest.approx(-0.4192797, abs=1e-6)


def test_hand_computed_masked_metrics_and_zero_loss_at_masked():
    logp, old = _case()
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    logp = logp.clone()
    logp[1, 2] = float("nan")  # garbage at a masked position must not leak
    loss, m = policy_loss(logp, old, ADV, mask, clip_ratio_c=10.0)
    assert loss[1, 2].item() == 0.0
    assert m["clip_frac_low"].item() == pytest.approx(0.2)
    assert m["clip_frac_high"].item() == pytest.approx(0.2)
    assert m["dual_clip_frac"].item() == 0.0
    assert m["ratio_mean"].item() == pytest.approx(5.1 / 5)  # (1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5
    assert m["ratio_max"].item() == pytest.approx(1.5)


def test_symmetric_grpo_clip_and_per_token_advantages():
    # eps 0.2 / 0.2; per-token advantages [[2, -0.5]]; ratios [1.25, 0.7]
    #   (A=2, r=1.25): max(-2.5, -2*1.2 = -2.4) = -2.4 ; (A=-0.5, r=0.7): max(0.35, 0.5*0.8 = 0.4) = 0.4
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = _logr([[1.25, 0.7]])
    loss, m = policy_loss(
        logp, old, torch.tensor([[2.0, -0.5]], dtype=torch.float64), torch.ones(1, 2), eps_low=0.2, eps_high=0.2
    )
    _close(loss, [[-2.4, 0.4]], 1e-9)
    assert m["clip_frac_high"].item() == 0.5 and m["clip_frac_low"].item() == 0.5


def test_no_valid_token_metrics_are_zero():
    loss, m = policy_loss(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 2))
    assert torch.equal(loss, torch.zeros(2, 2))
    assert all(v.item() == 0.0 for v in m.values())


def test_log_ratio_clamped_before_exp():
    logp = torch.tensor([[0.0, -200.0]])
    old = torch.tensor([[-200.0, 0.0]])
    loss, m = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2))
    assert torch.isfinite(loss).all()
    assert m["ratio_max"].item() == pytest.approx(math.exp(20.0), rel=1e-5)


def test_bf16_inputs_computed_in_float32():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    loss, _ = policy_loss(logp, logp, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.dtype == torch.float32
    assert loss.tolist() == [[-1.0, -1.0]]


def test_old_logprobs_and_advantages_are_constants():
    logp = torch.tensor([[-1.0, -1.2]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0]], requires_grad=True)
    adv = torch.tensor([0.7], requires_grad=True)
    loss, _ = policy_loss(logp, old, adv, torch.ones(1, 2))
    aggregate_loss(loss, torch.ones(1, 2), "token-mean").backward()
    assert logp.grad is not None and old.grad is None and adv.grad is None


# ----------------------------------------------------------------- aggregation by hand
PTL = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregate_hand_computed():
    assert aggregate_loss(PTL, MASK, "token-mean").item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert aggregate_loss(PTL, MASK, "token-mean", global_token_count=7).item() == pytest.approx(1.0)
    assert aggregate_loss(PTL, MASK, "seq-mean-token-mean").item() == pytest.approx(2.75)  # (1.5 + 4) / 2
    assert aggregate_loss(PTL, MASK, "seq-mean-token-mean", global_seq_count=5).item() == pytest.approx(1.1)
    assert aggregate_loss(PTL, MASK, "seq-mean-token-sum").item() == pytest.approx(3.5)  # (3 + 4) / 2
    assert aggregate_loss(PTL, MASK, "seq-mean-token-sum", global_seq_count=torch.tensor(7)).item() == 1.0


def test_aggregate_fully_masked_row_and_nan_at_masked():
    ptl = PTL.clone()
    ptl[1] = float("nan")
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert aggregate_loss(ptl, mask, "token-mean").item() == pytest.approx(1.5)
    assert aggregate_loss(ptl, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert aggregate_loss(ptl, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)


def test_aggregate_all_masked_is_zero_with_zero_grad():
    ptl = torch.randn(2, 3, requires_grad=True)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        ptl.grad = None
        out = aggregate_loss(ptl, torch.zeros(2, 3), mode)
        out.backward()
        assert out.item() == 0.0 and torch.equal(ptl.grad, torch.zeros(2, 3))


def test_counts():
    assert count_valid_tokens(MASK).item() == 3
    assert count_valid_sequences(torch.tensor([[1, 0], [0, 0], [0, 1]])).item() == 2


# --------------------------------------------------- gradient vs the paper's objective
def _paper_objective_loops(logp, old, adv, lengths, eps_low, eps_high):
    """The DAPO objective written directly: J = 1/sum|o_i| sum_i sum_t min(r A, clip(r) A)."""
    total = sum(lengths)
    j = 0.0
    for i, n in enumerate(lengths):
        for t in range(n):
            r = torch.exp(logp[i][t] - old[i][t])
            a = adv[i]
            r_clip = torch.clamp(r, 1 - eps_low, 1 + eps_high)
            j = j + torch.minimum(r * a, r_clip * a)
    return j / total


def _analytic_grad(logp, old, adv, lengths, eps_low, eps_high, shape):
    """d(-J)/d logp_it = -A r / N where the unclipped term is the minimum, else 0."""
    total = sum(lengths)
    g = torch.zeros(shape, dtype=torch.float64)
    for i, n in enumerate(lengths):
        for t in range(n):
            r = math.exp(logp[i][t].item() - old[i][t].item())
            a = adv[i].item()
            clipped_out = (a > 0 and r > 1 + eps_high) or (a < 0 and r < 1 - eps_low)
            g[i, t] = 0.0 if clipped_out else -a * r / total
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gradient_equals_paper_objective(seed):
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 2, 7, 0, 4, 6]
    b, s = len(lengths), 8
    logp = (-torch.rand(b, s, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    old = logp.detach() + torch.randn(b, s, generator=gen, dtype=torch.float64) * 0.3
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    from megatron_dapo.algo import compute_group_advantages

    adv = compute_group_advantages(rewards, 3)
    mask = torch.zeros(b, s)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1

    per_token, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss = aggregate_loss(per_token, mask, "token-mean")
    (grad,) = torch.autograd.grad(loss, logp)

    logp2 = logp.detach().clone().requires_grad_(True)
    j = _paper_objective_loops(logp2, old, adv, lengths, 0.2, 0.28)
    (grad_paper,) = torch.autograd.grad(-j, logp2)
    assert loss.item() == pytest.approx(-j.item(), abs=1e-12)
    torch.testing.assert_close(grad, grad_paper, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, _analytic_grad(logp2, old, adv, lengths, 0.2, 0.28, (b, s)), atol=1e-12, rtol=0)
    # the clip is active on some valid tokens, so this is not only the unclipped gradient
    assert ((grad == 0) & mask.bool()).any() and ((grad != 0) & mask.bool()).any()


def test_gradient_grpo_seq_mean_token_mean_equals_loops():
    gen = torch.Generator().manual_seed(5)
    lengths = [3, 6, 1]
    logp = (-torch.rand(3, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + torch.randn(3, 6, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.tensor([0.5, -1.0, 0.5], dtype=torch.float64)
    mask = torch.zeros(3, 6)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    per_token, _ = policy_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
    loss = aggregate_loss(per_token, mask, "seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, logp)
    logp2 = logp.detach().clone().requires_grad_(True)
    j = 0.0
    for i, n in enumerate(lengths):  # GRPO objective: 1/G sum_i 1/|o_i| sum_t min(...)
        s = 0.0
        for t in range(n):
            r = torch.exp(logp2[i][t] - old[i][t])
            s = s + torch.minimum(r * adv[i], torch.clamp(r, 0.8, 1.2) * adv[i])
        j = j + s / n
    j = j / len(lengths)
    (grad_ref,) = torch.autograd.grad(-j, logp2)
    assert loss.item() == pytest.approx(-j.item(), abs=1e-12)
    torch.testing.assert_close(grad, grad_ref, atol=1e-12, rtol=0)


def test_dual_clip_gradient_loops():
    # A < 0 and r > c: the loss is the constant -c A, so the token has no gradient
    logp = torch.tensor([[math.log(12.0), math.log(1.1)]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, m = policy_loss(logp, old, torch.tensor([-2.0], dtype=torch.float64), torch.ones(1, 2), clip_ratio_c=10.0)
    # tokens: (r=12): max(24, 2*1.28) = 24 -> capped at 20 ; (r=1.1): max(2.2, 2.2) = 2.2
    _close(loss, [[20.0, 2.2]], 1e-9)
    (g,) = torch.autograd.grad(aggregate_loss(loss, torch.ones(1, 2), "token-mean"), logp)
    # d/dlogp of (-A r)/2 at r = 1.1, A = -2: 2 * 1.1 / 2 = 1.1
    _close(g, [[0.0, 1.1]], 1e-9)
    assert m["dual_clip_frac"].item() == 0.5


# ----------------------------------------------------- property: micro-batch token-mean
@st.composite
def _step(draw):
    n_seq = draw(st.integers(1, 10))
    lengths = draw(st.lists(st.integers(0, 7), min_size=n_seq, max_size=n_seq))
    ranks = draw(st.integers(1, 3))
    k = draw(st.integers(1, 4))
    # assign each sequence (in order) to one of ranks * k micro-batches; some may be empty
    buckets = draw(st.lists(st.integers(0, ranks * k - 1), min_size=n_seq, max_size=n_seq))
    extra_pad = draw(st.lists(st.integers(0, 3), min_size=ranks * k, max_size=ranks * k))
    seed = draw(st.integers(0, 2**31 - 1))
    mode = draw(st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
    dual = draw(st.sampled_from([None, 3.0]))
    return lengths, ranks * k, buckets, extra_pad, seed, mode, dual


def _pad(rows, width, fill):
    out = []
    for r in rows:
        pad = torch.full((width - r.shape[0],), fill, dtype=r.dtype)
        out.append(torch.cat([r, pad]))
    return torch.stack(out)


@SETTINGS
@given(case=_step(), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_micro_batches_with_global_count_equal_single_batch(case, dtype):
    lengths, n_mb, buckets, extra_pad, seed, mode, dual = case
    gen = torch.Generator().manual_seed(seed)
    leaves = [(-torch.rand(n, generator=gen) * 3).to(dtype).requires_grad_(True) for n in lengths]
    olds = [leaf.detach() + (torch.randn(leaf.shape[0], generator=gen) * 0.4).to(dtype) for leaf in leaves]
    adv = (torch.randn(len(lengths), generator=gen) * 1.5).to(dtype)

    def build(idx, width):
        lp = _pad([leaves[i] for i in idx], width, 123.0)  # garbage in padding
        ol = _pad([olds[i] for i in idx], width, -77.0)
        mk = _pad([torch.ones(lengths[i]) for i in idx], width, 0.0)
        return lp, ol, mk

    every = list(range(len(lengths)))
    lp, ol, mk = build(every, max(lengths) + 1)
    single, _ = policy_loss(lp, ol, adv, mk, clip_ratio_c=dual)
    single = aggregate_loss(single, mk, mode)
    single_grads = torch.autograd.grad(single, leaves, allow_unused=True)

    micro = []
    for b in range(n_mb):
        idx = [i for i in every if buckets[i] == b]
        if idx:
            micro.append((idx, build(idx, max(lengths[i] for i in idx) + extra_pad[b])))
    tokens = sum(count_valid_tokens(m) for _, (_, _, m) in micro)
    seqs = sum(count_valid_sequences(m) for _, (_, _, m) in micro)
    assert tokens.item() == sum(lengths)
    total = 0.0
    for idx, (lpm, olm, mkm) in micro:
        ptl, _ = policy_loss(lpm, olm, adv[idx], mkm, clip_ratio_c=dual)
        total = total + aggregate_loss(ptl, mkm, mode, global_token_count=tokens, global_seq_count=seqs)
    micro_grads = torch.autograd.grad(total, leaves, allow_unused=True)

    assert abs(total.item() - single.item()) <= 1e-6 * max(1.0, abs(single.item()))
    for g1, g2, n in zip(single_grads, micro_grads, lengths):
        if n == 0:
            continue
        torch.testing.assert_close(g1, g2, atol=1e-6, rtol=1e-6)


def test_per_micro_batch_normalisation_is_not_token_mean():
    """The peers' bug: dividing each micro-batch by its own token count is a different loss."""
    ptl = [torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[4.0, 0.0, 0.0]])]
    masks = [torch.tensor([[1, 1, 1]]), torch.tensor([[1, 0, 0]])]
    global_mean = sum(aggregate_loss(p, m, "token-mean", global_token_count=4) for p, m in zip(ptl, masks))
    per_micro = sum(aggregate_loss(p, m, "token-mean") for p, m in zip(ptl, masks)) / 2
    assert global_mean.item() == pytest.approx(7 / 4)  # (1 + 1 + 1 + 4) / 4
    assert per_micro.item() == pytest.approx(2.5)  # (1 + 4) / 2


# ----------------------------------------------------------- property: clip bound
@SETTINGS
@given(
    log_r=st.floats(-4.0, 4.0),
    a=st.floats(-3.0, 3.0).filter(lambda x: abs(x) > 1e-3),
    eps_low=st.floats(0.0, 0.9),
    eps_high=st.floats(0.0, 2.0),
    c=st.sampled_from([None, 1.5, 3.0, 10.0]),
)
def test_clipped_ratio_never_moves_objective_past_bound(log_r, a, eps_low, eps_high, c):
    logp = torch.tensor([[log_r]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    loss, _ = policy_loss(
        logp,
        old,
        torch.tensor([a], dtype=torch.float64),
        torch.ones(1, 1),
        eps_low=eps_low,
        eps_high=eps_high,
        clip_ratio_c=c,
    )
    objective = -loss[0, 0].item()
    r = math.exp(log_r)
    tol = 1e-12
    if a > 0:
        assert objective <= (1 + eps_high) * a + tol
    else:
        assert objective <= (1 - eps_low) * a + tol
        if c is not None:
            assert loss[0, 0].item() <= -c * a + tol
    (g,) = torch.autograd.grad(loss.sum(), logp)
    beyond = (a > 0 and r > (1 + eps_high) * (1 + 1e-9)) or (a < 0 and r < (1 - eps_low) * (1 - 1e-9))
    if beyond:
        assert g.item() == 0.0
    # inside the trust region the objective is the plain surrogate r * A
    if (1 - eps_low) * (1 + 1e-9) < r < (1 + eps_high) * (1 - 1e-9) and (c is None or a > 0 or r * -a < -c * a):
        assert objective == pytest.approx(r * a, abs=1e-12)
