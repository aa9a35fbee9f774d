"""Core attention for megatron-core's local (non-TE) layer spec with packed sequences and CP.

megatron-core's ``DotProductAttention`` refuses packed (THD) input and context
parallelism; on the GPU Transformer Engine's attention does both. This module is the CPU
counterpart, selected where the model spec is built (``models.provider.layer_spec``):

* unpacked input (``packed_seq_params is None``): exactly megatron's ``DotProductAttention``
  (it is the parent class), so the padded path is unchanged;
* packed input (``qkv_format == "thd"``, tensors ``[t, heads, head_dim]``): softmax
  attention within each segment of ``cu_seqlens`` (``cu_seqlens_q_padded`` when given) under
  a causal mask, so tokens of different sequences never see each other;
* context parallelism (CP > 1, THD only): every CP rank holds chunks ``r`` and
  ``2 cp - 1 - r`` of each sequence (the zigzag split of ``training.packing``); K and V are
  all-gathered over the CP group (autograd-aware: their gradients are summed back to the
  rank that owns them) and each local query attends to the keys of its sequence at
  positions <= its own.

For segment ``i`` with queries ``Q_i`` at positions ``p_q`` and keys ``K_i`` at ``p_k``:
``O_i = softmax(Q_i K_i^T / sqrt(d) + M_i) V_i`` with ``M_i = 0`` where ``p_k <= p_q`` and
``-inf`` elsewhere (GQA: each key/value head serves ``heads / groups`` query heads).
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention


def _segments(packed_seq_params):
    cu = packed_seq_params.cu_seqlens_q_padded
    if cu is None:
        cu = packed_seq_params.cu_seqlens_q
    if cu is None:
        raise ValueError("packed attention: PackedSeqParams has neither cu_seqlens_q_padded nor cu_seqlens_q")
    cu_kv = packed_seq_params.cu_seqlens_kv_padded
    if cu_kv is None:
        cu_kv = packed_seq_params.cu_seqlens_kv
    if cu_kv is not None and not torch.equal(cu_kv.cpu(), cu.cpu()):
        raise ValueError("packed attention: self-attention needs cu_seqlens_kv == cu_seqlens_q")
    return [int(x) for x in cu.tolist()]


class PackedDotProductAttention(DotProductAttention):
    """megatron's ``DotProductAttention`` plus packed (THD) segments and context parallelism."""

    def __init__(
        self,
        config,
        layer_number,
        attn_mask_type,
        attention_type,
        attention_dropout=None,
        softmax_scale=None,
        cp_comm_type=None,
        pg_collection=None,
    ):
        # the parent refuses CP > 1 (it has no CP path); CP is handled here, in forward
        cfg1 = copy.copy(config)
        cfg1.context_parallel_size = 1
        super().__init__(
            cfg1,
            layer_number,
            attn_mask_type,
            attention_type,
            attention_dropout,
            softmax_scale,
            cp_comm_type,
            pg_collection,
        )
        self.config = config
        self.cp_group = getattr(pg_collection, "cp", None) if pg_collection is not None else None
        if config.apply_query_key_layer_scaling:
            raise ValueError("PackedDotProductAttention: apply_query_key_layer_scaling is not supported")
        if config.softmax_type != "vanilla" or self.softmax_offset is not None:
            raise ValueError(f"PackedDotProductAttention: softmax_type {config.softmax_type!r} is not supported")

    def forward(
        self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None, packed_seq_params=None
    ):
        if packed_seq_params is None:
            if self.config.context_parallel_size > 1:
                raise ValueError("context parallelism needs packed (THD) micro-batches: pass packed_seq_params")
            return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, None)
        if packed_seq_params.qkv_format != "thd":
            raise ValueError(f"packed attention: qkv_format {packed_seq_params.qkv_format!r} (only 'thd')")
        if attention_bias is not None:
            raise ValueError("packed attention: attention_bias is not supported")
        cp_group = packed_seq_params.cp_group or self.cp_group
        if cp_group is None:
            cp_group = parallel_state.get_context_parallel_group()
        return packed_attention(
            query, key, value, _segments(packed_seq_params), self.softmax_scale, cp_group, self._dropout
        )

    def _dropout(self, probs):
        if self.attention_dropout.p == 0:
            return probs
        if not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                return self.attention_dropout(probs)
        return self.attention_dropout(probs)


class _AllGather(torch.autograd.Function):
    """All-gather along a new leading dim; backward sums each rank's slice over the group
    (a reduce-scatter). torch.distributed.nn's all_gather emulates that on gloo with a
    scatter that uses group ranks as global ranks, which fails for any group not starting at
    rank 0 (e.g. CP x TP)."""

    @staticmethod
    def forward(ctx, t, group):
        ctx.group = group
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, t, group=group)
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None


def _gather_cp(t: torch.Tensor, cp_group) -> list:
    """All-gather ``t`` over the CP group; gradients flow back to the owning rank."""
    return list(_AllGather.apply(t.contiguous(), cp_group).unbind(0))


def packed_attention(query, key, value, cu_seqlens: list, softmax_scale: float, cp_group=None, dropout=None):
    """Causal attention within each packed segment; ``query`` [t, np, hn], ``key``/``value`` [t, ng, hn].

    ``cu_seqlens`` are the global (padded) segment boundaries. With a CP group of size > 1,
    ``t`` is this rank's zigzag share (``sum(L_i) / cp`` tokens) and K/V are all-gathered.
    Returns ``[t, np * hn]``.
    """
    t, nq, hn = query.shape
    ng = key.shape[1]
    if nq % ng:
        raise ValueError(f"packed attention: {nq} query heads not a multiple of {ng} key/value heads")
    rep = nq // ng
    cp = cp_group.size() if cp_group is not None else 1
    r = cp_group.rank() if cp > 1 else 0
    lens = [b - a for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    if sum(lens) != t * cp:
        raise ValueError(f"packed attention: cu_seqlens cover {sum(lens)} tokens, the input has {t} x CP {cp}")
    if cp > 1:
        ks, vs = _gather_cp(key, cp_group), _gather_cp(value, cp_group)
    outs, off = [], 0
    for L in lens:
        n_loc = L // cp
        q = query[off : off + n_loc]
        if cp == 1:
            k, v = key[off : off + L], value[off : off + L]
            qpos = kpos = torch.arange(L, device=query.device)
        else:
            if L % (2 * cp):
                raise ValueError(f"packed attention: sequence length {L} not a multiple of 2 * CP = {2 * cp}")
            c = L // (2 * cp)
            owner = [(g, 0) if g < cp else (2 * cp - 1 - g, 1) for g in range(2 * cp)]  # chunk g -> (rank, half)
            k = torch.cat([ks[rk][off + h * c : off + (h + 1) * c] for rk, h in owner])
            v = torch.cat([vs[rk][off + h * c : off + (h + 1) * c] for rk, h in owner])
            kpos = torch.arange(L, device=query.device)
            qpos = torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * cp - 1 - r) * c, (2 * cp - r) * c)])
            qpos = qpos.to(query.device)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * softmax_scale  # [np, n_loc, L]
        masked = kpos.view(1, 1, -1) > qpos.view(1, -1, 1)
        scores = scores.masked_fill(masked, float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        if dropout is not None:
            probs = dropout(probs)
        outs.append(torch.einsum("hqk,khd->qhd", probs, v).reshape(n_loc, nq * hn))
        off += n_loc
    return torch.cat(outs) if outs else query.new_zeros(0, nq * hn)
