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
from ..algo.staleness import interpolation_alpha
from ..training.item import TrainItem
from ..training.packing import karmarkar_karp


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
    reward_error: Optional[str] = None  # the reward's own error when reason is "error"
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
    # --proximal-logprobs interpolate: each response token's A-3PO weight (TrainItem.prox_alpha)
    prox_alpha: Optional[list] = None
    # wall-clock times (time.time()): the sample's latest request was submitted / ended
    submitted_at: Optional[float] = None
    finished_at: Optional[float] = None
    # --routing-replay: the engine's routed experts, uint8/int16 [positions, layers, top_k] of
    # prompt + response (all but the last token; rollout/routing.py), across continuations
    routed_experts: Optional[torch.Tensor] = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    def to_item(self) -> TrainItem:
        """The part of a sample a trainer rank needs (sequences as tensors)."""

        def seq(x, dtype):
            return None if x is None else torch.as_tensor(x, dtype=dtype)

        return TrainItem(
            tokens=torch.as_tensor(list(self.prompt_ids) + list(self.response_ids), dtype=torch.long),
            prompt_len=len(self.prompt_ids),
            advantage=self.advantage,
            train=self.train,
            old_logprobs=seq(self.old_logprobs, torch.float32),
            ref_logprobs=seq(self.ref_logprobs, torch.float32),
            engine_logprobs=seq(self.engine_logprobs, torch.float32),
            stale_len=self.stale_len,
            routed_experts=self.routed_experts,
            prox_alpha=seq(self.prox_alpha, torch.float32),
        )


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
        pen = overlong_penalty(
            lengths, algo.max_response_length, algo.overlong_buffer_length, algo.overlong_penalty_factor
        )
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
        keep = overlong_filter_mask([s.finish_reason for s in samples]).reshape(-1).bool().tolist()
    else:
        keep = [True] * len(samples)
    for s, a, k in zip(samples, adv.tolist(), keep):
        s.advantage = float(a)
        s.train = bool(k)
    return samples


def optimizer_steps(cfg) -> int:
    """Optimizer steps per rollout step, as the config says: --rollout-batch-size x
    --n-samples-per-prompt / --global-batch-size (config validation checks the division)."""
    r = cfg.rollout
    return max(1, r.rollout_batch_size * r.n_samples_per_prompt // cfg.optim.global_batch_size)


def has_trainable_token(s: Sample, offpolicy: Optional[str] = None) -> bool:
    """Whether any response token of ``s`` can carry a gradient, by the rule of
    ``algo.tis.loss_token_weights`` (docs/algorithm.md, "One weight per token") as far as it is
    known before the trainer's forward pass. No token does when the response is empty, when
    overlong filtering took the sample out of the loss (``train`` False: every token's loss mask
    is 0), or when every token was generated under older weights (``stale_len`` >= the length)
    and ``offpolicy`` is "mask" (``--partial-rollout-offpolicy mask``: a stale token has weight 0
    and leaves the denominator). ``offpolicy``: None without ``--partial-rollout``; under
    "correct" a stale token keeps the weight min(rho, C) > 0. (Tokens that ``--tis-mode
    token-mask`` / ``sequence-mask`` reject are known only from the old logprobs: not here.)"""
    n = len(s.response_ids)
    if n == 0 or not s.train:
        return False
    return not (offpolicy == "mask" and int(s.stale_len) >= n)


def training_samples(samples: list, num_steps: int, dp_size: int, offpolicy: Optional[str] = None) -> tuple:
    """The trainer's list of one rollout step: ``samples`` (the kept groups, advantages
    assigned over whole groups) without those that have no trainable token
    (:func:`has_trainable_token`); returns ``(list, left_out)``, ``left_out`` the number of
    samples left out (the ``untrainable_samples`` metric). Such a sample still counted in its
    group's advantage statistics; in the loss it would add nothing to the numerator nor to the
    token or sequence counts, so leaving it out changes no gradient.

    Every optimizer step needs a sample on each of the ``dp_size`` ranks: when fewer than
    ``num_steps x dp_size`` trainable samples remain, the split of :func:`minibatches` is
    topped up to ``dp_size`` per step with untrainable ones (in their order), which weigh 0 in
    the loss exactly as before this rule (a step that degenerate, e.g. every response
    truncated under --overlong-filter, trains on nothing either way). The order is kept
    otherwise, and ``minibatches(list, num_steps)`` gives the intended mini-batches."""
    if num_steps < 1 or dp_size < 1:
        raise ValueError(f"training_samples: num_steps {num_steps} and dp_size {dp_size} must be >= 1")
    keep = [s for s in samples if has_trainable_token(s, offpolicy)]
    rest = [s for s in samples if not has_trainable_token(s, offpolicy)]
    if len(keep) >= num_steps * dp_size or len(samples) < num_steps * dp_size:
        return keep, len(rest)
    out = []
    for part in _split(keep, num_steps):
        out += part
        while len(part) < dp_size:
            part = part + [rest.pop(0)]
            out.append(part[-1])
    return out, len(rest)


def _split(items: list, k: int) -> list:
    """``k`` consecutive parts of ``items`` whose sizes differ by at most one (larger first)."""
    q, r = divmod(len(items), k)
    out, i = [], 0
    for j in range(k):
        n = q + (1 if j < r else 0)
        out.append(items[i : i + n])
        i += n
    return out


def minibatches(samples: list, num_steps: int, dp_size: int = 1) -> list:
    """``num_steps`` consecutive mini-batches of near-equal size (one optimizer step each; sizes
    differ by at most one response). ``num_steps`` is what the config says
    (--rollout-batch-size x --n-samples-per-prompt / --global-batch-size); a mini-batch may hold
    fewer responses than --global-batch-size (the samples without a trainable token are left out,
    :func:`training_samples`): the loss is normalised by each optimizer step's own token count,
    so that is exact. Every mini-batch needs at least one response per DP rank."""
    if num_steps < 1:
        raise ValueError(f"minibatches: {num_steps} optimizer steps per rollout step; must be >= 1")
    if len(samples) < num_steps * dp_size:
        raise ValueError(
            f"{len(samples)} training responses cannot fill {num_steps} optimizer steps (--rollout-batch-size x "
            f"--n-samples-per-prompt / --global-batch-size) with one response per data-parallel rank ({dp_size}): "
            "raise --rollout-batch-size or --n-samples-per-prompt, or lower the data-parallel size"
        )
    return _split(list(samples), num_steps)


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
    """Indices of ``items`` (``TrainItem``s) per DP rank, balancing tokens (Karmarkar-Karp);
    with fewer items than ranks, one each in order (the rest get none)."""
    if len(items) < dp_size:
        return [[d] if d < len(items) else [] for d in range(dp_size)]
    return karmarkar_karp([max(1, x.n_tokens) for x in items], dp_size)


def interpolate_stale(samples: list, step: int) -> list:
    """``--proximal-logprobs interpolate``: the samples of ``step`` generated under older weights
    get no proximal forward; their ``old_logprobs`` are the engine's (the behaviour policy) and
    ``prox_alpha`` each token's A-3PO weight ``lag / (lag + 1)``
    (``algo.staleness.interpolation_alpha``), from which the loss interpolates the proximal
    policy. Returns the samples that still need megatron's forward: those with a token of the
    current weights, and any without a version or an engine logprob for every token."""
    need = []
    for s in samples:
        v, eng = s.token_versions, s.engine_logprobs
        n = len(s.response_ids)
        if not v or len(v) != n or eng is None or len(eng) != n or max(v) >= step:
            need.append(s)
            continue
        s.old_logprobs = [float(x) for x in eng]
        s.prox_alpha = interpolation_alpha(torch.tensor(v), step).tolist()
    return need
