"""EnginePool: the rollout engines behind one streaming interface, with restart-on-failure.

The rollout manager talks to every engine kind (HFEngine on CPU, SGLangEngine on GPU) the same
way, through this pool (docs/rollout.md, "Streaming"):

* ``submit(requests)``: each group's requests (``Request.group``) go to the engine with the
  fewest outstanding requests (one call per engine);
* ``wait(timeout_s)``: the requests that ended, as soon as any engine reports one: every engine
  with outstanding requests has one ``poll`` call in flight; [] after ``timeout_s``;
* ``abort(rids=None)``: stop the outstanding requests (all by default) and return them, the
  running ones with their prefixes (finish reason "abort").

An engine that dies, or whose ``poll`` does not answer within ``--engine-timeout-s``, is
restarted (``make_engine(i)``), gets the trainer's current weights (``resync``), and its
outstanding requests are submitted to it again from their prompts; the other engines' running
requests are stopped before the re-sync and submitted again after it (:meth:`EnginePool._restart`).

The calls go through a transport: ``RayTransport`` (EngineActor handles, the driver) or
``LocalTransport`` (engine objects in this process, called synchronously: tests, tools).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from typing import Callable, Dict, List, Optional

from ..rollout.base import Finished, GenerationOutput, Request

log = logging.getLogger(__name__)

#: How long one engine-side ``poll`` waits (HFEngine: generates) for a request to end.
POLL_S = 1.0


class _Done:
    """A finished call of LocalTransport."""

    def __init__(self, value=None, error: Optional[BaseException] = None):
        self.value, self.error = value, error


class LocalTransport:
    """Engine objects in this process: a call runs at once; nothing dies or times out."""

    dead: tuple = ()

    def call(self, handle, method: str, *args):
        try:
            return _Done(getattr(handle, method)(*args))
        except Exception as e:  # noqa: BLE001 - re-raised by get()
            return _Done(error=e)

    def ready(self, futures: list, timeout_s: float) -> list:
        return list(futures)

    def get(self, future, timeout_s: Optional[float] = None):
        if future.error is not None:
            raise future.error
        return future.value

    def kill(self, handle) -> None:
        pass

    def kill_process(self, handle) -> None:
        raise RuntimeError("--debug-kill-engine-step needs engines in their own processes (Ray)")


class RayTransport:
    """EngineActor handles (megatron_dapo.driver.actors)."""

    def __init__(self):
        from ray.exceptions import (  # Ray: not at import time (train.py imports this module)
            GetTimeoutError,
            RayActorError,
        )

        self.dead = (RayActorError, GetTimeoutError)

    def call(self, handle, method: str, *args):
        return getattr(handle, method).remote(*args)

    def ready(self, futures: list, timeout_s: float) -> list:
        import ray  # lazy: Ray

        if not futures:
            return []
        first, rest = ray.wait(futures, num_returns=1, timeout=timeout_s)
        if first and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            first = first + more
        return first

    def get(self, future, timeout_s: Optional[float] = None):
        import ray  # lazy: Ray

        return ray.get(future, timeout=timeout_s)

    def kill(self, handle) -> None:
        import ray  # lazy: Ray

        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def kill_process(self, handle) -> None:
        import ray  # lazy: Ray

        pid, what = ray.get(handle.innermost_pid.remote())
        log.warning("--debug-kill-engine-step: SIGKILL to the engine's %s, pid %d", what, pid)
        os.kill(pid, signal.SIGKILL)


class EnginePool:
    """``make_engine(i)`` builds engine i (a handle of the transport); ``resync(handles)``
    pushes the current trainer weights into new engines. ``pause_others_on_restart``: whether a
    restart stops the other engines' requests first (their KV cache may be released by the
    re-sync); False where the re-sync leaves them alone (asynchronous training on engines that
    keep their memory): they keep generating while the dead one restarts."""

    clock = staticmethod(time.time)  # the time base of Finished.finished_at and the manager's stamps

    def __init__(
        self,
        make_engine: Callable,
        num_engines: int,
        resync: Callable,
        timeout_s: float,
        transport=None,
        pause_others_on_restart: bool = True,
    ):
        self.make_engine, self.resync, self.timeout_s = make_engine, resync, timeout_s
        self.pause_others_on_restart = pause_others_on_restart
        self.transport = transport if transport is not None else RayTransport()
        self.handles = [make_engine(i) for i in range(num_engines)]
        self.restarts = 0
        self.resent = 0  # requests started again from their prompts after a restart (the in-flight work lost)
        self.kill_next_generation = False  # testing: SIGKILL engine 0 right after the next submit
        self._reqs: Dict[str, tuple] = {}  # rid -> (engine, Request)
        self._load = [0] * num_engines  # outstanding requests per engine
        self._polls: Dict[int, tuple] = {}  # engine -> (poll call, its start time)
        self._submits: List[tuple] = []  # (submit call, engine) not confirmed yet
        self._early: List[Finished] = []  # ended while a restart paused their engine (handed back next)

    @property
    def outstanding(self) -> int:
        """Requests not handed back yet."""
        return len(self._reqs) + len(self._early)

    # ------------------------------------------------------------------- submit ----
    def submit(self, requests: List[Request]) -> None:
        groups: Dict[object, List[Request]] = collections.OrderedDict()
        for r in requests:
            groups.setdefault(r.group if r.group is not None else r.rid, []).append(r)
        per_engine = collections.defaultdict(list)
        for reqs in groups.values():
            e = min(range(len(self.handles)), key=lambda i: (self._load[i], i))
            for r in reqs:
                if r.rid in self._reqs:
                    raise ValueError(f"request id {r.rid!r} is already outstanding")
                self._reqs[r.rid] = (e, r)
                self._load[e] += 1
            per_engine[e].extend(reqs)
        for e, reqs in sorted(per_engine.items()):
            self._send(e, reqs)
        if self.kill_next_generation and requests:
            self.kill_next_generation = False
            self.transport.kill_process(self.handles[0])

    def _send(self, e: int, reqs: List[Request]) -> None:
        self._submits.append((self.transport.call(self.handles[e], "submit", reqs), e))

    # --------------------------------------------------------------------- wait ----
    def wait(self, timeout_s: float) -> List[Finished]:
        """Requests that ended (at least one unless ``timeout_s`` passed or none is outstanding)."""
        if not self._reqs:
            out, self._early = self._early, []
            return out
        for e in range(len(self.handles)):
            if self._load[e] and e not in self._polls:
                self._polls[e] = (self.transport.call(self.handles[e], "poll", POLL_S), time.monotonic())
        calls = {fut: e for e, (fut, _) in self._polls.items()}
        for fut in self.transport.ready(list(calls), timeout_s):
            e = calls[fut]
            if self._polls.get(e, (None,))[0] is not fut:
                continue  # collected by a restart meanwhile
            del self._polls[e]
            try:
                self._early += self._take(self.transport.get(fut))
            except self.transport.dead as err:
                self._restart(e, f"died ({type(err).__name__})")
        self._check_submits()
        self._check_hung()
        out, self._early = self._early, []
        return out

    def _take(self, finished: List[Finished]) -> List[Finished]:
        out = []
        for f in finished:
            if f.rid in self._reqs:  # (a restarted engine's old answers are not ours any more)
                e, _ = self._reqs.pop(f.rid)
                self._load[e] -= 1
                out.append(f)
        return out

    def _check_submits(self) -> None:
        if not self._submits:
            return
        ready = set(self.transport.ready([f for f, _ in self._submits], 0))
        keep = []
        for fut, e in self._submits:
            if fut not in ready:
                keep.append((fut, e))
                continue
            try:
                self.transport.get(fut)  # an engine's refusal (a bug) is raised here
            except self.transport.dead:
                pass  # its poll reports the death
        self._submits = keep

    def _check_hung(self) -> None:
        now = time.monotonic()
        for e, (_, t0) in list(self._polls.items()):
            if now - t0 > self.timeout_s + POLL_S:  # (a poll may take POLL_S by itself)
                del self._polls[e]
                self._restart(e, f"did not answer within {self.timeout_s:.0f}s")

    def _restart(self, e: int, why: str) -> None:
        """Replace engine ``e``. The re-sync may release the other engines' KV caches (an
        offloaded trainer onloads next to them), so their running requests are stopped first;
        every request of ``e`` and the stopped ones start again from their prompts afterwards
        (same seeds: a seeded request gives the same tokens again)."""
        log.warning("engine %d %s: restarting it and re-syncing weights", e, why)
        self.transport.kill(self.handles[e])
        self._polls.pop(e, None)
        self._submits = [(f, x) for f, x in self._submits if x != e]
        paused = (
            [x for x in range(len(self.handles)) if x != e and self._load[x]] if self.pause_others_on_restart else []
        )
        dead = [x for x in paused if not self._pause(x)]
        self.handles[e] = self.make_engine(e)
        self.resync([self.handles[e]])
        self.restarts += 1
        for x in [e] + paused:
            again = [r for (y, r) in self._reqs.values() if y == x]
            if again and x not in dead:
                self.resent += len(again)
                self._send(x, again)
        for x in dead:
            self._restart(x, "died while another engine restarted")

    def _pause(self, x: int) -> bool:
        """Stop engine ``x``'s requests (the ended ones go to the next wait); False when it is dead."""
        calls = []
        if x in self._polls:
            calls.append(self._polls.pop(x)[0])
        calls.append(
            self.transport.call(
                self.handles[x], "abort_requests", [rid for rid, (y, _) in self._reqs.items() if y == x]
            )
        )
        for fut in calls:
            try:
                got = self.transport.get(fut, self.timeout_s)
            except self.transport.dead:
                return False
            self._early += self._take([f for f in got if f.output.finish_reason != "abort"])
        return True

    # -------------------------------------------------------------------- abort ----
    def abort(self, rids: Optional[List[str]] = None) -> List[Finished]:
        """Stop ``rids`` (all outstanding by default); returns every request that ended meanwhile
        too. A request whose engine died comes back aborted with nothing generated."""
        want = set(self._reqs) if rids is None else {r for r in rids if r in self._reqs}
        out, dead = self._early, set()
        self._early = []
        for e in list(self._polls):  # the answers already under way first
            fut, _ = self._polls.pop(e)
            if not self._collect(fut, out):
                dead.add(e)
        for e in sorted({self._reqs[r][0] for r in want if r in self._reqs} - dead):
            mine = [r for r in want if r in self._reqs and self._reqs[r][0] == e]
            if not self._collect(self.transport.call(self.handles[e], "abort_requests", mine), out):
                dead.add(e)
        now = self.clock()
        for rid in [r for r in want if r in self._reqs]:
            _, req = self._reqs[rid]
            out += self._take([Finished(rid, GenerationOutput(list(req.prompt_ids), [], [], "abort"), now)])
        for e in sorted(dead):
            self._restart(e, "died while aborting")
        return out

    def _collect(self, fut, out: list) -> bool:
        """Add a poll's or an abort's answer to ``out``; False when the engine is dead."""
        try:
            out += self._take(self.transport.get(fut, self.timeout_s))
            return True
        except self.transport.dead:
            return False
