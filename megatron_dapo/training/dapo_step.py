"""The DAPO update on megatron-core: THD micro-batches, old-policy logprobs, clipped token-level loss.

Runs on every trainer rank (SPMD). Samples arrive as ``training.item.TrainItem``s
(``Sample.to_item``): ``tokens`` (prompt + response ids), ``prompt_len``, ``advantage``,
``train`` (False = overlong-filtered), ``old_logprobs`` (response tokens), optional
``ref_logprobs`` and ``engine_logprobs``, ``stale_len``, ``routed_experts``.

Loss normalisation: the token (or sequence) count of the WHOLE optimizer step is summed over
this rank's micro-batches and all-reduced over the data-parallel group before the first
forward, then every micro-batch contributes ``sum(its token losses) / global_count``
(``megatron_dapo.algo.aggregate_loss``); DP gradients are summed. K micro-batches on D
ranks therefore give exactly the gradient of the single-batch loss.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

from ..algo import aggregate_loss, kl_penalty
from ..algo.config import AlgorithmConfig
from ..algo.policy_losses import POLICY_LOSSES
from ..algo.staleness import RATIO_TAIL, proximal_from_alpha
from ..algo.tis import mismatch_kl
from ..checkpoint.model_io import unwrap
from ..distributed import collective_device, dp_token_counts
from . import packing as pk
from .forward import forward_backward
from .logprobs import chunked_logprobs_entropy
from .routing_replay import collect_stats
from .setup import Policy, optimizer_step, set_moe_aux_loss_scale
from .stats import LossStats, StepStats
from .token_weights import weigh_items


def _parallel_sizes(model):
    cfg = unwrap(model).config
    return (
        int(cfg.tensor_model_parallel_size),
        int(getattr(cfg, "context_parallel_size", 1) or 1),
        bool(getattr(cfg, "sequence_parallel", False)),
    )


def pad_multiple_of(model) -> int:
    """The multiple every packed sequence of ``model``'s micro-batches is padded to
    (``packing.pad_multiple``: TP under --sequence-parallel, 2 x CP)."""
    return pk.pad_multiple(*_parallel_sizes(model))


def make_microbatches(
    model, samples: list, micro_batch_size: int, max_tokens: Optional[int] = None, packing: bool = False
) -> tuple:
    """THD micro-batches of ``samples`` (``training.item.TrainItem``) for this rank: each one row
    ``[1, T]`` with ``cu_seqlens`` (``packing.packed_microbatch``), each sequence padded only to
    what TP/CP need; with CP, this CP rank's zigzag share.

    Which samples share a micro-batch: with ``packing`` (--use-packing) or CP > 1, the fewest
    micro-batches of at most ``max_tokens`` tokens, balanced by tokens
    (``packing.pack_microbatches``); otherwise consecutive samples, at most
    ``micro_batch_size`` (--micro-batch-size) and, with ``max_tokens``, at most that many
    tokens each (``packing.consecutive_microbatches``: what the right-padded micro-batches of
    earlier versions held). Returns ``(microbatches, order)``: ``order[k]`` lists the sample
    indices of micro-batch ``k``. Deterministic for every PP stage and CP rank of a DP rank.
    """
    from megatron.core import parallel_state as ps

    tp, cp, sp = _parallel_sizes(model)
    mult = pk.pad_multiple(tp, cp, sp)
    cp_rank = ps.get_context_parallel_rank() if cp > 1 else 0
    lens = [x.n_tokens for x in samples]
    if packing or cp > 1:
        if not max_tokens:
            raise ValueError("packed micro-batches need a token budget: set --max-tokens-per-gpu")
        order = pk.pack_microbatches(lens, max_tokens, mult)
    else:
        order = pk.consecutive_microbatches(lens, micro_batch_size, max_tokens, mult)
    mbs = [pk.packed_microbatch([samples[i] for i in idx], mult, cp, cp_rank) for idx in order]
    return mbs, order


def _gather_cp(t: torch.Tensor) -> list:
    """This CP rank's tensor and its peers' (rank order), host side; [t] without CP."""
    from megatron.core import parallel_state as ps

    g = ps.get_context_parallel_group()
    if dist.get_world_size(g) == 1:
        return [t]
    dev = collective_device(g)
    parts = [torch.empty_like(t, device=dev) for _ in range(dist.get_world_size(g))]
    dist.all_gather(parts, t.to(dev), group=g)
    return [p.cpu() for p in parts]


def _cp_reduce_stats(stats: LossStats) -> LossStats:
    """Sum the (sum, count) metric pairs and max the ratio over the CP group (each CP rank saw
    its share of every sequence)."""
    from megatron.core import parallel_state as ps

    g = ps.get_context_parallel_group()
    if dist.get_world_size(g) == 1:
        return stats
    dev = collective_device(g)
    t = torch.tensor(stats.to_list(), dtype=torch.float64, device=dev)
    dist.all_reduce(t, group=g)
    m = torch.tensor([stats.ratio_max], dtype=torch.float64, device=dev)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=g)
    return LossStats.from_list(t.cpu().tolist(), float(m))


@torch.no_grad()
def compute_logprobs(
    policy_or_model,
    samples: list,
    true_vocab: int,
    micro_batch_size: int,
    max_tokens=None,
    temperature: float = 1.0,
    packing: bool = False,
):
    """Per-sample logprobs of the response tokens under the current weights (forward only),
    from ``softmax(logits / temperature)`` (the rollout's sampling distribution).

    The micro-batches of :func:`make_microbatches`; with CP the ranks' shares are gathered back.
    Returns a list (one list of floats per sample) on the last PP stage, None elsewhere.
    """
    from megatron.core import parallel_state as ps

    model = policy_or_model.model if isinstance(policy_or_model, Policy) else policy_or_model
    model.eval()
    mbs, order = make_microbatches(model, samples, micro_batch_size, max_tokens, packing)
    got = []

    def loss_fn(batch, logits):
        a, b = batch["resp_span"]  # label positions of response tokens (the prompts are not scored)
        lp, _ = chunked_logprobs_entropy(
            logits[0, a:b], batch["labels"][0, a:b], true_vocab, temperature, with_entropy=False
        )
        got.append((a, lp.detach().float().cpu()))  # label position t scores token t+1
        return torch.zeros((), dtype=torch.float32, device=logits.device), {}

    forward_backward(model, mbs, loss_fn, forward_only=True)
    model.train()
    if not ps.is_pipeline_last_stage():
        return None
    out = [None] * len(samples)
    for mb, idx, (a, lp) in zip(mbs, order, got):
        local = lp.new_zeros(mb["tokens"].shape[1])
        local[a : a + lp.shape[0]] = lp
        full = pk.unzigzag(_gather_cp(local), mb["seqlens_padded"])
        for i, start in zip(idx, mb["cu_seqlens"][:-1].tolist()):
            x = samples[i]
            out[i] = full[start + x.prompt_len - 1 : start + x.n_tokens - 1].tolist()
    return out


#: the per-token fields of a micro-batch that the loss reads
TOKEN_FIELDS = (
    "loss_mask",
    "resp_mask",
    "old_logprobs",
    "ref_logprobs",
    "engine_logprobs",
    "stale",
    "prox_alpha",
    "is_weight",
    "trained",
    "tis_fresh",
    "tis_clipped",
)


def _loss_inputs(batch: dict, logits: torch.Tensor, true_vocab: int, temperature: float) -> dict:
    """Logprobs, entropy and the per-token fields of a micro-batch as ``[sequences, tokens]``:
    this CP rank's tokens scattered into one row per sequence (``packing.to_grid``). Logprobs and
    entropy are computed over the span of the row that holds response tokens (``resp_span``), in
    chunks (``training.logprobs``): no float32 [tokens x vocab] tensor is built."""
    a, b = batch["resp_span"]
    lp_span, ent_span = chunked_logprobs_entropy(logits[0, a:b], batch["labels"][0, a:b], true_vocab, temperature)
    T = logits.shape[1]
    lp = torch.nn.functional.pad(lp_span, (a, T - b))
    ent = torch.nn.functional.pad(ent_span, (a, T - b))
    rows, cols, shape = batch["grid_rows"], batch["grid_cols"], batch["grid_shape"]

    def grid(v):
        return pk.to_grid(v, rows, cols, shape)

    out = {"lp": grid(lp), "ent": grid(ent), "adv": grid(batch["advantages"])}
    for k in TOKEN_FIELDS:
        if k in batch:
            out[k] = grid(batch[k])
    return out


def interpolate_proximal(x: dict, tis_cap: float) -> dict:
    r"""``--proximal-logprobs interpolate``: where ``prox_alpha`` > 0, the proximal policy from
    the behaviour policy's logprobs (``engine_logprobs``) and the current ones, detached
    (``algo.staleness.interpolated_proximal_logprobs``, A-3PO):

    .. math:: \log\pi_{prox} = \log\pi_{behav} + \alpha\,(\log\pi_\theta - \log\pi_{behav})

    replaces ``old_logprobs`` there (the clip's anchor), and the off-policy weight of those loss
    tokens becomes :math:`\min(\pi_{prox}/\pi_{behav}, C)` (``is_weight``; C = ``--tis-cap``).
    Unchanged where ``prox_alpha`` is 0 (or absent)."""
    alpha = x.get("prox_alpha")
    if alpha is None or not bool((alpha > 0).any()):
        return x
    on = alpha > 0
    eng = x["engine_logprobs"]
    prox = proximal_from_alpha(eng, x["lp"], alpha)
    w = torch.clamp(torch.exp(prox - eng), max=tis_cap).to(x["is_weight"].dtype)
    out = dict(x)
    out["old_logprobs"] = torch.where(on, prox, x["old_logprobs"])
    out["is_weight"] = torch.where(on & (x["loss_mask"] != 0), w, x["is_weight"])
    return out


def dapo_loss_fn(
    algo: AlgorithmConfig, true_vocab: int, global_tokens, global_seqs, nan_loss: bool = False, temperature: float = 1.0
):
    """The per-micro-batch loss: the --policy-loss surrogate (algo.POLICY_LOSSES), aggregated over the whole step.

    Logprobs and entropy come from ``logits / temperature`` (the rollout temperature), like the
    old logprobs they are compared with. THD micro-batches, any CP.
    Each token's loss is multiplied by its importance weight ``is_weight`` and counted where
    ``loss_mask`` is 1, both set per sample by ``token_weights.weigh_items`` (``--tis-mode`` on the
    fresh tokens, ``--partial-rollout-offpolicy`` on the stale ones)."""

    spec = POLICY_LOSSES.get(algo.policy_loss)

    def loss_fn(batch, logits):
        if batch["cp_size"] > 1 and spec.whole_sequences:
            raise ValueError(f"--policy-loss {algo.policy_loss} needs whole sequences per rank: not with CP > 1")
        if batch["cp_size"] > 1 and algo.loss_agg_mode == "seq-mean-token-mean":
            raise ValueError("--loss-agg-mode seq-mean-token-mean needs whole sequences per rank: not with CP > 1")
        x = interpolate_proximal(_loss_inputs(batch, logits, true_vocab, temperature), algo.tis_cap)
        lp, mask, old = x["lp"], x["loss_mask"], x["old_logprobs"]
        per_tok, m = spec(lp, old, x["adv"], mask, algo)
        eng, stale = x["engine_logprobs"], x["stale"]
        w = x["is_weight"]
        # the logged mismatch is the engine/trainer one: over the tokens of the current weights
        fresh = x["tis_fresh"] != 0
        trained = x["trained"] != 0  # the tokens of samples that train (before any weighting)
        n_fresh = fresh.sum()
        ff = fresh.to(torch.float32)
        with torch.no_grad():
            kl_fresh = (mismatch_kl(old, eng, fresh).to(torch.float32) * ff).sum()
            w_fresh = (w.detach().to(torch.float32) * ff).sum()
            clipped = (x["tis_clipped"].to(torch.float32) * ff).sum()
            w_loss = w.detach().to(torch.float32) * mask.to(torch.float32)  # 0 outside the loss tokens
            w_sum, w_sq = w_loss.sum(), (w_loss * w_loss).sum()
            # the stale loss tokens' behaviour-vs-proximal log-ratio and its tail
            on_stale = (stale != 0) & (mask != 0)
            lr_b = torch.where(
                on_stale, old.to(torch.float32) - eng.to(torch.float32), torch.zeros_like(lp, dtype=torch.float32)
            )
            n_stale = on_stale.sum()
            tail = (lr_b > math.log(RATIO_TAIL)).sum()
        per_tok = per_tok * w.to(device=per_tok.device, dtype=per_tok.dtype)
        loss = aggregate_loss(per_tok, mask, algo.loss_agg_mode, global_tokens, global_seqs)
        resp = x["resp_mask"]
        need_grad = algo.entropy_coef > 0 and torch.is_grad_enabled()
        ent = x["ent"] if need_grad else x["ent"].detach()
        if need_grad:
            loss = loss - algo.entropy_coef * aggregate_loss(ent, mask, algo.loss_agg_mode, global_tokens, global_seqs)
        kl_sum = torch.zeros((), device=lp.device)
        if algo.kl_coef > 0 and "ref_logprobs" in x:
            kl_tok = kl_penalty(lp, x["ref_logprobs"], algo.kl_estimator)
            loss = loss + algo.kl_coef * aggregate_loss(kl_tok, mask, algo.loss_agg_mode, global_tokens, global_seqs)
            kl_sum = (kl_tok.detach() * mask).sum()
        if nan_loss:
            loss = loss * float("nan")
        n_mask = mask.sum()
        n_resp = resp.sum()
        stats = LossStats(  # (sum, count) pairs: reduced over micro-batches and DP ranks by the caller
            pg_loss=((per_tok.detach() * mask).sum(), n_mask),
            entropy=((ent.detach() * resp).sum(), n_resp),
            clip_frac_low=(m["clip_frac_low"].detach() * n_mask, n_mask),
            clip_frac_high=(m["clip_frac_high"].detach() * n_mask, n_mask),
            dual_clip_frac=(m["dual_clip_frac"].detach() * n_mask, n_mask),
            approx_kl=(m["approx_kl"].detach() * n_mask, n_mask),
            ratio_mean=(m["ratio_mean"].detach() * n_mask, n_mask),
            kl=(kl_sum, n_mask),
            tis_weight_mean=(w_fresh, n_fresh),
            tis_clip_frac=(clipped, n_fresh),
            mismatch_kl=(kl_fresh, n_fresh),
            offpolicy_token_frac=(((stale != 0) & trained).sum(), trained.sum()),
            is_weight_mean=(w_sum, n_mask),
            is_weight_sq_mean=(w_sq, n_mask),
            is_ratio_tail_frac=(tail, n_stale),
            stale_log_ratio_mean=(lr_b.sum(), n_stale),
            ratio_max=m["ratio_max"].detach(),
        )
        return loss, stats

    return loss_fn


def train_on_minibatch(
    policy: Policy,
    samples: list,
    algo: AlgorithmConfig,
    true_vocab: int,
    micro_batch_size: int,
    max_tokens=None,
    nan_loss: bool = False,
    temperature: float = 1.0,
    packing: bool = False,
    offpolicy: Optional[str] = None,
) -> StepStats:
    """One optimizer step on this DP rank's shard of a mini-batch; returns its stats.

    Micro-batches: :func:`make_microbatches` (``packing``: token-budget packing). The
    step's token and sequence counts come from whole sequences (every CP rank of a DP rank
    has the same) and are summed over DP only; each CP rank's metric sums cover its share of
    the tokens and are summed over the CP group. ``dp_token_imbalance``: max over mean of the
    DP ranks' sample tokens in this step (1.0 = balanced).
    """
    from megatron.core import parallel_state as ps

    samples = weigh_items(samples, algo, offpolicy)
    mbs, _ = make_microbatches(policy.model, samples, micro_batch_size, max_tokens, packing)
    local = [sum(mb["n_loss_tokens"] for mb in mbs), sum(mb["n_loss_seqs"] for mb in mbs)]
    my_tokens = float(sum(x.n_tokens for x in samples))
    # the WHOLE optimizer step's token and sequence counts, over all micro-batches and DP ranks,
    # and the DP ranks' token loads (sum and max) for the imbalance
    counts = dp_token_counts(local + [my_tokens, float(len(mbs))])
    tok_max = dp_token_counts([my_tokens], op=dist.ReduceOp.MAX)
    set_moe_aux_loss_scale(policy.config, float(counts[3]))  # MoE: load-balancing loss = mean over micro-batches
    g_tok, g_seq = float(counts[0]), float(counts[1])
    dp = ps.get_data_parallel_world_size()
    imbalance = float(tok_max[0]) / (float(counts[2]) / dp) if float(counts[2]) > 0 else 1.0
    policy.model.zero_grad_buffer()
    policy.optimizer.zero_grad()
    loss_fn = dapo_loss_fn(algo, true_vocab, g_tok, g_seq, nan_loss, temperature)
    stats = forward_backward(policy.model, mbs, loss_fn, forward_only=False)
    ok, grad_norm = optimizer_step(policy.optimizer, policy.optimizer.config.clip_grad)
    if ok:
        policy.scheduler.step(increment=1)
    total = LossStats()
    if ps.is_pipeline_last_stage():
        for st in stats:
            total = total + st.floats()
        total = _cp_reduce_stats(total)
    return StepStats(
        loss=total,
        grad_norm=grad_norm,
        update_successful=ok,
        lr=float(policy.optimizer.param_groups[0]["lr"]),
        global_tokens=g_tok,
        num_microbatches=len(mbs),
        dp_token_imbalance=imbalance,
        # routing replay: per-layer routing sums of this step's forwards (and the old-logprob
        # pass before it), over this DP rank's TP/CP/PP ranks (training/routing_replay.py)
        routing=collect_stats(policy.model),
    )
