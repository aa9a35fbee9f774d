"""Rollout scheduling benchmark: the real RolloutManager (dynamic sampling, rounds, aborts,
partial rollout) against simulated engines, so the scheduling policy is measured, not a model.

The engines (``SimPool``) run on a virtual clock with the EnginePool's contract: each engine
takes one chunk at a time (the manager makes two chunks per engine per round); a chunk is
one batched decode, one token per unfinished sample per decode step, so it lasts until its
longest response ends (every chunk waits for its tail). A decode step with ``a`` unfinished
samples takes ``max(--step-latency, a / --token-rate)`` time units. The default (latency 0) is
an engine at a fixed token rate: time is proportional to the tokens generated. ``--step-latency 1``
adds a floor per decode step below ``--token-rate`` sequences (a memory-bound tail: a handful of
long responses cost as much per step as a full batch), the regime where chunks wait longest
for their tails. When
the manager says the batch is full, the chunks in flight are aborted at that instant (each
sample keeps the tokens generated so far) and the queued ones never start. Verification is
instantaneous. Generation wall time is virtual time.

The workload (stated assumptions, not measurements):

* response lengths: lognormal, median ``--length-median`` 2500 tokens, sigma
  ``--length-sigma`` 0.75, capped at L_max 20480 (finish "length"): mean ~3300 tokens, 1% above
  ~14k, 0.25% at the cap. DAPO's Qwen2.5-32B run (arXiv 2503.14476, response-length figure)
  has mean lengths growing from ~1k to ~4k+ tokens under a 20480 cap; the long right tail is
  what every chunk waits for.
* per-prompt accuracy p ~ Beta(0.24, 0.34), each of G = 16 samples right with probability p:
  30% of the groups all wrong, 16% all correct, 54% mixed (kept), the group statistics of the
  healthy run of the diagnosis tests (tests/diagnostics/diag_synthetic.py: kept 0.55, all
  correct 0.15, all wrong 0.30). The model does not learn here: the accuracy is stationary.
* the DAPO recipe's ratios, scaled down: rollout batch 64 prompts, 3x over-sampling (192
  prompts a round, like 1536 for 512), G = 16, 8 engines, 8 rollout steps.

Both runs (without / with ``--partial-rollout``) use the same prompts, lengths and
accuracies (same seed), for each of ``--seeds`` seeds. Prints per seed and in total, and last:

    generated/kept samples: X.XX (without) X.XX (with partial rollout)
    partial rollout speedup: X.XX

``speedup`` = generation wall time per kept sample without partial rollout over with it (all
seeds pooled). ``generated`` counts every response whose generation started and was either
verified or thrown away (aborted without partial rollout).

    .venv/bin/python benchmarks/bench_rollout.py            # the documented run
    .venv/bin/python benchmarks/bench_rollout.py --small    # a quick smoke run
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from megatron_dapo.config import parse_args  # noqa: E402
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler  # noqa: E402
from megatron_dapo.driver.rollout_manager import RolloutManager  # noqa: E402
from megatron_dapo.reward import RewardResult  # noqa: E402
from megatron_dapo.rollout.base import GenerationOutput  # noqa: E402

SAMPLE_BASE = 1000  # first response token = SAMPLE_BASE + 2 * sample id + correct


class Workload:
    """Per-prompt accuracies and per-sample (length, correct), drawn once per new sample."""

    def __init__(self, n_prompts: int, seed: int, median: float, sigma: float, max_len: int, a: float, b: float):
        self.rng = np.random.default_rng(seed)
        self.p = self.rng.beta(a, b, size=n_prompts)
        self.median, self.sigma, self.max_len = median, sigma, max_len
        self.samples = []  # sample id -> (full length, correct)

    def new_sample(self, prompt: int) -> int:
        length = int(min(max(1, round(self.median * np.exp(self.sigma * self.rng.standard_normal()))), self.max_len))
        self.samples.append((length, bool(self.rng.random() < self.p[prompt])))
        return len(self.samples) - 1


class SimPool:
    """Simulated engines on a virtual clock (see the module doc)."""

    def __init__(self, work: Workload, n_engines: int, token_rate: float, step_latency: float):
        self.work, self.rate, self.latency = work, float(token_rate), float(step_latency)
        self.handles = [None] * n_engines
        self.restarts = 0
        self.now = 0.0
        self.tokens = 0  # every generated token, kept or not

    def _outputs(self, prompts, params):
        """The whole outputs of a chunk (as if uninterrupted) and their new-token counts."""
        outs = []
        for p in prompts:
            if len(p) == 2:  # a bare prompt [i, 7]: n new samples
                sids = [self.work.new_sample(p[0]) for _ in range(params.n)]
                prefix = 0
            else:  # prompt + prefix: continue the sample the prefix's first token names
                sids = [(p[2] - SAMPLE_BASE) // 2]
                prefix = len(p) - 2
            group = []
            for sid in sids:
                length, correct = self.work.samples[sid]
                n = max(0, min(length - prefix, params.max_new_tokens))
                ids = ([SAMPLE_BASE + 2 * sid + int(correct)] if prefix == 0 else []) + [7] * n
                ids = ids[:n]
                fin = "length" if prefix + n >= self.work.max_len else ("stop" if prefix + n >= length else "length")
                group.append(GenerationOutput(list(p), ids, [-0.5] * len(ids), fin))
            outs.append(group)
        return outs

    def _segments(self, outs):
        """``[(decode steps, time per step)]`` of a chunk: constant while no sample finishes."""
        lens = sorted(len(o.output_ids) for g in outs for o in g)
        segs, done = [], 0
        for i, L in enumerate(lens):
            if L > done:
                segs.append((L - done, max(self.latency, (len(lens) - i) / self.rate)))
                done = L
        return segs

    def _duration(self, outs) -> float:
        return sum(n * dt for n, dt in self._segments(outs))

    def _steps_by(self, outs, elapsed: float) -> int:
        """Decode steps a chunk has completed ``elapsed`` time units after it started."""
        k = 0
        for n, dt in self._segments(outs):
            if elapsed < n * dt:
                return k + int(elapsed / dt)
            elapsed -= n * dt
            k += n
        return k

    @staticmethod
    def _cut(outs, k):
        """Outputs aborted after k decode steps: each sample keeps at most k tokens."""
        cut = []
        for group in outs:
            g = []
            for o in group:
                if len(o.output_ids) > k:
                    g.append(GenerationOutput(o.prompt_ids, o.output_ids[:k], o.logprobs[:k], "abort"))
                else:
                    g.append(o)
            cut.append(g)
        return cut

    def run_chunks(self, chunks, on_result, ordered, on_leftover=None):
        queue = list(range(len(chunks)))
        running = {}  # engine -> (chunk, start time, end time, outputs)
        done = {}
        next_emit = 0
        while queue or running:
            for e in range(len(self.handles)):
                if e not in running and queue:
                    i = queue.pop(0)
                    outs = self._outputs(*chunks[i])
                    running[e] = (i, self.now, self.now + self._duration(outs), outs)
            e = min(running, key=lambda x: (running[x][2], x))
            i, _, end, outs = running.pop(e)
            self.now = end
            self.tokens += sum(len(o.output_ids) for g in outs for o in g)
            if ordered:
                done[i] = outs
                while next_emit in done:
                    on_result(next_emit, done.pop(next_emit))
                    next_emit += 1
                continue
            if on_result(i, outs):
                for e2, (i2, t0, _, outs2) in sorted(running.items()):
                    k = self._steps_by(outs2, self.now - t0)
                    cut = self._cut(outs2, k)
                    self.tokens += sum(len(o.output_ids) for g in cut for o in g)
                    if on_leftover is not None:
                        on_leftover(i2, cut)
                if on_leftover is not None:
                    for i2 in queue:
                        on_leftover(i2, None)
                return


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


class Scorer:
    """Right when the first response token says so (the workload decided it)."""

    def score(self, items):
        out = []
        for x in items:
            first = int(x.response.split(" ", 1)[0])
            ok = bool((first - SAMPLE_BASE) % 2)
            out.append(RewardResult(1.0 if ok else -1.0, ok, "", "ok"))
        return out


def run(args, seed: int, partial: bool) -> dict:
    argv = ["--rollout-batch-size", str(args.batch), "--n-samples-per-prompt", str(args.group),
            "--over-sampling-batch-size", str(args.batch * args.over_sampling), "--global-batch-size",
            str(args.batch * args.group), "--max-response-length", str(args.max_len), "--overlong-buffer-length",
            str(min(4096, args.max_len // 4)), "--max-num-gen-batches", "1000", "--partial-rollout", "true" if partial else "false",
            "--no-progress"]
    cfg = parse_args(argv)
    n_prompts = args.batch * args.over_sampling * (args.steps + 4) * 4
    ds = [PromptRecord(i, [i, 7], f"p{i}", "x") for i in range(n_prompts)]
    work = Workload(n_prompts, seed, args.length_median, args.length_sigma, args.max_len, 0.24, 0.34)
    pool = SimPool(work, args.engines, args.token_rate, args.step_latency)
    mgr = RolloutManager(cfg, ds, ResumableSampler(n_prompts, seed=seed, shuffle=True), pool, Scorer(), Tok())
    generated = kept = 0
    kept_tokens = 0
    for step in range(1, args.steps + 1):
        res = mgr.collect(step)
        generated += sum(len(g.samples) for g in res.generated) + res.discarded_samples
        kept += sum(len(g.samples) for g in res.groups)
        kept_tokens += sum(len(s.response_ids) for g in res.groups for s in g.samples)
    return {"time": pool.now, "generated": generated, "kept": kept, "tokens": pool.tokens, "kept_tokens": kept_tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="rollout batch (prompts kept per step)")
    ap.add_argument("--over-sampling", type=int, default=3, help="prompts per round = batch x this")
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=20480)
    ap.add_argument("--length-median", type=float, default=2500.0)
    ap.add_argument("--length-sigma", type=float, default=0.75)
    ap.add_argument("--token-rate", type=float, default=64.0,
                    help="tokens per time unit of a saturated engine (a decode step of a sequences takes a / this)")
    ap.add_argument("--step-latency", type=float, default=0.0,
                    help="least time of one decode step (0: a fixed token rate whatever the batch; 1: a step of a "
                         "batch smaller than --token-rate costs as much as a saturated one)")
    ap.add_argument("--small", action="store_true", help="a quick smoke run")
    args = ap.parse_args(argv)
    if args.small:
        args.seeds, args.steps, args.batch, args.group, args.engines = 2, 3, 8, 4, 2
        args.max_len, args.length_median = 512, 64.0
    tot = {False: [0.0, 0, 0], True: [0.0, 0, 0]}
    for seed in range(args.seeds):
        line = [f"seed {seed}:"]
        for partial in (False, True):
            r = run(args, seed, partial)
            t = tot[partial]
            t[0] += r["time"]
            t[1] += r["generated"]
            t[2] += r["kept"]
            name = "partial" if partial else "baseline"
            line.append(f"{name} time/kept {r['time'] / r['kept']:.1f} generated/kept {r['generated'] / r['kept']:.2f} "
                        f"tokens/kept-tokens {r['tokens'] / max(r['kept_tokens'], 1):.2f};")
        print(" ".join(line), flush=True)
    base, part = tot[False], tot[True]
    print(f"generated/kept samples: {base[1] / base[2]:.2f} (without) {part[1] / part[2]:.2f} (with partial rollout)")
    print(f"partial rollout speedup: {(base[0] / base[2]) / (part[0] / part[2]):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
