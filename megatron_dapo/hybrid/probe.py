"""The weight-sync check (every N-th sync, ``--check-weight-sync-every``) and the train/inference
logprob mismatch metric.

The check has two halves that separate errors from numerical noise:

1. **Checksums, exact.** On a probe sync every feeder records an exact checksum of each HF
   tensor it hands over (``weight_sync.CHECKSUM_TAP``, ``rollout.checksum``); each engine then
   reports the checksum of what it holds under each HF name (``RolloutEngine.weight_checksums``),
   and :func:`compare_checksums` raises :class:`WeightSyncError` naming every tensor that is
   missing in the engine, extra in it, or different (a swapped, stale or wrongly assembled
   tensor). Noise cannot fail it: equal bytes give equal checksums.
2. **Logprobs on a short probe, robust.** The probe sequence is cut to its first
   :data:`PROBE_TOKENS` tokens; engine and megatron score it and :func:`probe_stats` gives the
   mean, the 90th percentile and the max of |logp_engine - logp_megatron|. The check fails when
   the mean exceeds the tolerance or the p90 exceeds :data:`P90_FACTOR` x the tolerance; the max
   is reported (metric ``weight_sync_probe_diff``) but fails nothing alone: in bf16 a few
   low-probability tokens routinely differ by 0.5 .. 1 between two correct implementations
   (different kernels, TP sizes and reduction orders), while a wrong conversion (a swapped q/k
   block, a TP shard in the wrong order) moves most tokens by O(0.1 .. 10). This half catches
   what the checksums cannot: a conversion that is wrong the same way on both sides of the
   comparison (mapping bugs).

Default tolerances (mean; :func:`default_threshold`): fp32 1e-4 (HF fp32 vs megatron fp32 on
CPU agree to ~2e-6 max on the tests' tiny Qwen2, tests/hybrid/test_probe_check.py), fp16 0.03,
bf16 0.1 (p90 3x these). The bf16 values are not measured here: they follow the published
observation that bf16 inference engines and trainers disagree per token (Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training"; Thinking Machines 2025,
"Defeating Nondeterminism in LLM Inference"), with typical differences well below 0.1 and rare
tokens far above. A wrong tensor need not move logprobs much (layer 0's and layer 1's q_proj
exchanged moved the tiny model's max by 1.2e-3): the checksums are the check for transport.

``logprob_mismatch`` is the per-step metric ``train_infer_logprob_diff``: the trainer's
recomputed logprobs of real rollouts against the engine's sampling logprobs.
"""

from __future__ import annotations

import logging
import math
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from ..rollout.checksum import describe
from .weight_sync import WeightSyncError

log = logging.getLogger(__name__)

#: mean |logp_engine - logp_megatron| tolerated on the probe, by parameter dtype
DEFAULT_THRESHOLDS = {torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 0.03}
#: the 90th percentile of |diff| may reach this multiple of the mean tolerance
P90_FACTOR = 3.0
#: the probe is cut to its first tokens (the whole of a 20k-token response is not needed, and
#: long sequences score slowly)
PROBE_TOKENS = 256


def default_threshold(dtype: torch.dtype) -> float:
    """The mean-|diff| tolerance for parameters of ``dtype`` (fp32 1e-4, fp16 0.03, bf16 0.1)."""
    return DEFAULT_THRESHOLDS.get(dtype, DEFAULT_THRESHOLDS[torch.bfloat16])


def model_threshold(model) -> float:
    """The default threshold of a model: that of its least precise parameter dtype."""
    return max(default_threshold(d) for d in {p.dtype for p in model.parameters()})


def cut_probe(sequences, max_tokens: int = PROBE_TOKENS):
    """The probe as it is scored: each sequence cut to its first ``max_tokens`` tokens."""
    return None if sequences is None else [list(s)[:max_tokens] for s in sequences]


def probe_stats(reference: list, per_engine: list) -> dict:
    """``{"max_abs", "mean_abs", "p90_abs"}`` of |logp_engine - logp_megatron| over engines,
    sequences and tokens (NaN counts as inf). ``reference``: megatron's logprobs per sequence;
    ``per_engine``: each engine's. Raises :class:`WeightSyncError` on a shape mismatch."""
    diffs = []
    for scored in per_engine:
        if len(scored) != len(reference):
            raise WeightSyncError(f"probe: engine scored {len(scored)} sequences, megatron {len(reference)}")
        for got, ref in zip(scored, reference):
            if len(got) != len(ref):
                raise WeightSyncError(f"probe: engine returned {len(got)} logprobs for a sequence, megatron {len(ref)}")
            diffs.extend(abs(float(x) - float(y)) for x, y in zip(got, ref))
    if not diffs:
        return {"max_abs": 0.0, "mean_abs": 0.0, "p90_abs": 0.0}
    d = torch.tensor(diffs, dtype=torch.float64)
    d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()), "p90_abs": float(torch.quantile(d, 0.9))}


def check_probe_stats(stats: dict, tolerance: float, where: str = "") -> None:
    """Raise :class:`WeightSyncError` when the mean exceeds ``tolerance`` or the p90 exceeds
    ``P90_FACTOR * tolerance``; the message names the statistic, its value and its limit."""
    limits = (("mean", stats["mean_abs"], tolerance), ("p90", stats["p90_abs"], P90_FACTOR * tolerance))
    bad = [(n, v, lim) for n, v, lim in limits if not v <= lim]
    if bad:
        what = "; ".join(f"{n} |logp_engine - logp_megatron| = {v:.4g} > {lim:.4g}" for n, v, lim in bad)
        raise WeightSyncError(
            f"weight sync probe failed{where}: {what} (tolerance {tolerance:.4g}: --weight-sync-tolerance, "
            f"p90 limit {P90_FACTOR:g}x it; max {stats['max_abs']:.4g}, not a criterion): the engine's "
            "weights do not compute the trainer's logprobs (wrong conversion or layout?)"
        )


def _dtype_name(c) -> Optional[str]:
    return c[0] if c is not None else None


def reference_checksums(per_rank: Sequence[Optional[dict]]) -> dict:
    """The trainer's checksums of one probe sync from the records of its ranks (feeders of a
    replica that took part; others recorded nothing). Every feeder hands over the same HF
    tensors, so records must agree: a tensor two feeders disagree on is named."""
    ref: dict = {}
    for rank, rec in enumerate(per_rank):
        for name, c in (rec or {}).items():
            if name in ref and ref[name][1] != c:
                raise WeightSyncError(
                    f"weight sync check: the feeders handed over different bytes for {name} "
                    f"(rank {ref[name][0]} and rank {rank}): a feeder's bucket buffer is wrong"
                )
            ref.setdefault(name, (rank, c))
    return {n: c for n, (_, c) in ref.items()}


def compare_checksums(reference: dict, per_engine: Sequence[Optional[dict]], *, limit: int = 20) -> dict:
    """Compare each engine's checksums (HF name -> checksum or None, None for an engine that
    cannot report them) with the trainer's ``reference``; raises :class:`WeightSyncError`
    naming the tensors missing in an engine, extra in it, or different. Returns
    ``{"compared", "skipped"}`` (tensors compared per engine, engines or tensors not
    comparable). An engine's tied ``lm_head.weight`` is not a tensor of its own: an extra one
    is ignored when the trainer sent none."""
    problems = []
    compared, skipped = 0, 0
    for e, got in enumerate(per_engine):
        if got is None:
            skipped += 1
            continue
        missing = sorted(set(reference) - set(got))
        extra = sorted(n for n in set(got) - set(reference) if n != "lm_head.weight")
        differ = []
        for name in sorted(set(reference) & set(got)):
            if got[name] is None:
                skipped += 1
                continue
            compared += 1
            if got[name] != reference[name]:
                differ.append(name)
        parts = []
        for label, names in (("missing in the engine", missing), ("extra in the engine", extra),
                             ("different from what the trainer sent", differ)):
            if names:
                shown = ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
                parts.append(f"{len(names)} {label}: {shown}")
        if differ:
            n = differ[0]
            parts.append(f"e.g. {n}: sent {describe(reference[n])}, engine holds {describe(got[n])}")
        if parts:
            problems.append(f"engine {e}: " + "; ".join(parts))
    if problems:
        raise WeightSyncError("weight sync check failed (exact checksums per HF tensor): " + " | ".join(problems))
    return {"compared": compared, "skipped": skipped}


def default_probe_tokens(vocab_size: int, length: int = 32, batch: int = 2, seed: int = 1234) -> torch.Tensor:
    """A fixed pseudo-random probe [batch, length] of token ids (same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=g)


def should_check(sync_index: int, every: int) -> bool:
    """``--check-weight-sync-every N``: probe syncs 0, N, 2N, ... (N <= 0: never)."""
    return every > 0 and sync_index % every == 0


def add_weight_sync_args(parser) -> None:
    """Register the weight-sync options on an argparse parser (consumed by the trainer)."""
    g = parser.add_argument_group("weight sync")
    g.add_argument("--check-weight-sync-every", type=int, default=1,
                   help="probe the engine after every N-th weight sync (0: never)")
    g.add_argument("--weight-sync-probe-threshold", type=float, default=None,
                   help="mean |logp_engine - logp_megatron| tolerated on the probe's first 256 tokens; the p90 "
                        "may reach 3x it (default by dtype: fp32 1e-4, fp16 0.03, bf16 0.1)")
    g.add_argument("--weight-sync-bucket-mb", type=int, default=512, help="weight sync bucket size in MiB")


@torch.no_grad()
def megatron_probe_logprobs(model, arch, probe_tokens: torch.Tensor, pp_group=None) -> torch.Tensor:
    """logp(tokens[:, t+1] | prefix) [b, s-1] from megatron, fp32, on every rank (collective)."""
    from megatron.core import parallel_state as ps

    from ..training.forward import forward_backward, token_logprobs

    pp_group = pp_group if pp_group is not None else ps.get_pipeline_model_parallel_group()
    device = next(model.parameters()).device
    tokens = (probe_tokens.unsqueeze(0) if probe_tokens.dim() == 1 else probe_tokens).to(device)
    got = []

    def loss_fn(batch, logits):
        got.append(token_logprobs(logits, batch["tokens"], arch.vocab_size).float().contiguous())
        return logits.sum() * 0, {}

    was_training = model.training
    model.eval()
    try:
        forward_backward(model, [{"tokens": tokens}], loss_fn, forward_only=True)
    finally:
        model.train(was_training)
    lp = got[0] if got else torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=device)
    if dist.get_world_size(pp_group) > 1:  # only the last stage has them: share over PP
        dist.all_reduce(lp, group=pp_group)
    return lp


def check_weight_sync(
    policy_model,
    arch,
    engine,
    probe_tokens: Optional[torch.Tensor] = None,
    threshold: Optional[float] = None,
    *,
    pp_group=None,
    group=None,
) -> float:
    """Probe the engine after a sync: returns max |logp_engine - logp_megatron| (same on
    every rank of ``group``, default the world), raises ``WeightSyncError`` when the mean
    |diff| exceeds ``threshold`` or its p90 ``P90_FACTOR * threshold`` (:func:`check_probe_stats`).

    Collective over all ranks. Needs the trainer's weights resident *and* the engine awake
    (weights and KV cache); the hybrid step, which offloads the trainer before resuming the
    KV cache, uses the two halves :func:`megatron_probe_logprobs` (before the offload) and
    :func:`compare_with_engine` (after the KV cache is back) instead. ``engine``: the engine
    on feeder ranks (or a list), None elsewhere; the worst difference over all feeders is
    reported. ``probe_tokens``: [b, s] (default :func:`default_probe_tokens`).
    ``threshold`` default: :func:`model_threshold`.
    """
    if probe_tokens is None:
        probe_tokens = default_probe_tokens(arch.vocab_size)
    if threshold is None:
        threshold = model_threshold(policy_model)
    ref = megatron_probe_logprobs(policy_model, arch, probe_tokens, pp_group=pp_group)
    return compare_with_engine(ref, engine, probe_tokens, threshold, group=group)


def compare_with_engine(ref_logprobs: torch.Tensor, engine, probe_tokens: torch.Tensor, threshold: float, *, group=None) -> float:
    """Second half of the probe: score ``probe_tokens`` with the engine(s) on feeder ranks and
    compare with megatron's ``ref_logprobs`` [b, s-1] (:func:`probe_stats`,
    :func:`check_probe_stats`: mean and p90 against ``threshold``); collective over ``group``
    (default world). Returns the max |diff| (reported, not a criterion)."""
    if probe_tokens.dim() == 1:
        probe_tokens = probe_tokens.unsqueeze(0)
    engines = [] if engine is None else (list(engine) if isinstance(engine, (list, tuple)) else [engine])
    seqs = probe_tokens.tolist()
    ref = ref_logprobs.detach().float().cpu().tolist()
    stats = probe_stats(ref, [e.score(seqs, [1] * len(seqs)) for e in engines])
    # Every rank must decide alike (a rank raising alone would leave the others waiting in
    # the next collective): the statistics and the threshold are all-reduced (max).
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        from ..distributed import collective_device

        w = torch.tensor([stats["max_abs"], stats["mean_abs"], stats["p90_abs"], float(threshold)],
                         dtype=torch.float64, device=collective_device(group))  # not ref's: a caller's may be host
        dist.all_reduce(w, op=dist.ReduceOp.MAX, group=group)
        stats = {"max_abs": float(w[0]), "mean_abs": float(w[1]), "p90_abs": float(w[2])}
        threshold = float(w[3])
    log.info("weight sync probe: |logp_engine - logp_megatron| mean %.3g p90 %.3g max %.3g (tolerance %.3g)",
             stats["mean_abs"], stats["p90_abs"], stats["max_abs"], threshold)
    check_probe_stats(stats, threshold, where=f" on a probe of {tuple(probe_tokens.shape)} tokens")
    return stats["max_abs"]


def logprob_mismatch(
    train_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> dict:
    """``{"mean_abs", "max_abs"}`` of |train - engine| over the tokens where ``mask`` is set.

    Pure (no communication); logged every step as ``train_infer_logprob_diff``. An empty
    mask gives zeros.
    """
    if train_logprobs.shape != engine_logprobs.shape:
        raise ValueError(f"shape mismatch: train {tuple(train_logprobs.shape)} vs engine {tuple(engine_logprobs.shape)}")
    diff = (train_logprobs.detach().double() - engine_logprobs.detach().to(train_logprobs.device).double()).abs()
    if mask is None:
        m = torch.ones_like(diff, dtype=torch.bool)
    else:
        if mask.shape != diff.shape:
            raise ValueError(f"mask shape {tuple(mask.shape)} != logprobs shape {tuple(diff.shape)}")
        m = mask.to(diff.device).bool()
    n = int(m.sum())
    if n == 0:
        return {"mean_abs": 0.0, "max_abs": 0.0}
    sel = diff[m]
    return {"mean_abs": float(sel.sum() / n), "max_abs": float(sel.max())}

