"""From verified groups to training samples: rewards, advantages, masks, mini-batches, DP shards.

Pure data plumbing around the algorithm functions of :mod:`megatron_dapo.algo`; no
process groups and no engines.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ..algo import compute_advantages, overlong_filter_mask, overlong_penalty
from ..algo.config import AlgorithmConfig


@dataclasses.dataclass
class Sample:
    """One response of a group, with everything the trainer and the logs need."""

    prompt_index: int
    prompt_ids: list
    response_ids: list
    engine_logprobs: list
    finish_reason: str
    ground_truth: str
    response_text: str = ""
    score: float = 0.0  # verifier score (+1 / -1)
    acc: bool = False
    pred: str = ""
    reason: str = ""
    overlong_penalty: float = 0.0
    reward: float = 0.0  # score + overlong penalty: what the advantage sees
    advantage: float = 0.0
    train: bool = True  # False: loss mask 0 (overlong filtering)
    old_logprobs: Optional[list] = None  # pi_old of the response tokens (megatron)
    ref_logprobs: Optional[list] = None
    step_generated: int = 0
    seed: Optional[int] = None
    # --partial-rollout: the weight version (rollout step) under which each response token was
    # generated (None: all under step_generated), and how many leading tokens are older than
    # the weights the old logprobs come from (masked or corrected, --partial-rollout-offpolicy)
    token_versions: Optional[list] = None
    stale_len: int = 0
    # wall-clock times (time.time()): the sample's latest request was submitted / ended
    submitted_at: Optional[float] = None
    finished_at: Optional[float] = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_worker(self) -> dict:
        """The part of a sample a trainer rank needs."""
        return {
            "tokens": list(self.prompt_ids) + list(self.response_ids),
            "prompt_len": len(self.prompt_ids),
            "advantage": float(self.advantage),
            "train": bool(self.train),
            "old_logprobs": self.old_logprobs,
            "ref_logprobs": self.ref_logprobs,
            "engine_logprobs": list(self.engine_logprobs),
            "stale_len": int(self.stale_len),
        }


@dataclasses.dataclass
class Group:
    prompt_index: int
    samples: list  # of Sample, all for one prompt
    scored_at: Optional[float] = None  # wall-clock time the group was verified

    @property
    def accs(self) -> list:
        return [s.acc for s in self.samples]


def shape_rewards(samples: list, algo: AlgorithmConfig) -> None:
    """reward = verifier score + soft overlong punishment (Eq. 13) when enabled; in place."""
    if not samples:
        return
    lengths = torch.tensor([len(s.response_ids) for s in samples])
    if algo.overlong_penalty:
        pen = overlong_penalty(lengths, algo.max_response_length, algo.overlong_buffer_length, algo.overlong_penalty_factor)
    else:
        pen = torch.zeros(len(samples))
    for s, p in zip(samples, pen.tolist()):
        s.overlong_penalty = float(p)
        s.reward = float(s.score) + float(p)


def assign_advantages(groups: list, algo: AlgorithmConfig) -> list:
    """Advantages of the shaped rewards by ``--advantage-estimator`` (the registry
    ``algo.ADVANTAGE_ESTIMATORS``); overlong filtering sets ``train``.

    Returns the flat list of samples, group after group (contiguous groups of size G).
    """
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return samples
    G = len(groups[0].samples)
    if any(len(g.samples) != G for g in groups):
        raise ValueError("assign_advantages: groups of unequal size")
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float64)
    adv = compute_advantages(algo.advantage_estimator, rewards, G, eps=algo.adv_eps)
    if algo.overlong_filter:
        keep = overlong_filter_mask([s.finish_reason for s in samples])
        keep = keep.reshape(-1).bool().tolist()
    else:
        keep = [True] * len(samples)
    for s, a, k in zip(samples, adv.tolist(), keep):
        s.advantage = float(a)
        s.train = bool(k)
    return samples


def minibatches(samples: list, global_batch_size: int) -> list:
    """Consecutive mini-batches of ``global_batch_size`` responses (one optimizer step each)."""
    if len(samples) % global_batch_size:
        raise ValueError(
            f"{len(samples)} training responses not divisible by --global-batch-size {global_batch_size}"
        )
    return [samples[i : i + global_batch_size] for i in range(0, len(samples), global_batch_size)]


def dp_shards(minibatch: list, dp_size: int) -> list:
    """Split a mini-batch over DP ranks balancing tokens, not counts.

    Karmarkar-Karp (``training.packing.karmarkar_karp``) on the samples' token counts: the
    slowest rank sets the step, so the ranks' token sums are what is balanced (the trainer
    reports the result as ``dp_token_imbalance``); counts may differ (the loss is normalised
    by the step's global token count, so that is exact). Every rank gets at least one sample;
    deterministic; each shard keeps the mini-batch's order."""
    if len(minibatch) < dp_size:
        raise ValueError(f"mini-batch of {len(minibatch)} smaller than DP size {dp_size}")
    return [[minibatch[i] for i in p] for p in dp_partition(minibatch, dp_size)]


def dp_partition(items: list, dp_size: int) -> list:
    """Indices of ``items`` (worker dicts with ``tokens``) per DP rank, balancing tokens
    (Karmarkar-Karp); with fewer items than ranks, one each in order (the rest get none)."""
    from ..training.packing import karmarkar_karp

    if len(items) < dp_size:
        return [[d] if d < len(items) else [] for d in range(dp_size)]
    return karmarkar_karp([max(1, len(x["tokens"])) for x in items], dp_size)
