"""Asynchronous DAPO, simulated: trainable tokens/s per GPU of colocated synchronous, one-step-off
and bounded-staleness (k = 1, 2, 4) training on the same GPU count (issue 40).

A discrete-event simulation at the level of sequences. Each engine decodes by continuous
batching: all of its active sequences advance one token per decode step of ``t0 + a * c``
seconds (``c`` active sequences, at most ``max_concurrency``); a sequence that starts pays a
prefill of ``prefill_s_per_token`` per prompt token, during which the engine decodes nothing.
An event is a sequence ending (so a round of 15k sequences is 15k events, not 60M tokens).

* Workload (DAPO's): 512 prompt groups x 16 responses per step; response lengths log-normal,
  median 2500 tokens, sigma 0.9, cut at the 20480-token cap (mean about 3.7k, about 1% at the
  cap); prompts 250 tokens; a group is kept by dynamic sampling with probability 0.55 (mixed
  correctness), decided when its last response ends; a step trains the 512 first kept groups.
  Trainable tokens = the response tokens of the trained groups.
* Colocated synchronous: every GPU generates (engines of TP ``engine_tp``) until 512 groups are
  kept (the rest of the round is aborted), then the switch to training (engine memory released,
  trainer onloaded), training at ``train_tokens_per_s_per_gpu`` on every GPU (forward for the
  old logprobs + forward/backward), the weight sync, the switch back.
* One-step-off (disaggregated): ``R`` GPUs generate the batch of step n+1 with the weights of
  step n-1 while the other ``N - R`` train step n; then the weights are broadcast (engines
  paused ``broadcast_s``). Every sample is one version old.
* Bounded k (disaggregated, continuous): engines generate without rounds into a queue (a new
  group starts whenever a slot is free, while fewer than ``(k + 1) x 512`` kept groups are
  queued or expected from those in flight); the trainer takes the 512 oldest admissible
  groups (``algo.staleness.admit``: the oldest token at most k versions behind), drops
  inadmissible ones (their tokens are wasted), trains, broadcasts (engines pause, in-flight
  requests kept: their next tokens are of the new version). Staleness = versions between the
  trainer and the group's oldest token.

Every disaggregated mode is tried at each rollout share ``R`` (multiples of the engine size)
and the best is reported. Costs per model (H100, bf16; assumptions, stated so they can be
argued with): see ``MODELS``. Prints a table per model, then
``async trainable tokens/s per GPU, best over colocated sync: X.XX`` last: for each model the
best async mode over its colocated synchronous run, the smaller of the two models' ratios.

    .venv/bin/python benchmarks/bench_async.py            # the documented run (about a minute)

"dropped": kept groups that became too old in the queue before a batch took them, as a share
of the tokens trained (they are regenerated).
    .venv/bin/python benchmarks/bench_async.py --steps 2  # quicker
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import math
import os
import random
import sys
from collections import Counter, deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron_dapo.algo.staleness import admit  # noqa: E402 - after the sys.path line


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    gpus: int
    engine_tp: int  # GPUs per engine
    t0: float  # s per decode step of an engine, fixed part (weights read)
    a: float  # s per decode step per active sequence (its KV cache read)
    max_concurrency: int  # sequences an engine holds at once (KV memory)
    prefill_s_per_token: float
    train_tokens_per_s_per_gpu: float  # old-logprob forward + forward/backward, per trainer GPU
    switch_s: float  # colocated: release the engines' memory and onload the trainer, and back
    colocated_sync_s: float  # colocated: the resharding weight sync
    broadcast_s: float  # disaggregated: the broadcast to busy engines (engines paused)


MODELS = (
    # Qwen2.5-32B: 64 GB of bf16 weights, KV 256 kB/token (64 layers x 8 KV heads x 128 x 2 x 2 B);
    # TP 4 engines: a weights read ~16 GB/GPU at ~3 TB/s (+ launch overheads) ~ 22 ms, a 4k-token
    # context ~ 1 GB over 4 GPUs ~ 0.08 ms; training 6 x 32e9 FLOP/token fwd+bwd + 2 x 32e9 forward
    # at 40% of 989 TFLOP/s ~ 1.5k tokens/s/GPU; switches and sync as slime and verl report.
    Model("Qwen2.5-32B (dense)", 128, 4, 0.022, 0.00008, 192, 0.00002, 1500.0, 20.0, 6.0, 4.0),
    # Qwen3-30B-A3B: 3.3B active; TP 2 engines (61 GB of weights, KV 96 kB/token); decode ~12 ms
    # + 0.04 ms per sequence; training 8 x 3.3e9 FLOP/token at 12% MFU (MoE) ~ 4.5k tokens/s/GPU.
    Model("Qwen3-30B-A3B (MoE)", 128, 2, 0.012, 0.00004, 256, 0.00001, 4500.0, 20.0, 4.0, 3.0),
)
GROUPS, G, PROMPT = 512, 16, 250
KEEP_P, MEDIAN, SIGMA, CAP = 0.55, 2500.0, 0.9, 20480


class Workload:
    """Prompt groups in the order the sampler would hand them out (the same draws for every mode)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.made = 0

    def group(self) -> tuple[list[int], bool]:
        self.made += 1
        lengths = [min(CAP, max(16, int(self.rng.lognormvariate(math.log(MEDIAN), SIGMA)))) for _ in range(G)]
        return lengths, self.rng.random() < KEEP_P


class Engine:
    """Continuous batching: all active sequences advance together, one token per decode step."""

    def __init__(self, m: Model):
        self.m = m
        self.active: list = []  # heap of (progress at which it ends, seq id)
        self.progress = 0.0  # tokens every active sequence has made since this engine began
        self.t = 0.0  # the time ``progress`` is accounted to
        self.version = 0

    def dt(self) -> float:
        return self.m.t0 + self.m.a * len(self.active)

    def advance(self, now: float) -> None:
        if self.active and now > self.t:
            self.progress += (now - self.t) / self.dt()
        self.t = max(self.t, now)

    def start(self, now: float, sid: int, length: int) -> None:
        self.advance(now)
        self.t += PROMPT * self.m.prefill_s_per_token  # prefill: no decoding meanwhile
        heapq.heappush(self.active, (self.progress + length, sid))

    def next_end(self) -> float:
        if not self.active:
            return math.inf
        return self.t + max(0.0, self.active[0][0] - self.progress) * self.dt()

    def pop_end(self) -> int:
        end = self.next_end()
        self.advance(end)
        self.progress = max(self.progress, self.active[0][0])
        return heapq.heappop(self.active)[1]

    def pause(self, now: float, seconds: float) -> None:
        self.advance(now)
        self.t = now + seconds


class Gen:
    """The engines and the groups in flight; :meth:`step` plays their next event in time order
    (a heap of each engine's next sequence end, re-stamped whenever that engine changes)."""

    def __init__(self, m: Model, engines: int, work: Workload):
        self.m, self.work = m, work
        self.engines = [Engine(m) for _ in range(engines)]
        self.stamp = [0] * engines
        self.events: list = []  # (time, engine, stamp)
        self.seqs: dict[int, int] = {}  # sid -> group id
        self.groups: dict[int, dict] = {}
        self.pending: deque = deque()  # (gid, length) not yet started
        self.next_sid = 0
        self.now = 0.0

    def _changed(self, i: int) -> None:
        self.stamp[i] += 1
        t = self.engines[i].next_end()
        if t < math.inf:
            heapq.heappush(self.events, (t, i, self.stamp[i]))

    def next_time(self) -> float:
        while self.events and self.events[0][2] != self.stamp[self.events[0][1]]:
            heapq.heappop(self.events)
        return self.events[0][0] if self.events else math.inf

    def free_slots(self) -> int:
        return sum(self.m.max_concurrency - len(e.active) for e in self.engines)

    def add_group(self, gid: int) -> None:
        lengths, kept = self.work.group()
        self.groups[gid] = {"left": G, "lengths": lengths, "kept": kept, "oldest": None}
        self.pending.extend((gid, length) for length in lengths)

    def fill(self) -> None:
        """Start pending sequences on the least busy engines."""
        while self.pending:
            i = min(range(len(self.engines)), key=lambda j: len(self.engines[j].active))
            e = self.engines[i]
            if len(e.active) >= self.m.max_concurrency:
                return
            gid, length = self.pending.popleft()
            e.start(self.now, self.next_sid, length)
            self.seqs[self.next_sid] = gid
            self.next_sid += 1
            g = self.groups[gid]
            g["oldest"] = e.version if g["oldest"] is None else min(g["oldest"], e.version)
            self._changed(i)

    def step(self) -> int | None:
        """Play the next sequence end (``now`` moves to it); the group it completed, or None."""
        if self.next_time() == math.inf:
            raise RuntimeError("no sequence in flight")
        t, i, _ = heapq.heappop(self.events)
        self.now = t
        sid = self.engines[i].pop_end()
        self._changed(i)
        gid = self.seqs.pop(sid)
        g = self.groups[gid]
        g["left"] -= 1
        return gid if g["left"] == 0 else None

    def pause(self, seconds: float, version: int) -> None:
        for i, e in enumerate(self.engines):
            e.pause(self.now, seconds)
            e.version = version
            self._changed(i)


def _round(m: Model, engines: int, work: Workload) -> tuple[float, int]:
    """One synchronous generation round from idle engines: (seconds, trainable tokens) until
    GROUPS groups are kept; the groups still in flight then are aborted."""
    gen = Gen(m, engines, work)
    gid, kept, tokens = 0, 0, 0
    while kept < GROUPS:
        while not gen.pending and gen.free_slots() >= G:  # streaming over-sampling: keep every slot busy
            gen.add_group(gid)
            gid += 1
            gen.fill()
        gen.fill()
        done = gen.step()
        if done is not None:
            g = gen.groups.pop(done)
            if g["kept"]:
                kept += 1
                tokens += sum(g["lengths"])
    return gen.now, tokens


def colocated_sync(m: Model, steps: int, seed: int) -> dict:
    work = Workload(seed)
    engines = m.gpus // m.engine_tp
    total_t, total_tok = 0.0, 0
    for _ in range(steps):
        gen_s, tokens = _round(m, engines, work)
        train_s = tokens / (m.train_tokens_per_s_per_gpu * m.gpus)
        total_t += gen_s + m.switch_s + train_s + m.colocated_sync_s
        total_tok += tokens
    return {"tps": total_tok / total_t / m.gpus, "stale": Counter({0: steps * GROUPS}), "split": f"{m.gpus} shared"}


def one_step_off(m: Model, rollout_gpus: int, steps: int, seed: int) -> dict:
    work = Workload(seed)
    engines, trainers = rollout_gpus // m.engine_tp, m.gpus - rollout_gpus
    gens = [_round(m, engines, work) for _ in range(steps + 1)]
    total_t, total_tok = 0.0, 0  # from the end of the first round (which overlaps nothing) on
    for n in range(steps):
        train_s = gens[n][1] / (m.train_tokens_per_s_per_gpu * trainers)
        total_t += max(gens[n + 1][0], train_s) + m.broadcast_s
        total_tok += gens[n][1]
    split = f"{rollout_gpus}+{trainers}"
    return {"tps": total_tok / total_t / m.gpus, "stale": Counter({1: steps * GROUPS}), "split": split}


def bounded(m: Model, k: int, rollout_gpus: int, steps: int, seed: int) -> dict:
    work = Workload(seed)
    engines, trainers = rollout_gpus // m.engine_tp, m.gpus - rollout_gpus
    gen = Gen(m, engines, work)
    queue: deque = deque()  # (oldest version, tokens) of kept groups, in completion order
    version, train_end, batch_tok, batch_lags = 0, math.inf, 0, []
    trained_tok, stale, wasted = 0, Counter(), 0
    done_steps, gid, inflight = 0, 0, 0
    warm_t = warm_tok = 0.0
    while done_steps < steps + 1:
        while not gen.pending and gen.free_slots() >= G and len(queue) + inflight * KEEP_P < (k + 1) * GROUPS:
            gen.add_group(gid)
            gid += 1
            inflight += 1
            gen.fill()
        gen.fill()
        if train_end <= gen.next_time():
            gen.now = train_end
            version += 1
            gen.pause(m.broadcast_s, version)  # in-flight requests kept: their next tokens are new
            trained_tok += batch_tok
            if done_steps >= 1:  # the first step fills the pipeline: counted in nothing
                stale.update(batch_lags)
            done_steps += 1
            if done_steps == 1:
                warm_t, warm_tok = train_end, trained_tok  # the first step fills the pipeline
            train_end = math.inf
        else:
            done = gen.step()
            if done is not None:
                inflight -= 1
                g = gen.groups.pop(done)
                if g["kept"]:
                    queue.append((g["oldest"], sum(g["lengths"])))
        if train_end == math.inf and len(queue) >= GROUPS:
            fresh = deque(g for g in queue if admit(g[0], version, k))
            wasted += sum(t for v, t in queue if not admit(v, version, k))  # too old: regenerated, wasted
            queue = fresh
            if len(queue) >= GROUPS:
                batch = [queue.popleft() for _ in range(GROUPS)]
                batch_lags = [version - v for v, _ in batch]
                batch_tok = sum(t for _, t in batch)
                train_end = gen.now + batch_tok / (m.train_tokens_per_s_per_gpu * trainers)
    tps = (trained_tok - warm_tok) / (gen.now - warm_t) / m.gpus
    split = f"{rollout_gpus}+{trainers}"
    return {"tps": tps, "stale": stale, "split": split, "wasted": wasted, "trained": trained_tok}


def _stale_text(c: Counter) -> str:
    n = sum(c.values())
    return " ".join(f"{lag}:{c[lag] / n:.0%}" for lag in sorted(c))


def run(m: Model, steps: int, seed: int) -> list:
    rows = [("colocated sync", colocated_sync(m, steps, seed))]
    shares = [m.gpus * i // 8 for i in (3, 4, 5, 6) if m.gpus * i // 8 % m.engine_tp == 0]
    rows.append(("one-step-off", max((one_step_off(m, r, steps, seed) for r in shares), key=lambda x: x["tps"])))
    for k in (1, 2, 4):
        rows.append((f"bounded k={k}", max((bounded(m, k, r, steps, seed) for r in shares), key=lambda x: x["tps"])))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4, help="training steps simulated per mode and split")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ratios = []
    for m in MODELS:
        rows = run(m, args.steps, args.seed)
        base = rows[0][1]["tps"]
        print(f"\n{m.name}: {m.gpus} GPUs, engines of TP {m.engine_tp}, {args.steps} steps")
        print(
            f"{'mode':16s} {'GPUs (rollout+train)':>21s} {'tokens/s/GPU':>13s} {'x sync':>7s} {'dropped':>8s}  "
            "staleness of trained samples"
        )
        for name, r in rows:
            dropped = f"{r['wasted'] / r['trained']:.1%}" if r.get("trained") else "-"
            print(
                f"{name:16s} {r['split']:>21s} {r['tps']:13.1f} {r['tps'] / base:7.2f} {dropped:>8s}  "
                f"{_stale_text(r['stale'])}"
            )
        best = max(r["tps"] for _, r in rows[1:]) / base
        ratios.append(best)
        print(f"{m.name}: best async over colocated sync {best:.2f}")
    print(f"\nasync trainable tokens/s per GPU, best over colocated sync: {min(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
