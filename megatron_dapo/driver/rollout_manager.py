"""Rollout manager: over-sampled generation rounds, verification, dynamic-sampling filter.

One call of :meth:`RolloutManager.collect` fills a buffer with ``rollout_batch_size`` groups
(of ``n_samples_per_prompt`` responses each) whose raw correctness is mixed
(``0 < sum(acc) < G``, paper Eq. 11), generating rounds of ``over_sampling_batch_size``
prompts until it is full:

* each round is split into chunks that go to the engines; once the buffer is full, the
  remaining in-flight chunks are aborted (not in ``--deterministic`` mode, where every
  chunk of a round finishes so that no timing decides which samples are kept);
* an engine that dies or does not answer within ``--engine-timeout-s`` is restarted and
  re-synced (``EnginePool``), and its chunk is re-queued;
* verification runs in the reward process pool, which sees each sample's whole record
  (prompt, response, label, data source, metadata); the filter uses ``acc`` (or the sample
  field that ``--dynamic-sampling-metric`` names: a group is kept when that field varies within it);
* with ``--reuse-surplus-groups``, kept groups beyond the batch are carried to the next step
  (with the old-policy logprobs of the step that generated them);
* with ``--partial-rollout``, the aborted in-flight generations keep their prefixes (tokens,
  engine logprobs, the weight version of each token) and chunks not yet started keep their
  prompts; the next step first continues the prefixes under the new weights (prompt + prefix
  as the engine's prompt, so any engine continues them), then starts the kept prompts, then
  new ones. A group is verified and filtered only when all its samples finished; a prefix
  older than ``--partial-rollout-max-staleness`` steps is dropped and its sample regenerated.
  The tokens generated under older weights (``Sample.stale_len``) are masked or corrected in
  the loss (``--partial-rollout-offpolicy``). In ``--deterministic`` mode nothing is aborted
  (no timing decides), so the work carried over is the round's groups beyond a full batch,
  kept whole and unscored. The carried work is part of :meth:`RolloutManager.state_dict`.

Exceeding ``--max-num-gen-batches`` is an error that says what to change.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable, Optional

import torch

from ..algo import dynamic_sampling_mask
from ..reward.api import RewardInput
from ..rollout.base import SamplingParams
from .batch import Group, Sample, shape_rewards

log = logging.getLogger(__name__)


class RolloutStallError(RuntimeError):
    pass


class EnginePool:
    """Engine actors with restart-on-failure. ``make_engine(i)`` builds engine i (an actor
    handle); ``resync(handles)`` pushes the current trainer weights into new engines."""

    def __init__(self, make_engine: Callable, num_engines: int, resync: Callable, timeout_s: float):
        self.make_engine, self.resync, self.timeout_s = make_engine, resync, timeout_s
        self.handles = [make_engine(i) for i in range(num_engines)]
        self.restarts = 0
        self.kill_next_generation = False  # testing: SIGKILL engine 0 right after submitting

    def restart(self, i: int, why: str) -> None:
        import ray

        log.warning("engine %d %s: restarting it and re-syncing weights", i, why)
        try:
            ray.kill(self.handles[i], no_restart=True)
        except Exception:
            pass
        self.handles[i] = self.make_engine(i)
        self.resync([self.handles[i]])
        self.restarts += 1

    def run_chunks(self, chunks: list, on_result: Callable[[int, list], bool], ordered: bool,
                   on_leftover: Optional[Callable[[int, Optional[list]], None]] = None) -> None:
        """Generate every (prompts, params) chunk; ``on_result(idx, outputs)`` returns True to
        stop (buffer full): then in-flight chunks are aborted unless ``ordered``.
        ``on_leftover(idx, outputs)`` then receives each chunk that was not emitted: the
        aborted ones' outputs (finish reason "abort" for the unfinished samples) and None for
        those never started."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        n = len(self.handles)
        pending = {}  # future -> (chunk index, engine index)
        queue = list(range(len(chunks)))
        busy = [None] * n

        def submit():
            for e in range(n):
                if busy[e] is None and queue:
                    i = queue.pop(0)
                    prompts, params = chunks[i]
                    fut = self.handles[e].generate.remote(prompts, params)
                    pending[fut] = (i, e, time.monotonic())
                    busy[e] = fut

        submit()
        if self.kill_next_generation:
            self.kill_next_generation = False
            import signal

            os.kill(ray.get(self.handles[0].pid.remote()), signal.SIGKILL)
        done_results = {}
        next_to_emit = 0
        stop = False
        while pending and not stop:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=5.0)
            now = time.monotonic()
            if not ready:
                for fut, (i, e, t0) in list(pending.items()):
                    if now - t0 > self.timeout_s:
                        del pending[fut]
                        busy[e] = None
                        self.restart(e, f"did not answer within {self.timeout_s:.0f}s")
                        queue.insert(0, i)
                submit()
                continue
            fut = ready[0]
            i, e, _ = pending.pop(fut)
            busy[e] = None
            try:
                out = ray.get(fut)
            except (RayActorError, GetTimeoutError) as err:
                self.restart(e, f"died ({type(err).__name__})")
                queue.insert(0, i)
                submit()
                continue
            if ordered:
                done_results[i] = out
                while next_to_emit in done_results and not stop:
                    stop = on_result(next_to_emit, done_results.pop(next_to_emit))
                    next_to_emit += 1
            else:
                stop = on_result(i, out)
            if not stop:
                submit()
        if stop and on_leftover is not None:
            for i in queue:
                on_leftover(i, None)
            for i in sorted(done_results):
                on_leftover(i, done_results[i])
        if stop and pending:
            for h in self.handles:
                try:
                    h.abort.remote()
                except Exception:
                    pass
            for fut in list(pending):
                try:
                    out = ray.get(fut, timeout=self.timeout_s)
                except Exception:
                    out = None
                if on_leftover is not None:
                    on_leftover(pending[fut][0], out)


@dataclasses.dataclass
class RolloutResult:
    groups: list  # kept groups for this step (exactly rollout_batch_size of them)
    generated: list  # every generated group of this step (for metrics and dumps)
    num_gen_batches: int
    num_kept: int
    num_all_correct: int
    num_all_wrong: int
    reused: int = 0
    time_generate: float = 0.0
    time_verify: float = 0.0
    partial_resumed: int = 0  # --partial-rollout: samples continued from a kept prefix this step
    partial_dropped: int = 0  # prefixes dropped by --partial-rollout-max-staleness
    partial_pending: int = 0  # groups carried to the next step
    discarded_samples: int = 0  # aborted samples thrown away (without --partial-rollout)


class RolloutManager:
    def __init__(self, cfg, dataset, sampler, engines: EnginePool, scorer, tokenizer):
        self.cfg, self.dataset, self.sampler, self.engines = cfg, dataset, sampler, engines
        self.scorer, self.tokenizer = scorer, tokenizer
        self.surplus: list = []
        self.pending: list = []  # --partial-rollout: groups with unfinished (or unscored) samples
        self.pending_prompts: list = []  # --partial-rollout: prompts of chunks never started

    def sampling_params(self, seed: Optional[int]) -> SamplingParams:
        r, a = self.cfg.rollout, self.cfg.algo
        return SamplingParams(
            temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=a.max_response_length,
            n=r.n_samples_per_prompt, stop=list(r.stop), seed=seed,
        )

    def _seed(self, step: int, rnd: int, chunk: int) -> Optional[int]:
        if not self.cfg.run.deterministic:
            return None
        return (self.cfg.optim.seed * 1_000_003 + step * 10_007 + rnd * 101 + chunk) % (2**62)

    def collect(self, step: int) -> RolloutResult:
        r, a = self.cfg.rollout, self.cfg.algo
        N, G = r.rollout_batch_size, r.n_samples_per_prompt
        per_round = r.over_sampling_batch_size or N
        buffer = list(self.surplus)
        reused = len(buffer)
        self.surplus = []
        generated, stats = [], {"kept": 0, "all_correct": 0, "all_wrong": 0}
        t_gen = t_ver = 0.0
        rounds = 0
        bars = _bars(self.cfg.logging.progress, step, N)
        partial = {"resumed": 0, "dropped": 0, "discarded": 0}

        def admit(groups):
            """Verify, filter on the dynamic-sampling metric, keep the mixed groups."""
            nonlocal t_ver
            tv = time.perf_counter()
            self._verify(groups)
            t_ver += time.perf_counter() - tv
            generated.extend(groups)
            bars.verified(sum(len(g.samples) for g in groups))
            for g in groups:
                res = dynamic_sampling_mask(torch.tensor(g.accs, dtype=torch.float32), G, metric=self._metric(g))
                stats["all_correct"] += res.num_all_correct
                stats["all_wrong"] += res.num_all_wrong
                if res.num_kept or not a.dynamic_sampling:
                    stats["kept"] += res.num_kept
                    buffer.append(g)
            bars.kept(min(len(buffer), N), rounds)

        cparts, cchunks = [], []  # --partial-rollout: continuations of the kept prefixes
        if r.partial_rollout and self.pending:
            cparts, cchunks = self._continuations(step, partial)
            admit(self._pop_complete(step))  # groups that were already complete
        while len(buffer) < N:
            if rounds >= r.max_num_gen_batches:
                raise RolloutStallError(
                    f"step {step}: only {len(buffer)} of --rollout-batch-size {N} mixed-correctness groups after "
                    f"--max-num-gen-batches {r.max_num_gen_batches} generation rounds of {per_round} prompts "
                    f"(groups were {stats['all_correct']} all-correct, {stats['all_wrong']} all-wrong). The data is "
                    "too easy or too hard for the model: raise --max-num-gen-batches or "
                    "--over-sampling-batch-size, use a dataset of mixed difficulty, or disable --dynamic-sampling."
                )
            rounds += 1
            if rounds > 1:  # one line per extra round: a step searching for mixed groups is never silent
                print(f"[rollout] step {step}: round {rounds} of at most {r.max_num_gen_batches}, "
                      f"{min(len(buffer), N)}/{N} mixed-correctness groups so far ({stats['all_correct']} "
                      f"all-correct, {stats['all_wrong']} all-wrong)", flush=True)
            idx, self.pending_prompts = self.pending_prompts[:per_round], self.pending_prompts[per_round:]
            if len(idx) < per_round:
                idx = idx + self.sampler.next_indices(per_round - len(idx))
            n_chunks = max(1, min(len(idx), 2 * len(self.engines.handles)))
            parts = [idx[k::n_chunks] for k in range(n_chunks)]
            # the continuations go first, in the first round only; they are aborted and kept like the rest
            nc = len(cchunks)
            chunks = cchunks + [
                ([self.dataset[i].prompt_ids for i in part], self.sampling_params(self._seed(step, rounds, k)))
                for k, part in enumerate(parts)
            ]
            cchunks = []

            def on_result(k, outs, parts=parts, nc=nc):
                if k < nc:
                    for s, o in zip(cparts[k], outs):
                        extend_sample(s, o[0], step, a.max_response_length)
                    if len(buffer) < N:
                        admit(self._pop_complete(step))
                    return len(buffer) >= N and not self.cfg.run.deterministic
                groups = self._to_groups(parts[k - nc], outs, step)
                if r.partial_rollout and len(buffer) >= N:  # deterministic mode: kept whole for the next step
                    self.pending.extend(groups)
                    return False
                admit(groups)
                return len(buffer) >= N and not self.cfg.run.deterministic

            def on_leftover(k, outs, parts=parts, nc=nc):
                if k < nc:  # a continuation aborted again (its samples stay pending) or never started
                    for s, o in zip(cparts[k], outs or []):
                        extend_sample(s, o[0], step, a.max_response_length)
                    return
                k -= nc
                if not r.partial_rollout:
                    partial["discarded"] += sum(len(x) for x in outs) if outs else 0
                elif outs is None:
                    self.pending_prompts.extend(parts[k])
                else:
                    self.pending.extend(self._to_groups(parts[k], outs, step))

            t0 = time.perf_counter()
            self.engines.run_chunks(chunks, on_result, ordered=self.cfg.run.deterministic, on_leftover=on_leftover)
            t_gen += time.perf_counter() - t0
        t_gen -= t_ver
        bars.close()
        kept, surplus = buffer[:N], buffer[N:]
        if r.reuse_surplus_groups:
            self.surplus = surplus
        return RolloutResult(
            kept, generated, rounds, stats["kept"], stats["all_correct"], stats["all_wrong"], reused, t_gen, t_ver,
            partial["resumed"], partial["dropped"], len(self.pending), partial["discarded"],
        )

    def _continuations(self, step: int, counts: dict) -> tuple:
        """--partial-rollout: the chunks that continue every unfinished sample of the kept groups
        under the current weights (prompt + prefix as the engine's prompt, the remaining length
        budget), after dropping prefixes older than --partial-rollout-max-staleness (their
        samples start again from the prompt). Returns ``(parts, chunks)``: ``parts[k]`` are the
        samples of chunk ``k``."""
        r, L = self.cfg.rollout, self.cfg.algo.max_response_length
        todo = []
        for g in self.pending:
            for s in g.samples:
                if s.token_versions and min(s.token_versions) < step - r.partial_rollout_max_staleness:
                    counts["dropped"] += 1
                    s.response_ids, s.engine_logprobs, s.token_versions, s.finish_reason = [], [], [], "abort"
                if s.finish_reason == "abort":
                    todo.append(s)
        counts["resumed"] += len(todo)
        parts, chunks = [], []
        if todo:
            # a group's samples share a chunk, so a finished chunk completes whole groups (each
            # output is cut to its own sample's budget)
            by_group = [[s for s in g.samples if s.finish_reason == "abort"] for g in self.pending]
            by_group = [x for x in by_group if x]
            n_chunks = max(1, min(len(by_group), 2 * len(self.engines.handles)))
            size = -(-len(by_group) // n_chunks)
            parts = [sum(by_group[i : i + size], []) for i in range(0, len(by_group), size)]
            for k, part in enumerate(parts):
                params = dataclasses.replace(self.sampling_params(self._seed(step, 0, k)), n=1,
                                             max_new_tokens=L - min(len(s.response_ids) for s in part))
                chunks.append(([list(s.prompt_ids) + list(s.response_ids) for s in part], params))
        return parts, chunks

    def _pop_complete(self, step: int) -> list:
        """The kept groups whose samples have all finished, removed from ``self.pending``, with
        ``stale_len`` (tokens generated before ``step``) set."""
        done = [g for g in self.pending if all(s.finish_reason != "abort" for s in g.samples)]
        self.pending = [g for g in self.pending if any(s.finish_reason == "abort" for s in g.samples)]
        for g in done:
            for s in g.samples:
                s.stale_len = sum(1 for v in (s.token_versions or []) if v < step)
                s.step_generated = step
                s.response_text = self.tokenizer.decode(s.response_ids, skip_special_tokens=True)
        return done

    def _metric(self, g: Group) -> Optional[torch.Tensor]:
        """The per-sample values of ``--dynamic-sampling-metric`` (None for ``acc``: the DAPO rule)."""
        name = self.cfg.algo.dynamic_sampling_metric
        if name == "acc":
            return None
        return torch.tensor([float(getattr(s, name)) for s in g.samples], dtype=torch.float64)

    def _to_groups(self, prompt_indices: list, outs: list, step: int) -> list:
        groups = []
        for pi, samples in zip(prompt_indices, outs):
            rec = self.dataset[pi]
            ss = []
            for o in samples:
                ss.append(
                    Sample(
                        prompt_index=pi, prompt_ids=list(rec.prompt_ids), response_ids=list(o.output_ids),
                        engine_logprobs=list(o.logprobs), finish_reason=o.finish_reason,
                        ground_truth=rec.ground_truth, step_generated=step,
                        token_versions=[step] * len(o.output_ids) if self.cfg.rollout.partial_rollout else None,
                        response_text=self.tokenizer.decode(o.output_ids, skip_special_tokens=True),
                    )
                )
            groups.append(Group(pi, ss))
        return groups

    def reward_input(self, s: Sample) -> RewardInput:
        """The record the reward sees: the response and its prompt's text, label, data source and metadata."""
        rec = self.dataset[s.prompt_index]
        return RewardInput(s.response_text, s.ground_truth, rec.prompt_text, rec.data_source, rec.metadata)

    def _verify(self, groups: list) -> None:
        samples = [s for g in groups for s in g.samples]
        results = self.scorer.score([self.reward_input(s) for s in samples])
        for s, res in zip(samples, results):
            s.score, s.acc, s.pred, s.reason = float(res.score), bool(res.acc), res.pred, res.reason
        shape_rewards(samples, self.cfg.algo)

    def state_dict(self) -> dict:
        def groups(gs):
            return [[dataclasses.asdict(s) for s in g.samples] for g in gs]

        return {"surplus": groups(self.surplus), "pending": groups(self.pending),
                "pending_prompts": list(self.pending_prompts)}

    def load_state_dict(self, s: dict) -> None:
        def groups(gs):
            return [Group(g[0]["prompt_index"], [Sample(**x) for x in g]) for g in gs]

        self.surplus = groups(s.get("surplus", []))
        self.pending = groups(s.get("pending", []))
        self.pending_prompts = list(s.get("pending_prompts", []))


def extend_sample(s: Sample, out, step: int, max_len: int) -> None:
    """Append a continuation ``out`` (a GenerationOutput) to sample ``s``'s prefix, cut to the
    ``max_len`` response budget; its tokens get weight version ``step``."""
    room = max_len - len(s.response_ids)
    ids, lps = list(out.output_ids)[:room], list(out.logprobs)[:room]
    s.response_ids = list(s.response_ids) + ids
    s.engine_logprobs = list(s.engine_logprobs) + lps
    s.token_versions = list(s.token_versions or []) + [step] * len(ids)
    s.finish_reason = "length" if len(out.output_ids) > room else out.finish_reason


class _bars:
    """tqdm progress of one step's rollout: mixed groups collected, responses verified."""

    def __init__(self, enabled: bool, step: int, total_groups: int):
        self.gen = self.ver = None
        if enabled:
            from tqdm.auto import tqdm

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
