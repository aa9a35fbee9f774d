"""Packed (THD) micro-batches, the zigzag context-parallel split and token-balanced partitions.

Pure functions of lengths, lists and tensors: no process groups, no megatron state.

* :func:`karmarkar_karp` splits weighted items into ``k`` parts of near-equal weight (the
  largest differencing method); :func:`balanced_partition` returns the parts and the
  imbalance ``max / mean`` of their weights. The trainer uses it for the samples of a
  mini-batch over data-parallel ranks and for the samples of one rank over micro-batches.
* :func:`pack_microbatches` chooses the fewest micro-batches whose packed (padded) tokens
  fit ``max_tokens``, balanced by tokens (--use-packing, CP); :func:`consecutive_microbatches`
  groups consecutive samples, at most --micro-batch-size each (the default).
* :func:`pack_samples` lays samples out as one THD row (``[1, T]``) with ``cu_seqlens``:
  each sequence is padded only to ``multiple`` tokens (:func:`pad_multiple`: what TP with
  sequence parallelism and 2 x CP need), positions restart at 0 for every sequence, and the
  next-token labels and every per-token field are shifted so that position ``t`` holds what
  scores ``log p(token_{t+1} | tokens_{<=t})``. Shifting before the split means a CP rank
  never needs a token that lives on another rank.
* :func:`zigzag_index` is the load-balanced CP split of Transformer Engine's THD format
  (``thd_get_partitioned_indices``): each padded sequence is cut into ``2 * cp`` equal
  chunks and CP rank ``r`` keeps chunks ``r`` and ``2 * cp - 1 - r``, so every rank gets
  the same share of the causal attention work. :func:`zigzag_positions` gives each kept
  token's sequence and position (what the CPU core attention masks with).
"""

from __future__ import annotations

import heapq
import math
from typing import Optional, Sequence

import torch

from .item import TrainItem
from .token_weights import token_weights_into

# ----------------------------------------------------------------------------- partitions


def karmarkar_karp(weights: Sequence[float], k: int, equal_size: bool = False) -> list:
    """Split item indices into ``k`` parts of near-equal total weight (largest differencing).

    Karmarkar & Karp (1982), the k-way set differencing method: every item starts as a
    ``k``-tuple of subsets (the item alone in one, the rest empty); the two tuples with the
    largest spread (max - min subset sum) are merged by joining the heaviest subset of one
    with the lightest of the other, until one tuple remains. With ``equal_size`` the items,
    heaviest first, enter in rounds of ``k`` (one per subset), so every part gets exactly
    ``len(weights) / k`` items (``len(weights)`` must be a multiple of ``k``).

    Deterministic (ties break by index). Returns ``k`` lists of indices, each sorted, the
    parts ordered by decreasing weight.
    """
    n = len(weights)
    if k < 1:
        raise ValueError(f"karmarkar_karp: k must be >= 1, got {k}")
    if any(w < 0 for w in weights):
        raise ValueError("karmarkar_karp: weights must be >= 0")
    if equal_size and n % k:
        raise ValueError(f"karmarkar_karp: {n} items cannot be split into {k} parts of equal size")
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    heap = []
    counter = 0

    def push(parts):  # parts: list of (sum, [indices]) sorted by decreasing sum
        nonlocal counter
        spread = parts[0][0] - parts[-1][0]
        heapq.heappush(heap, (-spread, counter, parts))
        counter += 1

    if equal_size:
        for r in range(0, n, k):
            parts = [(float(weights[i]), [i]) for i in order[r : r + k]]
            push(sorted(parts, key=lambda p: -p[0]))
    else:
        for i in order:
            push([(float(weights[i]), [i])] + [(0.0, []) for _ in range(k - 1)])
    if not heap:
        return [[] for _ in range(k)]
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(a[j][0] + b[k - 1 - j][0], a[j][1] + b[k - 1 - j][1]) for j in range(k)]
        push(sorted(merged, key=lambda p: -p[0]))
    parts = heapq.heappop(heap)[2]
    return [sorted(p[1]) for p in parts]


def imbalance(loads: Sequence[float]) -> float:
    """``max / mean`` of the loads (1.0 = perfectly balanced; 1.0 for all-zero loads)."""
    if not loads:
        raise ValueError("imbalance: no loads")
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean > 0 else 1.0


def balanced_partition(weights: Sequence[float], k: int, equal_size: bool = False):
    """:func:`karmarkar_karp` parts and their :func:`imbalance` (max over mean part weight)."""
    parts = karmarkar_karp(weights, k, equal_size)
    return parts, imbalance([sum(weights[i] for i in p) for p in parts])


# ----------------------------------------------------------------------------- packing


def pad_multiple(tp: int = 1, cp: int = 1, sequence_parallel: bool = False) -> int:
    """The multiple every packed sequence is padded to.

    CP > 1 splits each sequence into ``2 * cp`` equal chunks; sequence parallelism splits
    each CP rank's tokens over TP (Megatron pads THD sequences to ``tp * cp * 2`` for both).
    Plain TP needs no padding.
    """
    m = 2 * cp if cp > 1 else 1
    if sequence_parallel and tp > 1:
        m = m * tp
    return m


def padded_len(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pack_microbatches(
    lengths: Sequence[int], max_tokens: int, multiple: int = 1, max_seqs: Optional[int] = None
) -> list:
    """Group sample indices into the fewest micro-batches whose packed tokens fit ``max_tokens``.

    A sample's cost is its length padded to ``multiple``. Starts from
    ``ceil(total / max_tokens)`` (and ``ceil(n / max_seqs)``) micro-batches and adds one until
    the token-balanced :func:`karmarkar_karp` split fits; a sample longer than the budget on
    its own gets a micro-batch of its own. Returns lists of indices (each sorted), the
    micro-batches in decreasing token order. Deterministic, so every PP stage and CP rank of
    a DP rank builds the same ones.
    """
    if max_tokens is None or max_tokens < 1:
        raise ValueError(f"pack_microbatches: max_tokens must be a positive token budget, got {max_tokens}")
    n = len(lengths)
    if n == 0:
        return []
    cost = [padded_len(int(x), multiple) for x in lengths]
    big = [i for i in range(n) if cost[i] >= max_tokens]
    rest = [i for i in range(n) if cost[i] < max_tokens]
    out = [[i] for i in big]
    if rest:
        total = sum(cost[i] for i in rest)
        m = max(1, math.ceil(total / max_tokens))
        if max_seqs:
            m = max(m, math.ceil(len(rest) / max_seqs))
        while True:
            parts = karmarkar_karp([cost[i] for i in rest], min(m, len(rest)))
            ok = all(sum(cost[rest[j]] for j in p) <= max_tokens for p in parts)
            if max_seqs:
                ok = ok and all(len(p) <= max_seqs for p in parts)
            if ok:
                break
            m += 1
        out += [sorted(rest[j] for j in p) for p in parts if p]
    out.sort(key=lambda p: (-sum(cost[i] for i in p), p[0]))
    return out


def consecutive_microbatches(
    lengths: Sequence[int], max_seqs: int, max_tokens: Optional[int] = None, multiple: int = 1
) -> list:
    """Group consecutive sample indices, in order: at most ``max_seqs`` samples per micro-batch
    and, with ``max_tokens``, at most that many packed tokens (each length padded to
    ``multiple``); a sample over the budget goes alone. Deterministic."""
    if max_seqs < 1:
        raise ValueError(f"consecutive_microbatches: max_seqs must be >= 1, got {max_seqs}")
    out, cur, tokens = [], [], 0
    for i, n in enumerate(lengths):
        c = padded_len(int(n), multiple)
        if cur and (len(cur) >= max_seqs or (max_tokens and tokens + c > max_tokens)):
            out.append(cur)
            cur, tokens = [], 0
        cur.append(i)
        tokens += c
    if cur:
        out.append(cur)
    return out


def cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """Cumulative sequence starts ``[0, l0, l0 + l1, ...]`` as int32 (THD ``cu_seqlens``)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    if lengths:
        out[1:] = torch.cumsum(torch.tensor(list(lengths), dtype=torch.int64), 0).to(torch.int32)
    return out


def pack_samples(samples: Sequence[TrainItem], multiple: int = 1) -> dict:
    """One THD row of ``samples`` (``training.item.TrainItem``).

    Returns tensors of shape ``[1, T]`` (T = sum of padded lengths):

    * ``tokens``, ``position_ids`` (restarting at 0 per sequence), ``labels`` (the next token
      within the same sequence, 0 at a sequence's last position and on padding);
    * label-aligned fields: ``loss_mask`` (1 where the label is a trained response token, and
      ``is_weight``, ``trained``, ``tis_fresh``, ``tis_clipped``: ``token_weights.weigh_items``),
      ``resp_mask`` (1 where it is any response token), ``old_logprobs`` and
      ``ref_logprobs`` (of the label token), ``engine_logprobs`` (the rollout engine's, else
      the old ones), ``stale`` (1 on the ``stale_len`` leading response tokens generated
      under older weights), ``prox_alpha`` (``TrainItem.prox_alpha``, 0 where not set),
      ``advantages`` (the sample's advantage);

    and ``cu_seqlens`` (padded boundaries, int32 [n+1]), ``seqlens`` (true lengths),
    ``seqlens_padded``, ``max_seqlen`` (the longest padded sequence).
    """
    if not samples:
        raise ValueError("pack_samples: no samples")
    if multiple < 1:
        raise ValueError(f"pack_samples: multiple must be >= 1, got {multiple}")
    lens = [s.n_tokens for s in samples]
    plens = [padded_len(n, multiple) for n in lens]
    T = sum(plens)
    tokens = torch.zeros(1, T, dtype=torch.long)
    labels = torch.zeros(1, T, dtype=torch.long)
    pos = torch.zeros(1, T, dtype=torch.long)
    loss_mask = torch.zeros(1, T)
    resp_mask = torch.zeros(1, T)
    old = torch.zeros(1, T)
    ref = torch.zeros(1, T)
    adv = torch.zeros(1, T)
    eng, stale, alpha = torch.zeros(1, T), torch.zeros(1, T), torch.zeros(1, T)
    weight, trained, fresh, clipped = (torch.zeros(1, T) for _ in range(4))
    has_ref = all(s.ref_logprobs is not None for s in samples)
    off = 0
    for s, n, pn in zip(samples, lens, plens):
        p = s.prompt_len
        ids = s.tokens
        tokens[0, off : off + n] = ids
        labels[0, off : off + n - 1] = ids[1:]
        pos[0, off : off + pn] = torch.arange(pn)
        # label position t scores token t+1: response tokens p..n-1 sit at label positions p-1..n-2
        a, b = off + p - 1, off + n - 1
        resp_mask[0, a:b] = 1
        token_weights_into(s, n - p, loss_mask[0, a:b], weight[0, a:b], trained[0, a:b], fresh[0, a:b], clipped[0, a:b])
        if s.old_logprobs is not None:
            old[0, a:b] = s.old_logprobs
        if has_ref:
            ref[0, a:b] = s.ref_logprobs
        # the engine's logprobs (else the old ones: importance ratio 1)
        eng[0, a:b] = s.engine_logprobs if s.engine_logprobs is not None else old[0, a:b]
        stale[0, a : a + min(s.stale_len, n - p)] = 1
        if s.prox_alpha is not None:
            alpha[0, a:b] = s.prox_alpha
        adv[0, off : off + pn] = s.advantage
        off += pn
    out = {
        "tokens": tokens,
        "labels": labels,
        "position_ids": pos,
        "loss_mask": loss_mask,
        "resp_mask": resp_mask,
        "old_logprobs": old,
        "advantages": adv,
        "cu_seqlens": cu_seqlens(plens),
        "seqlens": lens,
        "engine_logprobs": eng,
        "stale": stale,
        "prox_alpha": alpha,
        "is_weight": weight,
        "trained": trained,
        "tis_fresh": fresh,
        "tis_clipped": clipped,
        "seqlens_padded": plens,
        "max_seqlen": max(plens),
    }
    if has_ref:
        out["ref_logprobs"] = ref
    if any(s.routed_experts is not None for s in samples):  # routing replay: [1, T, layers, k]
        rows = routing_rows(samples, plens)
        out["routed_experts"] = torch.cat([rows[i, :pn] for i, pn in enumerate(plens)]).unsqueeze(0)
    return out


def routing_rows(samples: Sequence[TrainItem], widths: list) -> Optional[torch.Tensor]:
    """Routing replay: the items' engine routing ``[n, widths[i], layers, top_k]`` int16, one
    row per input position (``training/routing_replay.py``): the engine's experts where it gave
    them (prompt and response tokens; the last token has none), ``FREE`` (-1) on a sample's other
    positions, ``PAD`` (-2) beyond its tokens. None when no item has routing."""
    have = [x.routed_experts for x in samples if x.routed_experts is not None]
    if not have:
        return None
    L, k = have[0].shape[1:]
    out = torch.full((len(samples), max(widths), L, k), -2, dtype=torch.int16)
    for i, x in enumerate(samples):
        n = x.n_tokens
        out[i, :n] = -1
        r = x.routed_experts
        if r is not None:
            m = min(r.shape[0], n)
            out[i, :m] = torch.as_tensor(r[:m], dtype=torch.int16)
    return out


# ----------------------------------------------------------------------------- context parallel


def zigzag_index(seqlens_padded: Sequence[int], cp_size: int, cp_rank: int) -> torch.Tensor:
    """Indices (into the packed row) of the tokens CP rank ``cp_rank`` keeps, in its local order.

    Each sequence (length a multiple of ``2 * cp_size``) is cut into ``2 * cp_size`` chunks;
    the rank keeps chunk ``cp_rank`` then chunk ``2 * cp_size - 1 - cp_rank`` of every
    sequence, sequence after sequence (Transformer Engine's THD partition).
    """
    if not 0 <= cp_rank < cp_size:
        raise ValueError(f"zigzag_index: cp_rank {cp_rank} outside 0..{cp_size - 1}")
    if cp_size == 1:
        return torch.arange(sum(seqlens_padded))
    idx, off = [], 0
    for L in seqlens_padded:
        if L % (2 * cp_size):
            raise ValueError(f"zigzag_index: sequence length {L} is not a multiple of 2 * cp = {2 * cp_size}")
        c = L // (2 * cp_size)
        for j in (cp_rank, 2 * cp_size - 1 - cp_rank):
            idx.append(torch.arange(off + j * c, off + (j + 1) * c))
        off += L
    return torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)


def zigzag_positions(seqlens_padded: Sequence[int], cp_size: int, cp_rank: int):
    """``(segment_ids, positions)`` of the local tokens of :func:`zigzag_index`, int64 [T / cp]."""
    seg = torch.cat([torch.full((L,), i, dtype=torch.long) for i, L in enumerate(seqlens_padded)])
    pos = torch.cat([torch.arange(L) for L in seqlens_padded])
    idx = zigzag_index(seqlens_padded, cp_size, cp_rank)
    return seg[idx], pos[idx]


def split_for_cp(batch: dict, cp_size: int, cp_rank: int) -> dict:
    """This CP rank's part of a :func:`pack_samples` row: every ``[1, T]`` tensor zigzag-sliced."""
    if cp_size == 1:
        return dict(batch)
    idx = zigzag_index(batch["seqlens_padded"], cp_size, cp_rank)
    T = sum(batch["seqlens_padded"])
    return {
        k: (v.index_select(1, idx) if torch.is_tensor(v) and v.dim() >= 2 and v.shape[1] == T else v)
        for k, v in batch.items()
    }


def unzigzag(parts: Sequence[torch.Tensor], seqlens_padded: Sequence[int]) -> torch.Tensor:
    """Inverse of the split: the CP ranks' local ``[..., T/cp]`` tensors (rank order) -> ``[..., T]``."""
    cp = len(parts)
    T = sum(seqlens_padded)
    out = parts[0].new_zeros(*parts[0].shape[:-1], T)
    for r, p in enumerate(parts):
        out[..., zigzag_index(seqlens_padded, cp, r)] = p
    return out


def grid_index(seqlens_padded: Sequence[int], cp_size: int = 1):
    """Where each local token of a (CP-split) packed row goes in a ``[n_seq, max_local_len]`` grid.

    The local row holds ``L_i / cp_size`` tokens of sequence ``i``, sequence after sequence;
    returns ``(rows, cols, (n_seq, max_local_len))``. Scattering per-token values into the
    grid (:func:`to_grid`) gives the ``[batch, seq]`` layout the loss functions of
    ``megatron_dapo.algo`` take, one row per sequence.
    """
    loc = [L // cp_size for L in seqlens_padded]
    rows = torch.repeat_interleave(torch.arange(len(loc)), torch.tensor(loc, dtype=torch.long))
    cols = torch.cat([torch.arange(n) for n in loc]) if loc else torch.zeros(0, dtype=torch.long)
    return rows, cols, (len(loc), max(loc) if loc else 0)


def to_grid(values: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, shape) -> torch.Tensor:
    """``values`` [T] or [1, T] scattered into a zero ``shape`` grid (differentiable)."""
    v = values.reshape(-1)
    out = v.new_zeros(shape)
    return out.index_put((rows.to(v.device), cols.to(v.device)), v)


def packed_microbatch(samples: Sequence[TrainItem], multiple: int = 1, cp_size: int = 1, cp_rank: int = 0) -> dict:
    """One packed micro-batch of ``samples`` as CP rank ``cp_rank`` feeds it to the model.

    :func:`pack_samples` (``multiple`` from :func:`pad_multiple`), then :func:`split_for_cp`,
    plus ``grid_rows``/``grid_cols``/``grid_shape`` (:func:`grid_index`), ``cp_size``,
    ``resp_span`` (the first and one past the last local position whose label is a response
    token: the only logits the loss and the logprobs read) and the step's counts of the WHOLE
    (unsplit) pack: ``n_loss_tokens``, ``n_loss_seqs``.
    """
    if cp_size > 1 and multiple % (2 * cp_size):
        raise ValueError(f"packed_microbatch: multiple {multiple} must be a multiple of 2 * CP = {2 * cp_size}")
    full = pack_samples(samples, multiple)
    lm = full["loss_mask"][0]
    seq_tokens = [
        float(lm[a:b].sum()) for a, b in zip(full["cu_seqlens"][:-1].tolist(), full["cu_seqlens"][1:].tolist())
    ]
    out = split_for_cp(full, cp_size, cp_rank)
    rows, cols, shape = grid_index(full["seqlens_padded"], cp_size)
    have = torch.nonzero(out["resp_mask"][0]).squeeze(1)
    span = (int(have[0]), int(have[-1]) + 1) if have.numel() else (0, min(1, out["tokens"].shape[1]))
    out.update(
        grid_rows=rows,
        grid_cols=cols,
        grid_shape=shape,
        cp_size=cp_size,
        resp_span=span,
        n_loss_tokens=float(lm.sum()),
        n_loss_seqs=float(sum(1 for x in seq_tokens if x > 0)),
    )
    return out
