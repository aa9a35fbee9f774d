"""KL estimators and chunked entropy."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from megatron_dapo.algo import entropy_from_logits, kl_k1, kl_k2, kl_k3, kl_penalty


def test_kl_hand_computed():
    # pi = 0.5, pi_ref = 0.25: log rho = ln(0.25 / 0.5) = -ln 2 = -0.693147
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert kl_k1(lp, ref).item() == pytest.approx(0.693147, abs=1e-6)  # ln 2
    assert kl_k2(lp, ref).item() == pytest.approx(0.240227, abs=1e-6)  # 0.5 * 0.480453
    assert kl_k3(lp, ref).item() == pytest.approx(0.193147, abs=1e-6)  # 0.5 - 1 + 0.693147
    assert kl_penalty(lp, ref, "k3").item() == kl_k3(lp, ref).item()
    assert kl_penalty(lp, ref, "k1").item() == kl_k1(lp, ref).item()
    assert kl_penalty(lp, ref, "k2").item() == kl_k2(lp, ref).item()
    # identical policies: all zero
    assert kl_k3(lp, lp).item() == 0.0 and kl_k2(lp, lp).item() == 0.0 and kl_k1(lp, lp).item() == 0.0


def test_kl_k3_unbiased_on_a_small_distribution():
    p = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    q = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()
    for est in (kl_k1, kl_k3):
        expectation = (p * est(p.log(), q.log())).sum()
        assert expectation.item() == pytest.approx(exact.item(), abs=1e-12)


def test_kl_grad_only_through_logprobs_and_clamped():
    lp = torch.tensor([[0.0, -100.0]], requires_grad=True)
    ref = torch.tensor([[-100.0, 0.0]], requires_grad=True)
    out = kl_k3(lp, ref)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert lp.grad is not None and ref.grad is None


def _naive_entropy(logits):
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def test_entropy_hand_computed():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e4, -1e4], [5.0, float("-inf"), 5.0, 5.0]])
    h = entropy_from_logits(logits, chunk_size=2)
    # uniform over 4: ln 4; p = [0.25, 0.75]: 0.25 ln 4 + 0.75 ln(4/3); uniform over 3 with a banned token: ln 3
    assert h.tolist() == pytest.approx([1.3862944, 0.5623351, 1.0986123], abs=1e-6)
    assert h.dtype == torch.float32


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    s=st.integers(1, 7),
    v=st.integers(1, 40),
    chunk=st.integers(1, 9),
    seed=st.integers(0, 1000),
    scale=st.floats(0.1, 20.0),
)
def test_entropy_matches_naive_values_and_gradients(b, s, v, chunk, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, s, v, generator=gen, dtype=torch.float64) * scale).requires_grad_(True)
    w = torch.randn(b, s, generator=gen, dtype=torch.float64)
    h = entropy_from_logits(logits, chunk_size=chunk)
    assert h.shape == (b, s)
    (g,) = torch.autograd.grad((h * w).sum(), logits)
    ref_logits = logits.detach().clone().requires_grad_(True)
    ref = _naive_entropy(ref_logits)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), ref_logits)
    torch.testing.assert_close(h, ref, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)


def test_entropy_gradcheck():
    logits = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, chunk_size=2), (logits,))


def test_entropy_bf16_logits():
    logits = torch.randn(3, 10, 50).to(torch.bfloat16).requires_grad_(True)
    h = entropy_from_logits(logits, chunk_size=4)
    torch.testing.assert_close(h.double(), _naive_entropy(logits.detach().float()), atol=1e-5, rtol=1e-5)
    h.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and logits.grad.shape == logits.shape


class _AllocationRecorder(TorchDispatchMode):
    """Records (numel, dtype) of every op output that got fresh storage (not a view or in-place)."""

    def __init__(self):
        super().__init__()
        self.allocs = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        in_ptrs = {a.untyped_storage().data_ptr() for a in inputs}
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in in_ptrs:
                self.allocs.append((o.numel(), o.dtype))
        return out


def test_entropy_never_materialises_a_full_size_float_tensor():
    n_rows, vocab, chunk = 64, 1000, 8
    logits = torch.randn(4, 16, vocab).to(torch.bfloat16).requires_grad_(True)
    with _AllocationRecorder() as rec:
        h = entropy_from_logits(logits, chunk_size=chunk)
    assert max(n for n, _ in rec.allocs) <= chunk * vocab
    with _AllocationRecorder() as rec_bw:
        h.sum().backward()
    full = [(n, d) for n, d in rec_bw.allocs if n > chunk * vocab]
    # the only full-size buffer is the gradient of the logits, in the logits' dtype
    assert full and all(n == n_rows * vocab and d == torch.bfloat16 for n, d in full)
    assert len(full) == 1


def test_allocation_recorder_sees_the_naive_full_size_softmax():
    """Control for the test above: the naive formula does allocate full-size float32 tensors."""
    logits = torch.randn(4, 16, 1000).to(torch.bfloat16)
    with _AllocationRecorder() as rec:
        logp = torch.log_softmax(logits.float(), dim=-1)
        -(logp.exp() * logp).sum(-1)
    assert any(n == 64 * 1000 and d == torch.float32 for n, d in rec.allocs)


def test_entropy_gradient_finite_with_banned_tokens():
    logits = torch.tensor([[5.0, float("-inf"), 5.0, 3.0]], requires_grad=True)
    entropy_from_logits(logits).sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 1].item() == 0.0
    # d/dz of H sums to zero over the vocabulary (softmax is shift invariant)
    assert abs(logits.grad.sum().item()) < 1e-6
