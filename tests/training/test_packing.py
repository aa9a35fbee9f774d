"""Pure packing functions: token-balanced partitions, THD packs, the zigzag CP split, the CPU
packed/CP core attention and the chunked logprobs (single process)."""

from __future__ import annotations

import random

import pytest
import torch

from megatron_dapo.training import packing as pk
from megatron_dapo.training.item import TrainItem


def _dapo_like_lengths(n, seed=0):
    rng = random.Random(seed)
    return [min(2048, int(rng.lognormvariate(5.5, 0.8))) + 50 for _ in range(n)]


def _greedy(weights, k):
    loads, parts = [0] * k, [[] for _ in range(k)]
    for i in range(len(weights)):  # in arrival order, to the least loaded part
        r = min(range(k), key=lambda j: loads[j])
        parts[r].append(i)
        loads[r] += weights[i]
    return parts


def test_karmarkar_karp_covers_every_item_once_and_balances():
    w = _dapo_like_lengths(64)
    for k in (2, 3, 8):
        parts, imb = pk.balanced_partition(w, k)
        assert sorted(i for p in parts for i in p) == list(range(64))
        loads = [sum(w[i] for i in p) for p in parts]
        assert imb == pytest.approx(max(loads) / (sum(loads) / k))
        greedy = pk.imbalance([sum(w[i] for i in p) for p in _greedy(w, k)])
        assert imb <= greedy
        assert imb < 1.02


def test_karmarkar_karp_equal_size_and_determinism():
    w = _dapo_like_lengths(48, seed=3)
    parts = pk.karmarkar_karp(w, 4, equal_size=True)
    assert [len(p) for p in parts] == [12] * 4
    assert parts == pk.karmarkar_karp(list(w), 4, equal_size=True)
    with pytest.raises(ValueError, match="equal size"):
        pk.karmarkar_karp(w[:47], 4, equal_size=True)
    assert pk.karmarkar_karp([5, 4, 3, 3, 3], 2) in (
        [[1, 2, 3], [0, 4]],
        [[0, 4], [1, 2, 3]],
        [[0, 2], [1, 3, 4]],
        [[1, 3, 4], [0, 2]],
        [[0, 3], [1, 2, 4]],
        [[1, 2, 4], [0, 3]],
    )


def test_pack_microbatches_respects_budget_and_is_near_minimal():
    lens = _dapo_like_lengths(100, seed=1)
    budget = 4096
    parts = pk.pack_microbatches(lens, budget, multiple=4)
    assert sorted(i for p in parts for i in p) == list(range(100))
    cost = [pk.padded_len(n, 4) for n in lens]
    assert all(sum(cost[i] for i in p) <= budget for p in parts)
    assert len(parts) <= -(-sum(cost) // budget) + 1
    # a sample over the budget gets its own micro-batch
    parts = pk.pack_microbatches([10, 5000, 20], 4096)
    assert [5000] in [[[10, 5000, 20][i] for i in p] for p in parts]


def test_pack_samples_layout():
    samples = [
        TrainItem(tokens=[5, 6, 7, 8, 9], prompt_len=2, advantage=1.5, old_logprobs=[-1.0, -2.0, -3.0]),
        TrainItem(tokens=[11, 12, 13], prompt_len=1, advantage=-0.5, train=False, old_logprobs=[-4.0, -5.0]),
    ]
    b = pk.pack_samples(samples, multiple=4)
    assert b["seqlens_padded"] == [8, 4] and b["cu_seqlens"].tolist() == [0, 8, 12]
    assert b["tokens"][0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0, 11, 12, 13, 0]
    assert b["position_ids"][0].tolist() == list(range(8)) + list(range(4))
    assert b["labels"][0].tolist() == [6, 7, 8, 9, 0, 0, 0, 0, 12, 13, 0, 0]
    # position t scores token t+1: response tokens 7, 8, 9 at positions 1, 2, 3
    assert b["resp_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0]
    assert b["loss_mask"][0].tolist() == [0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0]
    assert b["old_logprobs"][0, 1:4].tolist() == [-1.0, -2.0, -3.0] and b["old_logprobs"][0, 8:10].tolist() == [
        -4.0,
        -5.0,
    ]
    assert b["advantages"][0, 0] == 1.5 and b["advantages"][0, 9] == -0.5
    with pytest.raises(ValueError, match="prompt_len"):
        TrainItem(tokens=[1, 2], prompt_len=3)


def test_pad_multiple():
    assert pk.pad_multiple(1, 1) == 1 and pk.pad_multiple(8, 1) == 1
    assert pk.pad_multiple(8, 1, sequence_parallel=True) == 8
    assert pk.pad_multiple(1, 2) == 4 and pk.pad_multiple(2, 4, sequence_parallel=True) == 16


def test_zigzag_split_matches_transformer_engine_order_and_inverts():
    # CP 2, one sequence of 8: 4 chunks of 2; rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2
    assert pk.zigzag_index([8], 2, 0).tolist() == [0, 1, 6, 7]
    assert pk.zigzag_index([8], 2, 1).tolist() == [2, 3, 4, 5]
    lens = [8, 16, 4]
    parts = [pk.zigzag_index(lens, 2, r) for r in range(2)]
    assert sorted(torch.cat(parts).tolist()) == list(range(28))
    seg, pos = pk.zigzag_positions(lens, 2, 1)
    assert seg.tolist()[:4] == [0] * 4 and pos.tolist()[:4] == [2, 3, 4, 5]
    x = torch.arange(28.0)
    assert torch.equal(pk.unzigzag([x[p] for p in parts], lens), x)
    with pytest.raises(ValueError, match="multiple of 2"):
        pk.zigzag_index([6], 2, 0)


def test_packed_microbatch_counts_and_grid():
    samples = [
        TrainItem(tokens=list(range(1, 10)), prompt_len=3),
        TrainItem(tokens=list(range(1, 6)), prompt_len=2, train=False),
    ]
    mb = pk.packed_microbatch(samples, multiple=4, cp_size=2, cp_rank=1)
    assert mb["tokens"].shape == (1, (12 + 8) // 2)
    assert mb["n_loss_tokens"] == 6 and mb["n_loss_seqs"] == 1  # whole sequences, not this rank's share
    g = pk.to_grid(torch.arange(10.0), mb["grid_rows"], mb["grid_cols"], mb["grid_shape"])
    assert g.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 0, 0]]


def test_packed_attention_equals_per_sequence_causal_attention():
    from megatron_dapo.models.attention import packed_attention

    torch.manual_seed(0)
    lens = [5, 3, 8]
    q, k, v = torch.randn(16, 4, 8), torch.randn(16, 2, 8), torch.randn(16, 2, 8)
    got = packed_attention(q, k, v, [0, 5, 8, 16], 8**-0.5)
    off = 0
    for L in lens:
        kk = k[off : off + L].repeat_interleave(2, 1)
        vv = v[off : off + L].repeat_interleave(2, 1)
        ref = (
            torch.nn.functional.scaled_dot_product_attention(
                q[off : off + L].transpose(0, 1), kk.transpose(0, 1), vv.transpose(0, 1), is_causal=True
            )
            .transpose(0, 1)
            .reshape(L, 32)
        )
        assert torch.allclose(got[off : off + L], ref, atol=1e-6)
        off += L


def test_chunked_logprobs_entropy_match_reference_and_chunking():
    from megatron_dapo.algo import entropy_from_logits
    from megatron_dapo.training.logprobs import chunked_logprobs_entropy

    torch.manual_seed(1)
    x = torch.randn(3, 7, 50, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 45, (3, 7))
    w1, w2 = torch.randn(3, 7), torch.randn(3, 7)
    z = x[..., :45] / 0.6
    ref_lp = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    ref_g = torch.autograd.grad((ref_lp * w1).sum() + (ref_ent * w2).sum(), x)[0]
    for chunk in (1, 4, 1000):
        lp, ent = chunked_logprobs_entropy(x, y, 45, 0.6, chunk_size=chunk, tp_rank=0)
        assert (lp - ref_lp).abs().max() < 1e-5 and (ent - ref_ent).abs().max() < 1e-5
        # the same quantity as the pure function of the equation (algo/entropy.py)
        assert (ent - entropy_from_logits(z.detach(), chunk_size=chunk)).abs().max() < 1e-5
        g = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), x)[0]
        assert (g - ref_g).abs().max() < 1e-5
        assert g[..., 45:].abs().max() == 0  # padded vocabulary gets no gradient
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs_entropy(x, y, 45, 0.0, tp_rank=0)


@pytest.mark.parametrize(
    "dtype,T,vocab",
    [
        (torch.float32, 1.0, 50),
        (torch.float32, 1.0, 45),
        (torch.float32, 0.6, 50),
        (torch.bfloat16, 1.0, 50),
        (torch.bfloat16, 0.8, 45),
    ],
)
def test_chunked_logprobs_paths_leave_logits_alone(dtype, T, vocab):
    """Each scratch-buffer path (a view of fp32 logits at T=1 with no padding: the gradient
    written in place; copies otherwise) against the float64 reference; the logits are never
    written; ``with_entropy=False`` gives the same logprobs and logprob gradient."""
    from megatron_dapo.training.logprobs import chunked_logprobs_entropy

    torch.manual_seed(2)
    x0 = (torch.randn(2, 11, 50) * 3).to(dtype)
    y = torch.randint(0, vocab, (2, 11))
    w1, w2 = torch.randn(2, 11), torch.randn(2, 11)
    xr = x0.double().requires_grad_(True)
    z = xr[..., :vocab] / T
    ref_lp = torch.log_softmax(z, -1).gather(-1, y[..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    (ref_g,) = torch.autograd.grad((ref_lp * w1).sum() + (ref_ent * w2).sum(), xr, retain_graph=True)
    (ref_g_lp,) = torch.autograd.grad((ref_lp * w1).sum(), xr)
    tol = 1e-4 if dtype == torch.float32 else 2e-2  # bf16 gradients are rounded to bf16
    for with_entropy in (True, False):
        x = x0.clone().requires_grad_(True)
        lp, ent = chunked_logprobs_entropy(x, y, vocab, T, chunk_size=4, tp_rank=0, with_entropy=with_entropy)
        assert (lp.double() - ref_lp).abs().max() < 1e-4
        if with_entropy:
            assert (ent.double() - ref_ent).abs().max() < 1e-4
            (g,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), x)
            want = ref_g
        else:
            assert torch.count_nonzero(ent) == 0
            (g,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), x)  # ent is a constant
            want = ref_g_lp
        assert g.dtype == dtype and (g.double() - want).abs().max() < tol
        assert torch.equal(x.detach(), x0), "the logits were written"
        if vocab < 50:
            assert g[..., vocab:].abs().max() == 0


def test_dp_shards_balance_tokens_not_counts():
    from megatron_dapo.driver.batch import dp_shards

    lens = _dapo_like_lengths(64, seed=7)
    mb = [TrainItem(tokens=[1] * n, prompt_len=1, advantage=i) for i, n in enumerate(lens)]  # advantage: an id
    shards = dp_shards(mb, 4)
    assert sorted(x.advantage for s in shards for x in s) == list(range(64))
    assert all(s and [x.advantage for x in s] == sorted(x.advantage for x in s) for s in shards)
    loads = [sum(x.n_tokens for x in s) for s in shards]
    assert pk.imbalance(loads) < 1.01
    # splitting by counts (16 each, in arrival order) is far worse on this mix
    naive = [sum(lens[r * 16 : (r + 1) * 16]) for r in range(4)]
    assert pk.imbalance(loads) < pk.imbalance(naive)
    # one long sample: the other ranks share the rest, every rank keeps at least one
    long_one = TrainItem(tokens=[1] * 1000, prompt_len=1)
    shards = dp_shards([long_one] + [TrainItem(tokens=[1] * 10, prompt_len=1) for _ in range(7)], 4)
    assert sorted(len(s) for s in shards) == [1, 2, 2, 3]
    with pytest.raises(ValueError, match="smaller than DP size"):
        dp_shards(mb[:3], 4)
