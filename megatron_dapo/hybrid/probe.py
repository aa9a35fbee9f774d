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

The per-step metric of the train/inference mismatch on real rollouts (``train_infer_logprob_diff``)
is computed by the driver (``driver/metrics.py``), not here.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from ..rollout.checksum import describe
from .weight_sync import WeightSyncError

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
        for label, names in (
            ("missing in the engine", missing),
            ("extra in the engine", extra),
            ("different from what the trainer sent", differ),
        ):
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


def should_check(sync_index: int, every: int) -> bool:
    """``--check-weight-sync-every N``: probe syncs 0, N, 2N, ... (N <= 0: never)."""
    return every > 0 and sync_index % every == 0
