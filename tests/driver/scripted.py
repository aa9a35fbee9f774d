"""Scripted streaming engines for the rollout-manager tests (no model, no Ray).

``ScriptedEngine`` implements the engines' streaming interface (``submit`` / ``poll`` /
``abort_requests``, rollout/base.py) on a step clock: every ``poll`` is one decode step, in
which each running request gets one token of its scripted response; a request whose response
is complete ends then (finish reason as scripted, ``finished_at`` = the step number). At most
``slots`` requests run at once, the others wait in submission order. ``abort_requests`` returns
the running requests with the tokens they have so far (finish "abort") and the waiting ones
empty. The manager drives it through a real ``EnginePool`` (``LocalTransport``).
"""

from __future__ import annotations

from megatron_dapo.driver.engine_pool import EnginePool, LocalTransport
from megatron_dapo.reward import RewardResult
from megatron_dapo.rollout.base import Finished, GenerationOutput


class Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(i) for i in ids)


def sample_index(rid: str) -> int:
    """The sample index j of a request (the manager's request ids are ``<group id>.<j>``)."""
    return int(rid.split(".")[1])


class ScriptedEngine:
    def __init__(self, respond, slots: int = 10**9, clock=None):
        """``respond(request) -> (token ids, finish reason)``: the whole response (at most
        ``params.max_new_tokens`` tokens are used; more ends with "length")."""
        self.respond, self.slots = respond, slots
        self.clock = clock if clock is not None else [0]  # shared by the engines of a pool
        self.waiting, self.running, self.done = [], [], []
        self.seen = []  # every request, in submission order

    def submit(self, requests):
        for r in requests:
            assert r.params.n == 1
            self.seen.append(r)
            self.waiting.append(r)

    def _start(self):
        while self.waiting and len(self.running) < self.slots:
            r = self.waiting.pop(0)
            ids, fin = self.respond(r)
            if len(ids) > r.params.max_new_tokens:
                ids, fin = ids[: r.params.max_new_tokens], "length"
            self.running.append([r, list(ids), fin, 0])

    def poll(self, timeout_s):
        self._start()
        if self.running:
            self.clock[0] += 1
        still = []
        for item in self.running:
            r, ids, fin, n = item
            item[3] = n = min(n + 1, len(ids))
            if n == len(ids):
                self.done.append(self._out(r, ids, fin))
            else:
                still.append(item)
        self.running = still
        out, self.done = self.done, []
        return out

    def _out(self, r, ids, fin):
        return Finished(
            r.rid, GenerationOutput(list(r.prompt_ids), list(ids), [-0.5] * len(ids), fin), float(self.clock[0])
        )

    def abort_requests(self, rids=None):
        want = None if rids is None else set(rids)
        out = []
        keep = []
        for r, ids, fin, n in self.running:
            if want is None or r.rid in want:
                out.append(self._out(r, ids[:n], "abort"))
            else:
                keep.append([r, ids, fin, n])
        self.running = keep
        for r in list(self.waiting):
            if want is None or r.rid in want:
                self.waiting.remove(r)
                out.append(self._out(r, [], "abort"))
        return out


def local_pool(engines) -> EnginePool:
    """A real EnginePool over in-process engines; its clock is the engines' step clock."""
    pool = EnginePool(
        lambda i: engines[i], len(engines), lambda handles: None, timeout_s=60.0, transport=LocalTransport()
    )
    clock = getattr(engines[0], "clock", None)
    if clock is not None:
        pool.clock = lambda: float(clock[0])
    return pool


class Scorer:
    """Right when the response starts with token 1."""

    def __init__(self):
        self.calls = 0

    def score(self, items):
        self.calls += 1
        return [
            RewardResult(
                1.0 if x.response.split(" ")[0] == "1" else -1.0, x.response.split(" ")[0] == "1", x.response[:1], "ok"
            )
            for x in items
        ]
