"""The DAPO update on megatron-core: collate, old-policy logprobs, clipped token-level loss.

Runs on every trainer rank (SPMD). Samples arrive as dicts (``Sample.to_worker``):
``tokens`` (prompt + response ids), ``prompt_len``, ``advantage``, ``train`` (False =
overlong-filtered), ``old_logprobs`` (response tokens), optional ``ref_logprobs``.

Loss normalisation: the token (or sequence) count of the WHOLE optimizer step is summed over
this rank's micro-batches and all-reduced over the data-parallel group before the first
forward, then every micro-batch contributes ``sum(its token losses) / global_count``
(``megatron_dapo.algo.aggregate_loss``); DP gradients are summed. K micro-batches on D
ranks therefore give exactly the gradient of the single-batch loss.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from ..algo import aggregate_loss, kl_penalty, policy_loss
from ..algo.config import AlgorithmConfig
from .forward import forward_backward, token_logprobs, vocab_parallel_entropy
from .setup import Policy, optimizer_step

METRIC_KEYS = (
    "pg_loss",
    "entropy",
    "clip_frac_low",
    "clip_frac_high",
    "dual_clip_frac",
    "approx_kl",
    "ratio_mean",
    "kl",
)


def make_microbatches(
    samples: list, micro_batch_size: int, max_tokens: Optional[int] = None, pad_to_multiple: int = 1
) -> list:
    """Group consecutive samples into padded micro-batches.

    At most ``micro_batch_size`` samples each; with ``max_tokens``, also at most that many
    padded tokens (``rows x longest``). A sample longer than the budget goes alone.
    ``pad_to_multiple``: every micro-batch's sequence length is padded up to a multiple of it
    (the TP size with --sequence-parallel, which splits the sequence over TP ranks).
    Deterministic, so every PP stage of a DP rank builds the same micro-batches.
    """
    out, cur, longest = [], [], 0
    for s in samples:
        n = len(s["tokens"])
        new_longest = max(longest, n)
        if cur and (len(cur) >= micro_batch_size or (max_tokens and new_longest * (len(cur) + 1) > max_tokens)):
            out.append(cur)
            cur, new_longest = [], n
        cur.append(s)
        longest = new_longest
    if cur:
        out.append(cur)
    return [collate(mb, pad_to_multiple) for mb in out]


def collate(samples: list, pad_to_multiple: int = 1) -> dict:
    """Right-padded tensors; ``loss_mask[:, t]`` is 1 where token t is a trained response token.

    The sequence length is the longest sample rounded up to a multiple of ``pad_to_multiple``.
    """
    b, s = len(samples), max(len(x["tokens"]) for x in samples)
    s = -(-s // max(1, pad_to_multiple)) * max(1, pad_to_multiple)
    tokens = torch.zeros(b, s, dtype=torch.long)
    loss_mask = torch.zeros(b, s)
    resp_mask = torch.zeros(b, s)
    old = torch.zeros(b, s)
    ref = torch.zeros(b, s)
    adv = torch.zeros(b)
    has_ref = all(x.get("ref_logprobs") is not None for x in samples)
    for i, x in enumerate(samples):
        n, p = len(x["tokens"]), x["prompt_len"]
        tokens[i, :n] = torch.tensor(x["tokens"])
        resp_mask[i, p:n] = 1
        if x.get("train", True):
            loss_mask[i, p:n] = 1
        if x.get("old_logprobs") is not None:
            old[i, p:n] = torch.tensor(x["old_logprobs"], dtype=torch.float32)
        if has_ref:
            ref[i, p:n] = torch.tensor(x["ref_logprobs"], dtype=torch.float32)
        adv[i] = x.get("advantage", 0.0)
    # logits are only needed from the first response token on: prompts are not scored
    resp_start = max(1, min(x["prompt_len"] for x in samples))
    out = {"tokens": tokens, "loss_mask": loss_mask, "resp_mask": resp_mask, "old_logprobs": old, "advantages": adv,
           "resp_start": resp_start}
    if has_ref:
        out["ref_logprobs"] = ref
    return out


def sequence_pad_multiple(model) -> int:
    """The multiple every micro-batch's sequence length must have: the TP size when the model
    splits sequences over TP ranks (``config.sequence_parallel``, --sequence-parallel), else 1."""
    from ..checkpoint.model_io import unwrap

    cfg = unwrap(model).config
    return int(cfg.tensor_model_parallel_size) if getattr(cfg, "sequence_parallel", False) else 1


def dp_token_counts(values, group=None) -> torch.Tensor:
    """``values`` summed over the data-parallel ``group`` (float64), created on the device that
    group's backend reduces on (CUDA for NCCL, host for gloo)."""
    from megatron.core import parallel_state as ps

    from ..distributed import collective_device

    g = group if group is not None else ps.get_data_parallel_group()
    t = torch.tensor(list(values), dtype=torch.float64, device=collective_device(g))
    if dist.get_world_size(g) > 1:
        dist.all_reduce(t, group=g)
    return t


@torch.no_grad()
def compute_logprobs(
    policy_or_model, samples: list, true_vocab: int, micro_batch_size: int, max_tokens=None, temperature: float = 1.0
):
    """Per-sample logprobs of the response tokens under the current weights (forward only),
    from ``softmax(logits / temperature)`` (the rollout's sampling distribution).

    Returns a list (one list of floats per sample) on the last PP stage, None elsewhere.
    """
    from megatron.core import parallel_state as ps

    model = policy_or_model.model if isinstance(policy_or_model, Policy) else policy_or_model
    model.eval()
    mbs = make_microbatches(samples, micro_batch_size, max_tokens, sequence_pad_multiple(model))
    got = []

    def loss_fn(batch, logits):
        st = batch["resp_start"]
        lp = token_logprobs(logits[:, st - 1 :], batch["tokens"][:, st - 1 :], true_vocab, temperature)  # tokens st..end
        got.append(lp.detach().float().cpu())
        return torch.zeros((), dtype=torch.float32, device=logits.device), {}

    forward_backward(model, mbs, loss_fn, forward_only=True)
    model.train()
    if not ps.is_pipeline_last_stage():
        return None
    out, k = [], 0
    for mb, lp in zip(mbs, got):
        st = mb["resp_start"]
        for i in range(mb["tokens"].shape[0]):
            x = samples[k]
            n, p = len(x["tokens"]), x["prompt_len"]
            out.append(lp[i, p - st : n - st].tolist())
            k += 1
    return out


def dapo_loss_fn(
    algo: AlgorithmConfig, true_vocab: int, global_tokens, global_seqs, nan_loss: bool = False, temperature: float = 1.0
):
    """The per-micro-batch loss: decoupled-clip surrogate, aggregated over the whole step.

    Logprobs and entropy come from ``logits / temperature`` (the rollout temperature), like the
    old logprobs they are compared with."""

    def loss_fn(batch, logits):
        st = batch["resp_start"]  # score tokens st..end only (the prompts carry no loss)
        logits = logits[:, st - 1 :]
        lp = token_logprobs(logits, batch["tokens"][:, st - 1 :], true_vocab, temperature)  # [b, s-st]
        mask = batch["loss_mask"][:, st:]
        old = batch["old_logprobs"][:, st:]
        per_tok, m = policy_loss(
            lp, old, batch["advantages"], mask, algo.eps_clip_low, algo.eps_clip_high, algo.clip_ratio_c
        )
        loss = aggregate_loss(per_tok, mask, algo.loss_agg_mode, global_tokens, global_seqs)
        resp = batch["resp_mask"][:, st:]
        need_grad = algo.entropy_coef > 0
        with torch.set_grad_enabled(need_grad and torch.is_grad_enabled()):
            ent = vocab_parallel_entropy(logits[:, :-1] if need_grad else logits[:, :-1].detach(), true_vocab,
                                         temperature=temperature)
        if need_grad:
            loss = loss - algo.entropy_coef * aggregate_loss(ent, mask, algo.loss_agg_mode, global_tokens, global_seqs)
        kl_sum = torch.zeros((), device=lp.device)
        if algo.kl_coef > 0 and "ref_logprobs" in batch:
            kl_tok = kl_penalty(lp, batch["ref_logprobs"][:, st:], algo.kl_estimator)
            loss = loss + algo.kl_coef * aggregate_loss(kl_tok, mask, algo.loss_agg_mode, global_tokens, global_seqs)
            kl_sum = (kl_tok.detach() * mask).sum()
        if nan_loss:
            loss = loss * float("nan")
        n_mask = mask.sum()
        n_resp = resp.sum()
        stats = {
            # (sum, count) pairs: reduced over micro-batches and DP ranks by the caller
            "pg_loss": ((per_tok.detach() * mask).sum(), n_mask),
            "entropy": ((ent.detach() * resp).sum(), n_resp),
            "clip_frac_low": (m["clip_frac_low"].detach() * n_mask, n_mask),
            "clip_frac_high": (m["clip_frac_high"].detach() * n_mask, n_mask),
            "dual_clip_frac": (m["dual_clip_frac"].detach() * n_mask, n_mask),
            "approx_kl": (m["approx_kl"].detach() * n_mask, n_mask),
            "ratio_mean": (m["ratio_mean"].detach() * n_mask, n_mask),
            "kl": (kl_sum, n_mask),
            "ratio_max": (m["ratio_max"].detach(), None),
        }
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
) -> dict:
    """One optimizer step on this DP rank's shard of a mini-batch; returns reduced metrics."""
    from megatron.core import parallel_state as ps

    mbs = make_microbatches(samples, micro_batch_size, max_tokens, sequence_pad_multiple(policy.model))
    # the WHOLE optimizer step's token and sequence counts, over all micro-batches and DP ranks
    counts = dp_token_counts(
        [sum(float(mb["loss_mask"][:, 1:].sum()) for mb in mbs),
         sum(float((mb["loss_mask"][:, 1:].sum(1) > 0).sum()) for mb in mbs)]
    )
    g_tok, g_seq = float(counts[0]), float(counts[1])
    policy.model.zero_grad_buffer()
    policy.optimizer.zero_grad()
    loss_fn = dapo_loss_fn(algo, true_vocab, g_tok, g_seq, nan_loss, temperature)
    stats = forward_backward(policy.model, mbs, loss_fn, forward_only=False)
    ok, grad_norm = optimizer_step(policy.optimizer, policy.optimizer.config.clip_grad)
    if ok:
        policy.scheduler.step(increment=1)
    sums = {k: [0.0, 0.0] for k in METRIC_KEYS}
    rmax = 0.0
    if ps.is_pipeline_last_stage():
        for st in stats:
            for k in METRIC_KEYS:
                s, c = st[k]
                sums[k][0] += float(s)
                sums[k][1] += float(c)
            rmax = max(rmax, float(st["ratio_max"][0]))
    return {
        "sums": sums,
        "ratio_max": rmax,
        "grad_norm": grad_norm,
        "update_successful": ok,
        "global_tokens": g_tok,
        "lr": float(policy.optimizer.param_groups[0]["lr"]),
        "num_microbatches": len(mbs),
    }
