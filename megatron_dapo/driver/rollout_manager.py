"""Rollout manager: streaming generation, verification as groups arrive, dynamic-sampling filter.

One call of :meth:`RolloutManager.collect` fills a buffer with ``rollout_batch_size`` (N)
groups of ``n_samples_per_prompt`` (G) responses whose raw correctness is mixed
(``0 < sum(acc) < G``, paper Eq. 11). Every engine is driven through the same streaming
interface (``EnginePool``: submit requests, receive each as it ends, abort the rest;
docs/rollout.md, "Streaming"):

* each prompt's G samples are G requests; a group is verified (reward process pool, which
  sees each sample's whole record) and filtered (``acc``, or the sample field that
  ``--dynamic-sampling-metric`` names: kept when it varies within the group) as soon as its
  last sample ends, not when the longest response of some batch ends;
* over-sampling is a request budget: at most ``--over-sampling-batch-size`` (W, default N)
  groups are in flight at once; each admitted group frees its place, which a new prompt takes
  while the groups in flight are fewer than the groups still needed divided by the step's keep
  rate so far (so prompts that would only be aborted are not started); a step starts at most
  ``--max-num-gen-batches`` x W prompts, then fails with what to change (RolloutStallError);
* once the batch is full the requests still running are aborted: with ``--partial-rollout``
  their groups are carried to the next step with their prefixes (tokens, engine logprobs, the
  weight version of each token), otherwise they are thrown away and counted
  (``aborted_samples``, the ``rollout_aborted_samples`` metric); with
  ``--reuse-surplus-groups`` the groups that had ended are verified and their mixed ones kept
  for the next step;
* ``--deterministic``: groups are admitted in the order they were submitted (a group that ends
  early waits for the ones before it), every refill decision follows from that order, and
  nothing is aborted (the groups in flight when the batch is full run to their end, then are
  carried whole, verified as surplus or thrown away), so no timing decides what is kept;
* an engine that dies or does not answer within ``--engine-timeout-s`` is restarted and
  re-synced (``EnginePool``), and its requests start again;
* ``--partial-rollout``: the next step first continues the carried prefixes under the new
  weights (prompt + prefix as the engine's prompt, the remaining length budget), as the first
  groups in flight. A group is verified only when all its samples ended; a prefix older than
  ``--partial-rollout-max-staleness`` steps is dropped and its sample regenerated. The tokens
  generated under older weights (``Sample.stale_len``) are masked or corrected in the loss
  (``--partial-rollout-offpolicy``); under ``mask`` a group whose every sample is entirely
  older is not kept (it would carry no gradient; ``untrainable_samples``).

The work carried between steps lives in one place, :class:`CarryOver` (part of
:meth:`RolloutManager.state_dict`). Each sample records when it was submitted and when it
ended, each group when it was scored (the rollout dump shows them).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import time
from typing import Optional

import torch
from tqdm.auto import tqdm

from ..algo import DYNAMIC_SAMPLING_METRICS, dynamic_sampling_mask
from ..errors import RewardConfigError, RunStoppedError
from ..reward.api import RewardInput
from ..rollout.base import Request, SamplingParams, derive_seed
from ..rollout.routing import extend_routing
from .batch import Group, Sample, has_trainable_token, shape_rewards
from .engine_pool import EnginePool, LocalTransport, RayTransport  # noqa: F401  (re-exported)

#: How long the manager waits for the pool before looking again (engine timeouts are the pool's).
WAIT_S = 5.0


class RolloutStallError(RunStoppedError):
    """Dynamic sampling found too few mixed-correctness groups within the step's budget."""


@dataclasses.dataclass
class RolloutResult:
    groups: list  # kept groups for this step (exactly rollout_batch_size of them)
    generated: list  # every verified group of this step (for metrics and dumps)
    num_gen_batches: int  # ceil(prompts started / --over-sampling-batch-size)
    num_kept: int
    num_all_correct: int
    num_all_wrong: int
    reused: int = 0
    time_generate: float = 0.0
    time_verify: float = 0.0
    partial_resumed: int = 0  # --partial-rollout: samples continued from a kept prefix this step
    partial_dropped: int = 0  # prefixes dropped by --partial-rollout-max-staleness
    partial_pending: int = 0  # groups carried to the next step
    discarded_samples: int = 0  # samples generated (whole or in part) and thrown away
    aborted_samples: int = 0  # samples stopped unfinished when the batch was full
    submitted_prompts: int = 0  # new prompts started this step
    untrainable_samples: int = 0  # samples of mixed groups not kept: every token older (offpolicy mask)
    # the surplus groups' samples carried to a later step (--reuse-surplus-groups) whose old-policy
    # logprobs are still to be computed, under this step's weights (the ones that generated them)
    carried_need_logprobs: list = dataclasses.field(default_factory=list)


class CarryOver:
    """The work carried from one step to the next: ``surplus``, verified mixed groups beyond a
    full batch (--reuse-surplus-groups); ``pending``, groups with aborted samples or not
    verified yet (--partial-rollout)."""

    def __init__(self):
        self.surplus: list = []
        self.pending: list = []

    def take_surplus(self) -> list:
        out, self.surplus = self.surplus, []
        return out

    def drop_stale(self, step: int, max_staleness: int) -> int:
        """Reset the samples whose prefix has a token older than ``max_staleness`` steps (they
        are regenerated from the prompt); returns how many."""
        n = 0
        for g in self.pending:
            for s in g.samples:
                if s.token_versions and min(s.token_versions) < step - max_staleness:
                    s.response_ids, s.engine_logprobs, s.token_versions, s.finish_reason = [], [], [], "abort"
                    s.routed_experts = None
                    n += 1
        return n

    def pop_complete(self) -> list:
        """The pending groups whose samples have all ended, removed from ``pending``."""
        done = [g for g in self.pending if _complete(g)]
        self.pending = [g for g in self.pending if not _complete(g)]
        return done

    def take_pending(self) -> list:
        out, self.pending = self.pending, []
        return out

    def state_dict(self) -> dict:
        def groups(gs):
            return [[dataclasses.asdict(s) for s in g.samples] for g in gs]

        return {"surplus": groups(self.surplus), "pending": groups(self.pending)}

    def load_state_dict(self, s: dict) -> None:
        def groups(gs):
            return [Group(g[0]["prompt_index"], [Sample(**x) for x in g]) for g in gs]

        self.surplus = groups(s.get("surplus", []))
        self.pending = groups(s.get("pending", []))


def _complete(g: Group) -> bool:
    return all(s.finish_reason != "abort" for s in g.samples)


@dataclasses.dataclass
class _Flight:
    """A group in flight: submitted, not admitted yet."""

    group: Group
    order: int  # submission order within the step
    todo: int  # its requests not ended yet


class _Run:
    """One step's collection state."""

    def __init__(self, step: int, bars, version: Optional[int] = None):
        self.step, self.bars = step, bars
        # the weight version the engines hold (stamped on the tokens): step's own in synchronous
        # training; --async-mode one-step-off generates step n+1 with the weights before step n
        self.version = step if version is None else version
        self.buffer: list = []  # kept groups (the batch, then the surplus)
        self.generated: list = []  # verified groups
        self.flights: dict = {}  # group id -> _Flight
        self.by_rid: dict = {}  # rid -> (group id, sample)
        self.arrived: list = []  # group ids whose requests all ended, in arrival order
        self.outbox: list = []  # requests decided, not submitted yet
        self.orders = itertools.count()
        self.kept = self.admitted = self.all_correct = self.all_wrong = 0
        self.new_prompts = self.reused = self.resumed = self.dropped = 0
        self.aborted = self.discarded = self.untrainable = 0
        self.t_verify = 0.0
        self.scored = self.reward_errors = 0  # samples scored this step, and those the reward failed on
        self.first_reward_error: Optional[str] = None


class RolloutManager:
    def __init__(self, cfg, dataset, sampler, engines: EnginePool, scorer, tokenizer):
        self.cfg, self.dataset, self.sampler, self.engines = cfg, dataset, sampler, engines
        self.scorer, self.tokenizer = scorer, tokenizer
        self.carry = CarryOver()
        # prompts drawn again before new ones: those of rollouts the async admission rule threw away
        self.replayed: collections.deque = collections.deque()
        self._gids = itertools.count()  # group ids, unique in this process (request ids derive from them)

    @property
    def surplus(self) -> list:
        return self.carry.surplus

    @property
    def pending(self) -> list:
        return self.carry.pending

    def sampling_params(self, seed: Optional[int]) -> SamplingParams:
        r, a = self.cfg.rollout, self.cfg.algo
        return SamplingParams(
            temperature=r.temperature,
            top_p=r.top_p,
            top_k=r.top_k,
            max_new_tokens=a.max_response_length,
            n=1,
            stop=list(r.stop),
            seed=seed,
            return_routed_experts=self.cfg.moe.routing_replay,
        )

    def _seed(self, step: int, order: int, j: int) -> Optional[int]:
        """--deterministic: the seed of sample j of the group submitted ``order``-th at ``step``."""
        if not self.cfg.run.deterministic:
            return None
        return derive_seed((self.cfg.optim.seed * 1_000_003 + step * 10_007 + order * 101) % (2**62), j)

    @property
    def _window(self) -> int:
        return self.cfg.rollout.over_sampling_batch_size or self.cfg.rollout.rollout_batch_size

    # ------------------------------------------------------------------- a step ----
    def collect(self, step: int, version: Optional[int] = None) -> RolloutResult:
        """Step ``step``'s batch: ``rollout_batch_size`` mixed-correctness groups. ``version``:
        the engines' weight version in the step numbering of ``token_versions`` (default
        ``step``: the weights after step - 1; one-step-off: ``step - 1``, one version older)."""
        N = self.cfg.rollout.rollout_batch_size
        run = _Run(step, _bars(self.cfg.logging.progress, step, N), version)
        # --debug-kill-engine-step: an engine dies while generating this step's rollout (ahead of
        # the trainer under --async-mode)
        self.engines.kill_next_generation = self.cfg.run.kill_engine_at_step == step
        t0 = self.engines.clock()
        try:
            self._start(run)
            while len(run.buffer) < N:
                if not run.flights:
                    self._refill(run)
                    self._flush(run)
                    if not run.flights:
                        self._check_reward_failed(run)  # every sample failed in the reward: say so, not "stalled"
                        raise self._stall(run)
                for f in self.engines.wait(WAIT_S):
                    self._on_finished(run, f)
                self._admit_ready(run)
            self._stop(run)
            self._check_reward_failed(run)
        except Exception:  # (not on SIGTERM / Ctrl-C: the driver's cleanup kills the engines at once)
            self._abort_quietly()
            raise
        finally:
            run.bars.close()
        kept, surplus = run.buffer[:N], run.buffer[N:]
        if self.cfg.rollout.reuse_surplus_groups:
            self.carry.surplus = surplus + self.carry.surplus
        return RolloutResult(
            kept,
            run.generated,
            math.ceil(run.new_prompts / self._window),
            run.kept,
            run.all_correct,
            run.all_wrong,
            run.reused,
            self.engines.clock() - t0 - run.t_verify,
            run.t_verify,
            run.resumed,
            run.dropped,
            len(self.carry.pending),
            run.discarded,
            run.aborted,
            run.new_prompts,
            run.untrainable,
            [x for g in self.carry.surplus for x in g.samples if x.old_logprobs is None],
        )

    def _start(self, run: _Run) -> None:
        """The carried work first: surplus groups, then the complete pending groups, then the
        continuations of the others; then new prompts up to the window."""
        r = self.cfg.rollout
        run.buffer += self.carry.take_surplus()
        run.reused = len(run.buffer)
        if r.partial_rollout and self.carry.pending:
            run.dropped = self.carry.drop_stale(run.step, r.partial_rollout_max_staleness)
            for g in self.carry.pop_complete():
                self._admit(run, g)
            if len(run.buffer) < r.rollout_batch_size:
                for g in self.carry.take_pending():
                    self._submit_group(run, g, carried=True)
        self._refill(run)
        self._flush(run)

    def _refill(self, run: _Run) -> None:
        """New prompts while the groups in flight are fewer than the target (module doc)."""
        N, W = self.cfg.rollout.rollout_batch_size, self._window
        budget = self.cfg.rollout.max_num_gen_batches * W
        need = N - len(run.buffer)
        if need <= 0:
            return
        target = W if run.kept == 0 else min(W, math.ceil(need * run.admitted / run.kept))
        while len(run.flights) < target and run.new_prompts < budget:
            if run.new_prompts and run.new_prompts % W == 0:
                self._announce_round(run, run.new_prompts // W + 1)
            pi = self.replayed.popleft() if self.replayed else self.sampler.next_indices(1)[0]
            rec = self.dataset[pi]
            samples = [
                Sample(
                    prompt_index=pi,
                    prompt_ids=list(rec.prompt_ids),
                    response_ids=[],
                    engine_logprobs=[],
                    finish_reason="abort",
                    ground_truth=rec.ground_truth,
                    step_generated=run.step,
                    token_versions=[] if self.cfg.rollout.partial_rollout else None,
                )
                for _ in range(self.cfg.rollout.n_samples_per_prompt)
            ]
            run.new_prompts += 1
            self._submit_group(run, Group(pi, samples))

    def _announce_round(self, run: _Run, rnd: int) -> None:
        """One line per started multiple of the window: a step searching for mixed groups is never silent."""
        print(
            f"[rollout] step {run.step}: round {rnd} of at most {self.cfg.rollout.max_num_gen_batches}, "
            f"{min(len(run.buffer), self.cfg.rollout.rollout_batch_size)}/{self.cfg.rollout.rollout_batch_size} "
            f"mixed-correctness groups so far ({run.all_correct} all-correct, {run.all_wrong} all-wrong)",
            flush=True,
        )

    def _submit_group(self, run: _Run, g: Group, carried: bool = False) -> None:
        """Requests for the unfinished samples of ``g`` (all of a new group's; a ``carried``
        group's samples continue their prefixes with the rest of the length budget)."""
        gid, order = next(self._gids), next(run.orders)
        L = self.cfg.algo.max_response_length
        todo = [(j, s) for j, s in enumerate(g.samples) if s.finish_reason == "abort"]
        for j, s in todo:
            params = dataclasses.replace(
                self.sampling_params(self._seed(run.step, order, j)), max_new_tokens=L - len(s.response_ids)
            )
            rid = f"{gid}.{j}"
            run.outbox.append(Request(rid, list(s.prompt_ids) + list(s.response_ids), params, group=str(gid)))
            run.by_rid[rid] = (gid, s)
        if carried:
            run.resumed += len(todo)
        run.flights[gid] = _Flight(g, order, len(todo))

    def _flush(self, run: _Run) -> None:
        """Submit the requests decided so far, in one call (their samples' ``submitted_at``)."""
        if run.outbox:
            reqs, run.outbox = run.outbox, []
            now = self.engines.clock()
            for r in reqs:
                run.by_rid[r.rid][1].submitted_at = now
            self.engines.submit(reqs)

    def _on_finished(self, run: _Run, f) -> None:
        hit = run.by_rid.pop(f.rid, None)
        if hit is None:
            return
        gid, s = hit
        r = self.cfg.rollout
        stamp = r.partial_rollout or r.async_mode != "off"
        extend_sample(s, f.output, run.version, self.cfg.algo.max_response_length, versions=stamp)
        s.finished_at = f.finished_at
        fl = run.flights[gid]
        fl.todo -= 1
        if fl.todo == 0:
            run.arrived.append(gid)

    def _admit_ready(self, run: _Run) -> None:
        """Admit the groups that may be admitted now (all arrived ones; in --deterministic mode
        only the next in submission order), refilling after each, until the batch is full."""
        N = self.cfg.rollout.rollout_batch_size
        while len(run.buffer) < N:
            gid = self._next_admissible(run)
            if gid is None:
                break
            run.arrived.remove(gid)
            self._admit(run, run.flights.pop(gid).group)
            self._refill(run)
        self._flush(run)

    def _next_admissible(self, run: _Run) -> Optional[int]:
        if not run.arrived:
            return None
        if not self.cfg.run.deterministic:
            return run.arrived[0]
        first = min(run.flights, key=lambda gid: run.flights[gid].order)
        return first if run.flights[first].todo == 0 else None

    def _admit(self, run: _Run, g: Group) -> None:
        """Verify ``g``, filter it on the dynamic-sampling metric, keep it when mixed and when
        one of its samples has a token that carries a gradient: with ``--partial-rollout-offpolicy
        mask`` a group whose every sample was generated under older weights (it ended in an
        earlier step and was carried) would teach nothing and is not kept (its samples are
        counted in ``untrainable_samples``), so it does not take a place of the batch."""
        self._finalize(g, run.step)
        tv = time.perf_counter()
        self._verify([g])
        run.t_verify += time.perf_counter() - tv
        self._count_reward_errors(run, g)
        g.scored_at = self.engines.clock()
        run.generated.append(g)
        run.bars.verified(len(g.samples))
        res = dynamic_sampling_mask(torch.tensor(g.accs, dtype=torch.float32), len(g.samples), metric=self._metric(g))
        run.admitted += 1
        run.all_correct += res.num_all_correct
        run.all_wrong += res.num_all_wrong
        if res.num_kept or not self.cfg.algo.dynamic_sampling:
            r = self.cfg.rollout
            if (
                r.partial_rollout
                and r.partial_rollout_offpolicy == "mask"
                and not any(has_trainable_token(s, "mask") for s in g.samples)
            ):
                run.untrainable += len(g.samples)
            else:
                run.kept += 1
                run.buffer.append(g)
        run.bars.kept(
            min(len(run.buffer), self.cfg.rollout.rollout_batch_size), math.ceil(run.new_prompts / self._window)
        )

    def _finalize(self, g: Group, step: int) -> None:
        """A group whose samples all ended: ``stale_len`` (tokens generated before ``step``), text."""
        for s in g.samples:
            s.stale_len = sum(1 for v in (s.token_versions or []) if v < step)
            s.step_generated = step
            s.response_text = self.tokenizer.decode(s.response_ids, skip_special_tokens=True)

    def _stop(self, run: _Run) -> None:
        """The batch is full: the requests in flight are aborted (in --deterministic mode they run
        to their end); their groups are carried, verified as surplus, or thrown away (module doc)."""
        r = self.cfg.rollout
        if self.engines.outstanding:
            if self.cfg.run.deterministic:  # how far an aborted request got would depend on timing
                while self.engines.outstanding:
                    for f in self.engines.wait(WAIT_S):
                        self._on_finished(run, f)
            else:
                for f in self.engines.abort():
                    run.aborted += f.output.finish_reason == "abort"
                    self._on_finished(run, f)
        for fl in sorted(run.flights.values(), key=lambda x: x.order):
            g = fl.group
            if r.partial_rollout:
                self.carry.pending.append(g)
            elif r.reuse_surplus_groups and _complete(g):
                self._admit(run, g)
            else:
                run.discarded += len(g.samples)
        run.flights = {}

    def _count_reward_errors(self, run: _Run, g: Group) -> None:
        for s in g.samples:
            run.scored += 1
            if s.reason == "error":
                run.reward_errors += 1
                if run.first_reward_error is None:
                    prompt = self.dataset[s.prompt_index].prompt_text.strip().replace("\n", " ")
                    run.first_reward_error = (
                        f"{s.reward_error or 'the reward failed'} (first on prompt #{s.prompt_index}: {prompt[:60]!r})"
                    )

    def _check_reward_failed(self, run: _Run) -> None:
        """The reward failed on every sample scored this step: stop naming its own error (a
        broken --reward-fn would otherwise read as data that is too easy or too hard); some
        failed: one warning line."""
        if not run.reward_errors:
            return
        rc = self.cfg.reward
        which = (
            f"--reward-fn {rc.reward_fn}"
            if rc.reward_fn
            else (f"--reward-source {rc.reward_source}" if rc.reward_source else f"--reward-mode {rc.mode}")
        )
        if run.reward_errors == run.scored:
            raise RewardConfigError(
                f"{which} failed on every sample of step {run.step} ({run.scored} of {run.scored}): "
                f"{run.first_reward_error}; fix the reward function (it must take the documented arguments and "
                "return a finite score, docs/reward.md)"
            )
        print(
            f"[reward] step {run.step}: {which} failed on {run.reward_errors} of {run.scored} samples (scored -1): "
            f"{run.first_reward_error}",
            flush=True,
        )

    def _stall(self, run: _Run) -> RolloutStallError:
        r = self.cfg.rollout
        return RolloutStallError(
            f"step {run.step}: only {len(run.buffer)} of --rollout-batch-size {r.rollout_batch_size} mixed-correctness "
            f"groups after {run.new_prompts} prompts, the step's budget of --max-num-gen-batches "
            f"{r.max_num_gen_batches} x --over-sampling-batch-size {self._window} (groups were {run.all_correct} "
            f"all-correct, {run.all_wrong} all-wrong). The data is too easy or too hard for the model: raise "
            "--max-num-gen-batches or --over-sampling-batch-size, use a dataset of mixed difficulty, or disable "
            "--dynamic-sampling."
        )

    def _abort_quietly(self) -> None:
        """After an error: nothing of this step keeps running in the engines."""
        try:
            if self.engines.outstanding:
                self.engines.abort()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            pass

    # ----------------------------------------------------------------- verifying ----
    def _metric(self, g: Group) -> Optional[torch.Tensor]:
        """The per-sample values of ``--dynamic-sampling-metric`` (None for ``acc``: the DAPO rule)."""
        return DYNAMIC_SAMPLING_METRICS.get(self.cfg.algo.dynamic_sampling_metric)(g.samples)

    def reward_input(self, s: Sample) -> RewardInput:
        """The record the reward sees: the response and its prompt's text, label, data source and metadata."""
        rec = self.dataset[s.prompt_index]
        return RewardInput(s.response_text, s.ground_truth, rec.prompt_text, rec.data_source, rec.metadata)

    def _verify(self, groups: list) -> None:
        samples = [s for g in groups for s in g.samples]
        results = self.scorer.score([self.reward_input(s) for s in samples])
        for s, res in zip(samples, results):
            s.score, s.acc, s.pred, s.reason = float(res.score), bool(res.acc), res.pred, res.reason
            s.reward_error = str(res.extra.get("error", "")) if res.reason == "error" else None
        shape_rewards(samples, self.cfg.algo)

    # ---------------------------------------------------------------- checkpoint ----
    def replay(self, prompt_indices: list) -> None:
        """Draw these prompts again, before any new one (their rollout was thrown away unused:
        ``driver/prefetch.RolloutQueue``'s admission rule)."""
        self.replayed.extendleft(reversed(list(prompt_indices)))

    def state_dict(self) -> dict:
        return {**self.carry.state_dict(), "replayed": list(self.replayed)}

    def load_state_dict(self, s: dict) -> None:
        self.carry.load_state_dict(s)
        self.replayed = collections.deque(s.get("replayed", []))
        # a checkpoint of the chunked manager: prompts of chunks that never started
        for pi in s.get("pending_prompts", []):
            rec = self.dataset[pi]
            self.carry.pending.append(
                Group(
                    pi,
                    [
                        Sample(
                            prompt_index=pi,
                            prompt_ids=list(rec.prompt_ids),
                            response_ids=[],
                            engine_logprobs=[],
                            finish_reason="abort",
                            ground_truth=rec.ground_truth,
                            token_versions=[],
                        )
                        for _ in range(self.cfg.rollout.n_samples_per_prompt)
                    ],
                )
            )


def extend_sample(s: Sample, out, step: int, max_len: int, versions: bool = True) -> None:
    """Append ``out`` (a GenerationOutput: a whole response, or a continuation of ``s``'s prefix)
    to sample ``s``, cut to the ``max_len`` response budget; with ``versions`` its tokens get
    weight version ``step`` (``token_versions``)."""
    room = max_len - len(s.response_ids)
    ids, lps = list(out.output_ids)[:room], list(out.logprobs)[:room]
    if ids:  # --routing-replay: the fed positions of prompt + response (all but the last token)
        routed = getattr(out, "routed_experts", None)
        if s.response_ids and s.routed_experts is not None:
            # a continuation: the prefix keeps the routing it was generated under (a prefix
            # returned without routing, e.g. an abort that skipped it, takes the continuation's
            # rows of it: the engine recomputed them under the newer weights)
            routed = extend_routing(s.routed_experts, routed)
        keep = len(s.prompt_ids) + len(s.response_ids) + len(ids) - 1
        s.routed_experts = None if routed is None else routed[:keep]
    s.response_ids = list(s.response_ids) + ids
    s.engine_logprobs = list(s.engine_logprobs) + lps
    if versions:  # the engine's own stamps where it gives them (weights updated mid-request)
        stamped = getattr(out, "token_versions", None)
        new = list(stamped)[: len(ids)] if stamped is not None and len(stamped) >= len(ids) else [step] * len(ids)
        s.token_versions = list(s.token_versions or []) + new
    s.finish_reason = "length" if len(out.output_ids) > room else out.finish_reason
    if s.finish_reason == "abort" and len(s.response_ids) >= max_len:
        s.finish_reason = "length"  # aborted at the budget: nothing is left to continue


class _bars:
    """tqdm progress of one step's rollout: mixed groups collected, responses verified."""

    def __init__(self, enabled: bool, step: int, total_groups: int):
        self.gen = self.ver = None
        if enabled:
            self.gen = tqdm(total=total_groups, desc=f"step {step} generate (mixed groups)", leave=False, unit="group")
            self.ver = tqdm(desc=f"step {step} verify", leave=False, unit="resp")

    def kept(self, n: int, rounds: int) -> None:
        if self.gen is not None:
            self.gen.n = n
            self.gen.set_postfix(rounds=rounds, refresh=True)

    def verified(self, n: int) -> None:
        if self.ver is not None:
            self.ver.update(n)

    def close(self) -> None:
        for b in (self.gen, self.ver):
            if b is not None:
                b.close()
