"""Rollout benchmark: trainable tokens per second, blocking chunks against streaming.

What the trainer learns from is the tokens that carry a gradient, so that is what is counted:
each step's kept groups go through the trainer's own code, ``assign_advantages`` (overlong
filtering), ``training_samples`` (samples without a trainable token left out) and
the weights of ``algo.tis.loss_token_weights`` (under ``--partial-rollout-offpolicy mask`` a
token generated under older weights has weight 0 and is not counted, under ``correct`` it is;
an overlong-filtered response counts nothing), and the tokens kept in the loss are summed (by
that rule, checked against ``training.token_weights.weigh_items`` on a few samples a step).
Throughput = those tokens / generation time (virtual), and per GPU-second (engines x TP 8 GPUs).
``untrainable``: the share of the samples that had no trainable token: left out of kept groups,
or in mixed groups the manager did not keep (every sample entirely stale under ``mask``).

The real ``RolloutManager`` (dynamic sampling, the request window, the batch-full abort, partial
rollout) drives simulated engines through the real ``EnginePool`` (in-process transport); the
engines implement the streaming interface (``submit`` / ``poll`` / ``abort_requests``) on one
virtual clock (``Sim``: every ``poll`` advances it to the next event of any engine, so the
manager reacts to each ended request at the time it ended). Verification is instantaneous.

Engines (rows of the table):

* **blocking chunks**: static batching, the engine before streaming: when free it takes the
  waiting requests (up to ``--slots``) as one chunk and returns the chunk's requests only when
  its longest one ends; it cannot abort mid-chunk (an abort waits for the chunk's end; queued
  requests are dropped). ``abort at the instant``: the same engine stopped at the batch-full
  instant, each request keeping its tokens so far (what the previous version of this benchmark
  simulated); ``+ partial (mask)``: that, with ``--partial-rollout``.
* **streaming**: continuous batching over ``--slots`` running requests; a request ends and is
  returned as soon as its last token is decoded, a waiting one takes the freed slot at the next
  decode step. Without early abort the requests still running when the batch is full run to
  their end (then thrown away); ``+ early abort``: they are stopped at that instant;
  ``+ partial``: their prefixes are continued next step (``--partial-rollout``, offpolicy mask /
  correct).

Cost model (Qwen2.5-32B, TP 8 per engine; facts from its public config.json,
/work/shared/REFERENCE.md, and the GPU's spec sheet):

* A decode step with ``a`` unfinished sequences costs ``t0 + a * c`` (finished sequences of a
  chunk cost nothing). Decoding is memory-bound: each step reads every weight once and every
  running sequence's KV cache once.
* ``t0`` (the floor): the weights read per step. 32,763,876,352 parameters in bf16 = 65.5 GB, a
  TP-8 GPU holds 8.19 GB; at the H100 SXM's 3.35 TB/s that is 2.45 ms (H200, 4.8 TB/s: 1.71 ms).
* ``c``: one sequence's KV read per step. K and V x 64 layers x 8 KV heads x 128 dims x 2 bytes =
  256 KiB per token, 32 KiB per TP-8 GPU; a step reads the sequence's whole context, on average
  ``P + E[L^2] / (2 E[L])`` tokens over a response's decode steps weighted by tokens (``P`` the
  prompt, 200 tokens; ``L`` the workload's response lengths below): 3.0k tokens, 98 MB per
  GPU, 29.3 us on H100. So ``t0 = 83 c``: the weights cost as much as the KV reads of ~83
  sequences (the issue's "~64 sequences" is the same at 3.9k tokens of context). ``c`` charges
  every decoded token the mean context's KV read; really a token's read grows with its context,
  but a step costs the sum over its sequences, so the same tokens cost the same total whatever
  the batching (only the mix of tokens decoded differs between rows: the early-abort rows stop
  long responses, whose late tokens are the dearer ones). Both are spec-bandwidth times; a real
  engine reaches 70-80% of it, which scales t0 and c alike (the ratios do not change, the
  absolute tokens/s are an upper bound) and adds per-step overheads (launches, sampling,
  scheduling) to t0.
* Runs: ``--t0-floors 0,1,2``: t0 = 0 (a fixed token rate: the earlier benchmark's default
  model), t0 = the weights-read floor (**the realistic floor**, the last line), and twice it (the
  floor plus per-step overheads). ``c`` stays the same.
* Prefill (a request entering a batch): 2 FLOPs per parameter per token = 65.5 GFLOP, 8.2 per
  GPU, at 989 TFLOP/s dense bf16 (H100 and H200) and 50% MFU: 16.6 us per token (attention
  FLOPs, ~4% at 4k context, left out). A new request prefills its share of the prompt (P / G: the
  G requests of a group share the prompt's KV, SGLang's radix cache); a continued one the whole
  prefix too (the weight update flushed the cache). The decode steps wait while a prefill runs.
* ``--slots`` 192 running sequences per engine, for every engine kind (a blocking chunk is 192
  sequences: the previous benchmark's 2 chunks per engine per round); 192 x 3.0k tokens x 32 KiB
  = 18.9 GB of KV cache per GPU, which fits next to 8.2 GB of weights on an 80 GB H100.

Workload (stated assumptions, as before): response lengths log-normal, median 2500 tokens,
sigma 0.75, capped at 20480 (finish "length": overlong-filtered): mean ~3300, 1% above ~14k,
0.25% at the cap (DAPO's Qwen2.5-32B run shows means of 1k-4k+ tokens under a 20480 cap). Per
prompt accuracy p ~ Beta(0.24, 0.34), each of G = 16 samples right with probability p: 30%
all-wrong, 16% all-correct, 54% mixed groups (the healthy run of tests/diagnostics). The recipe's
ratios scaled down: 64 prompts kept per step, a window of 192 groups in flight (3x
over-sampling), G = 16, 8 engines (64 GPUs), 8 steps x 2 seeds, the same draws for every engine
kind.

Prints one table per t0 and, last:

    rollout trainable tokens/s, best over blocking chunks: X.XX

(the best streaming row over the best blocking row, at the realistic floor, seeds pooled).

    .venv/bin/python benchmarks/bench_rollout.py            # the documented run
    .venv/bin/python benchmarks/bench_rollout.py --small    # a quick smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import heapq
import io
import itertools
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from megatron_dapo.config import parse_args  # noqa: E402
from megatron_dapo.data.dataset import PromptRecord, ResumableSampler  # noqa: E402
from megatron_dapo.driver.batch import assign_advantages, optimizer_steps, training_samples  # noqa: E402
from megatron_dapo.driver.engine_pool import EnginePool, LocalTransport  # noqa: E402
from megatron_dapo.driver.rollout_manager import RolloutManager  # noqa: E402
from megatron_dapo.reward import RewardResult  # noqa: E402
from megatron_dapo.rollout.base import Finished, GenerationOutput  # noqa: E402
from megatron_dapo.training.token_weights import weigh_items  # noqa: E402

SAMPLE_BASE = 1000  # a new sample's first token: SAMPLE_BASE + 2 * sample id + correct
INF = float("inf")

# ---------------------------------------------------------------- the cost model's facts
QWEN25_32B = {"params": 32_763_876_352, "layers": 64, "kv_heads": 8, "head_dim": 128, "bytes": 2}
GPUS = {"h100": {"hbm_bytes_s": 3.35e12, "bf16_flops": 989e12}, "h200": {"hbm_bytes_s": 4.8e12, "bf16_flops": 989e12}}
TP = 8
PREFILL_MFU = 0.5


def mean_context(prompt_len: int, median: float, sigma: float, max_len: int, n: int = 200_000) -> float:
    """The context a decode step reads, averaged over the workload's decode steps: a response of
    L tokens is decoded at contexts P .. P + L - 1, so the token-weighted mean is
    P + E[L^2] / (2 E[L]) (L log-normal, capped)."""
    rng = np.random.default_rng(12345)
    L = np.minimum(np.maximum(1, np.round(median * np.exp(sigma * rng.standard_normal(n)))), max_len)
    return prompt_len + float((L * L).mean() / (2 * L.mean()))


def engine_costs(gpu: str, context: float) -> dict:
    """Seconds: ``floor`` (weights read per decode step), ``c`` (one sequence's KV read per step
    at ``context`` tokens), ``prefill`` (per prompt token), for one TP-8 engine (module doc)."""
    m, g = QWEN25_32B, GPUS[gpu]
    weights = m["params"] * m["bytes"] / TP
    kv_token = 2 * m["layers"] * m["kv_heads"] * m["head_dim"] * m["bytes"] / TP
    return {
        "floor": weights / g["hbm_bytes_s"],
        "c": context * kv_token / g["hbm_bytes_s"],
        "prefill": 2 * m["params"] / TP / (PREFILL_MFU * g["bf16_flops"]),
        "weights_gb": weights / 1e9,
        "kv_token_kib": kv_token / 1024,
    }


# ---------------------------------------------------------------------------- workload
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


class Prompts:
    """The dataset: prompt i is ``[i] + [7] * (P - 1)``."""

    def __init__(self, n: int, prompt_len: int):
        self.n, self.P = n, prompt_len

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return PromptRecord(i, [i] + [7] * (self.P - 1), f"p{i}", "x")


# --------------------------------------------------------------------------- the engines
class _Req:
    __slots__ = ("rid", "prompt_ids", "ids", "fin", "s0", "n")


class Sim:
    """The virtual clock shared by the engines; ``decoded``: every token decoded, kept or not."""

    EPS = 1e-9

    def __init__(self, work: Workload, prompt_len: int, group: int, t0: float, c: float, prefill: float):
        self.work, self.P, self.G = work, prompt_len, group
        self.t0, self.c, self.prefill = t0, c, prefill
        self.now = 0.0
        self.engines = []
        self.decoded = 0
        self.draining = False  # an abort waits for running requests: no engine admits meanwhile

    def step(self) -> bool:
        """Process the earliest event of any engine (every engine's event at that time); False
        when nothing is running or waiting."""
        t = min((e.next_event() for e in self.engines), default=INF)
        if t == INF:
            return False
        self.now = max(self.now, t)
        for e in self.engines:
            if e.next_event() <= t + self.EPS * max(1.0, t):
                e.process(self.now)
        return True

    def advance(self) -> None:
        """Until some engine has an ended request to hand back (or nothing runs)."""
        while not any(e.out for e in self.engines):
            if not self.step():
                return

    def response(self, prompt_ids: list, max_new: int):
        """(token ids, finish reason) of the whole rest of a request's sample (module doc)."""
        P, work = self.P, self.work
        if len(prompt_ids) == P:  # a new sample
            sid, prefix = work.new_sample(prompt_ids[0]), 0
        else:  # prompt + prefix: the sample the prefix's first token names
            sid, prefix = (prompt_ids[P] - SAMPLE_BASE) // 2, len(prompt_ids) - P
        length, correct = work.samples[sid]
        n = max(1, min(length - prefix, max_new))
        ids = ([SAMPLE_BASE + 2 * sid + int(correct)] if prefix == 0 else [7]) + [7] * (n - 1)
        if prefix + n >= length:
            fin = "stop" if length < work.max_len else "length"
        else:
            fin = "length"  # cut at max_new_tokens
        return ids, fin


class SimEngine:
    """One engine on the :class:`Sim` clock (module doc). State: the current decode stretch
    starts at ``T0`` with ``S0`` steps done and a step every ``dt``; a running request admitted at
    step ``s0`` with ``n`` tokens to go ends at step ``s0 + n``."""

    def __init__(self, sim: Sim, slots: int, blocking: bool, abortable: bool):
        self.sim, self.slots, self.blocking, self.abortable = sim, slots, blocking, abortable
        self.T0, self.S0, self.dt = 0.0, 0, 0.0
        self.running = {}  # rid -> _Req
        self.heap = []  # (end step, seq, rid)
        self.waiting = []  # (request, submitted at)
        self.held = []  # blocking: ended, held until the chunk's last request ends
        self.out = []  # ended, not handed to the pool yet
        self.seq = itertools.count()
        sim.engines.append(self)

    # -- the streaming interface (rollout/base.py) --
    def submit(self, requests) -> None:
        for r in requests:
            self.waiting.append((r, self.sim.now))

    def poll(self, timeout_s) -> list:
        self.sim.advance()
        out, self.out = self.out, []
        return out

    def abort_requests(self, rids=None) -> list:
        want = None if rids is None else set(rids)
        hit = (lambda rid: True) if want is None else (lambda rid: rid in want)
        now, out = self.sim.now, []
        for r, _ in [w for w in self.waiting if hit(w[0].rid)]:  # never started
            out.append(Finished(r.rid, GenerationOutput(list(r.prompt_ids), [], [], "abort"), now))
        self.waiting = [w for w in self.waiting if not hit(w[0].rid)]
        targets = [rid for rid in self.running if hit(rid)]
        if self.abortable:
            S = self.steps_at(now)
            for rid in targets:
                q = self.running.pop(rid)
                k = max(0, min(S - q.s0, q.n - 1))
                self.sim.decoded += k
                out.append(Finished(rid, GenerationOutput(list(q.prompt_ids), q.ids[:k], [-0.5] * k, "abort"), now))
            self.S0, self.T0, self.dt = S, max(self.T0, now), self._dt()
        else:  # the requests run to their end (a chunk: to the chunk's end); the pool aborts every
            # engine at this instant, so no engine starts a waiting request meanwhile
            self.sim.draining = True
            try:
                while any(rid in self.running for rid in targets) or any(hit(f.rid) for f in self.held):
                    if not self.sim.step():
                        break
            finally:
                self.sim.draining = False
        out += [f for f in self.held + self.out if hit(f.rid)]
        self.held = [f for f in self.held if not hit(f.rid)]
        self.out = [f for f in self.out if not hit(f.rid)]
        return out

    # -- the clock --
    def _dt(self) -> float:
        return self.sim.t0 + self.sim.c * len(self.running)

    def steps_at(self, t: float) -> int:
        if not self.running or t <= self.T0:
            return self.S0
        return self.S0 + int(math.floor((t - self.T0) / self.dt + 1e-6))

    def _first_end(self):
        while self.heap and self.heap[0][2] not in self.running:
            heapq.heappop(self.heap)  # aborted
        return self.heap[0][0] if self.heap else None

    def _room(self) -> bool:
        if self.sim.draining:
            return False
        if self.blocking:
            return not self.running and not self.held
        return len(self.running) < self.slots

    def next_event(self) -> float:
        t = INF
        end = self._first_end() if self.running else None
        if end is not None:
            t = self.T0 + (end - self.S0) * self.dt
        if self.waiting and self._room():
            since = self.waiting[0][1]
            if not self.running:
                t = min(t, max(self.T0, since))
            else:  # the next step boundary
                k = max(0, math.ceil((since - self.T0) / self.dt - 1e-6))
                t = min(t, self.T0 + k * self.dt)
        return t

    def process(self, t: float) -> None:
        """The event at ``t``: requests ending at this step boundary, else admissions."""
        end = self._first_end() if self.running else None
        if end is not None and self.T0 + (end - self.S0) * self.dt <= t + Sim.EPS * max(1.0, t):
            while self.heap and (self.heap[0][0] <= end or self.heap[0][2] not in self.running):
                _, _, rid = heapq.heappop(self.heap)
                q = self.running.pop(rid, None)
                if q is None:
                    continue
                self.sim.decoded += q.n
                f = Finished(rid, GenerationOutput(list(q.prompt_ids), q.ids, [-0.5] * q.n, q.fin), t)
                (self.held if self.blocking else self.out).append(f)
            if self.blocking and not self.running:
                self.out += self.held
                self.held = []
            self.S0, self.T0, self.dt = end, t, self._dt()
            return
        S = self.steps_at(t)
        prefill = 0.0
        while self.waiting and self._room_for_one():
            r, _ = self.waiting.pop(0)
            q = _Req()
            q.rid, q.prompt_ids, q.s0 = r.rid, r.prompt_ids, S
            q.ids, q.fin = self.sim.response(r.prompt_ids, r.params.max_new_tokens)
            q.n = len(q.ids)
            self.running[q.rid] = q
            heapq.heappush(self.heap, (S + q.n, next(self.seq), q.rid))
            prefill += self.sim.P / self.sim.G + (len(r.prompt_ids) - self.sim.P)
        self.S0, self.T0 = S, t + prefill * self.sim.prefill
        self.dt = self._dt()

    def _room_for_one(self) -> bool:
        return len(self.running) < self.slots  # a blocking engine admits only when empty (_room)


# ------------------------------------------------------------------------- the run
class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return str(ids[0]) if ids else ""


class Scorer:
    """Right when the first response token says so (the workload decided it)."""

    def score(self, items):
        out = []
        for x in items:
            ok = bool(x.response) and bool((int(x.response) - SAMPLE_BASE) % 2)
            out.append(RewardResult(1.0 if ok else -1.0, ok, "", "ok"))
        return out


#: (row name, blocking engine, abortable, --partial-rollout-offpolicy or None)
KINDS = [
    ("blocking chunks", True, False, None),
    ("blocking chunks, abort at the instant", True, True, None),
    ("blocking chunks, abort + partial (mask)", True, True, "mask"),
    ("streaming", False, False, None),
    ("streaming + early abort", False, True, None),
    ("streaming + early abort + partial (mask)", False, True, "mask"),
    ("streaming + early abort + partial (correct)", False, True, "correct"),
]


def trainable_tokens(samples: list, algo, offpolicy, check: int = 4) -> int:
    """The tokens the trainer keeps in the loss: ``weigh_items``' ``weights.keep`` (the engine
    logprobs stand for the old ones: ratio 1, so no ``--tis-mode`` rejection). Counted by the
    rule of ``algo.tis.loss_token_weights`` (an overlong-filtered response: none; under
    ``--partial-rollout-offpolicy mask`` the first ``stale_len`` tokens: none; else every token),
    and the first ``check`` samples (and every entirely stale one) through ``weigh_items``
    itself, which must agree (the whole list through it costs minutes per run)."""

    def rule(s):
        n = len(s.response_ids)
        if not s.train:
            return 0
        return n - min(int(s.stale_len), n) if offpolicy == "mask" else n

    def weighed(batch):
        items = [dataclasses.replace(s.to_item(), old_logprobs=list(s.engine_logprobs)) for s in batch]
        return [
            int(float(y.weights.keep.sum())) if y.weights is not None else 0
            for y in weigh_items(items, algo, offpolicy)
        ]

    if algo.tis_mode not in ("none", "token-truncate"):  # a mask mode could reject: weigh every sample
        return sum(weighed(samples))
    stale = [s for s in samples[check:] if s.response_ids and s.stale_len >= len(s.response_ids)]
    probe = samples[:check] + stale[:check]
    got, want = weighed(probe), [rule(s) for s in probe]
    if got != want:
        raise AssertionError(f"trainable tokens by the rule {want} differ from the trainer's weights {got}")
    return sum(rule(s) for s in samples)


def run(args, seed: int, kind: tuple, costs: dict, t0: float) -> dict:
    _, blocking, abortable, offpolicy = kind
    argv = [
        "--rollout-batch-size",
        str(args.batch),
        "--n-samples-per-prompt",
        str(args.group),
        "--over-sampling-batch-size",
        str(args.batch * args.over_sampling),
        "--global-batch-size",
        str(args.batch),
        "--max-response-length",
        str(args.max_len),
        "--overlong-buffer-length",
        str(min(4096, args.max_len // 4)),
        "--max-num-gen-batches",
        "1000",
        "--partial-rollout",
        "true" if offpolicy else "false",
        "--no-progress",
    ]
    if offpolicy:
        argv += ["--partial-rollout-offpolicy", offpolicy]
    cfg = parse_args(argv)
    n_prompts = args.batch * args.over_sampling * (args.steps + 4) * 4
    work = Workload(n_prompts, seed, args.length_median, args.length_sigma, args.max_len, 0.24, 0.34)
    sim = Sim(work, args.prompt_len, args.group, t0, costs["c"], costs["prefill"])
    engines = [SimEngine(sim, args.slots, blocking, abortable) for _ in range(args.engines)]
    pool = EnginePool(
        lambda i: engines[i], len(engines), lambda handles: None, timeout_s=1e9, transport=LocalTransport()
    )
    pool.clock = lambda: sim.now
    mgr = RolloutManager(
        cfg,
        Prompts(n_prompts, args.prompt_len),
        ResumableSampler(n_prompts, seed=seed, shuffle=True),
        pool,
        Scorer(),
        Tok(),
    )
    tot = {"time": 0.0, "trainable": 0, "kept_tokens": 0, "kept": 0, "left_out": 0}
    for step in range(1, args.steps + 1):
        with contextlib.redirect_stdout(io.StringIO()):  # the manager's "[rollout] ... round k" lines
            res = mgr.collect(step)
        samples = assign_advantages(res.groups, cfg.algo)
        train, left = training_samples(samples, optimizer_steps(cfg), 1, offpolicy)
        tot["trainable"] += trainable_tokens(train, cfg.algo, offpolicy)
        tot["kept_tokens"] += sum(len(s.response_ids) for s in samples)
        tot["kept"] += len(samples)
        tot["left_out"] += left + res.untrainable_samples  # + mixed groups not kept: entirely stale (mask)
        tot["kept"] += res.untrainable_samples
    tot["time"] = sim.now
    tot["decoded"] = sim.decoded
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64, help="rollout batch (prompts kept per step)")
    ap.add_argument("--over-sampling", type=int, default=3, help="groups in flight = batch x this")
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--slots", type=int, default=192, help="running sequences per engine (a blocking chunk's size)")
    ap.add_argument("--max-len", type=int, default=20480)
    ap.add_argument("--prompt-len", type=int, default=200)
    ap.add_argument("--length-median", type=float, default=2500.0)
    ap.add_argument("--length-sigma", type=float, default=0.75)
    ap.add_argument("--gpu", choices=sorted(GPUS), default="h100")
    ap.add_argument("--t0-floors", default="0,1,2", help="t0 values, in multiples of the weights-read floor")
    ap.add_argument("--realistic", type=float, default=1.0, help="the t0 (in floors) of the last line")
    ap.add_argument("--small", action="store_true", help="a quick smoke run")
    args = ap.parse_args(argv)
    if args.small:
        args.seeds, args.steps, args.batch, args.group, args.engines, args.slots = 1, 3, 8, 4, 2, 16
        args.max_len, args.length_median, args.prompt_len = 512, 64.0, 16
    floors = [float(x) for x in args.t0_floors.split(",")]
    if args.realistic not in floors:
        ap.error(f"--realistic {args.realistic} is not one of --t0-floors {args.t0_floors}")
    ctx = mean_context(args.prompt_len, args.length_median, args.length_sigma, args.max_len)
    costs = engine_costs(args.gpu, ctx)
    gpus = args.engines * TP
    print(
        f"Qwen2.5-32B, TP {TP}, {args.gpu.upper()}: weights {costs['weights_gb']:.2f} GB per GPU per decode step "
        f"-> floor {costs['floor'] * 1e3:.2f} ms; KV {costs['kv_token_kib']:.0f} KiB per token per GPU x mean "
        f"context {ctx:.0f} -> c {costs['c'] * 1e6:.1f} us (floor = {costs['floor'] / costs['c']:.0f} c); prefill "
        f"{costs['prefill'] * 1e6:.1f} us per token; {args.engines} engines = {gpus} GPUs, {args.slots} slots each",
        flush=True,
    )
    best = {}
    for mult in floors:
        t0 = mult * costs["floor"]
        print(
            f"\nt0 = {mult:g} x floor = {t0 * 1e3:.2f} ms, c = {costs['c'] * 1e6:.1f} us "
            f"({args.seeds} seed(s) x {args.steps} steps pooled)"
        )
        print(
            f"{'engine':<46} {'trainable tok/s':>15} {'per GPU-s':>10} {'decoded/trainable':>17} "
            f"{'untrainable':>11} {'vs best blocking':>16}"
        )
        rows = []
        for kind in KINDS:
            acc = {}
            for seed in range(args.seeds):
                for k, v in run(args, seed, kind, costs, t0).items():
                    acc[k] = acc.get(k, 0) + v
            rows.append((kind, acc))
        rate = {kind[0]: acc["trainable"] / acc["time"] for kind, acc in rows}
        base = max(rate[k[0]] for k in KINDS if k[1])
        for kind, acc in rows:
            name = kind[0]
            print(
                f"{name:<46} {rate[name]:>15.0f} {rate[name] / gpus:>10.1f} "
                f"{acc['decoded'] / max(acc['trainable'], 1):>17.2f} {acc['left_out'] / acc['kept']:>11.1%} "
                f"{rate[name] / base:>16.2f}",
                flush=True,
            )
        best[mult] = max(rate[k[0]] for k in KINDS if not k[1]) / base
        print(f"best streaming over best blocking at t0 = {mult:g} x floor: {best[mult]:.2f}", flush=True)
    print(f"rollout trainable tokens/s, best over blocking chunks: {best[args.realistic]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
