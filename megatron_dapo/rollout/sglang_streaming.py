"""SGLangEngine's streaming client: ``submit`` / ``poll`` / ``abort_requests`` (rollout/base.py)
on ``sglang.Engine``, as the mixin :class:`SGLangStreaming`, and the pure functions it uses
(``sglang_rid``, ``build_stream_request``).

Streaming (``submit`` / ``poll`` / ``abort_requests``): one ``Engine.async_generate`` task
per request (``rid`` given, see :func:`sglang_rid`) on the Engine's own event loop, which runs
only inside this adapter's calls (``poll`` drives it until a task ends; the scheduler process
generates meanwhile). ``abort_requests`` first lets every target reach the scheduler (a rid
not dispatched yet would miss its abort and run to the end), then sends
``TokenizerManager.abort_request(rid=...)`` for each, and waits for their answers: SGLang ends a
running request with finish reason "abort" and the output ids and logprobs so far, a queued
one with none.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from megatron_dapo.rollout.base import Finished, Request, check_request, derive_seed
from megatron_dapo.rollout.sglang_translation import from_sglang_output, to_sglang_sampling_params

#: Ends every rid the adapter gives SGLang: SGLang's scheduler aborts each request whose rid
#: *starts with* the aborted one (``Scheduler.abort_request``), so no rid may be a prefix of another.
RID_END = "#"
#: How long abort_requests waits for SGLang to take and answer the aborts.
STREAM_ABORT_TIMEOUT_S = 120.0


def in_loop(loop, fn, calls) -> None:
    """``fn(**kw)`` for each ``kw`` of ``calls``, run inside the Engine's event loop from this
    thread. The TokenizerManager's sends go through zmq's asyncio sockets, which look up the
    current thread's event loop: called from a thread that has none (an EngineActor's methods
    run in a Ray worker thread) they raise "There is no current event loop in thread"."""

    async def run():
        for kw in calls:
            fn(**kw)

    loop.run_until_complete(run())


def sglang_rid(prefix: str, rid: str) -> str:
    """The rid SGLang gets for our request ``rid``: ``prefix`` (one per adapter) + rid + RID_END."""
    if RID_END in rid or RID_END in prefix:
        raise ValueError(f"request id {rid!r} (prefix {prefix!r}) must not contain {RID_END!r}")
    return f"{prefix}{rid}{RID_END}"


def build_stream_request(r: Request, default_seed: int) -> Tuple[List[int], Dict[str, Any]]:
    """(input_ids, sampling_params) of one streamed request: its seed is ``derive_seed(seed, 0)``
    of the request's seed or ``default_seed``, as sample 0 of a blocking call with that seed."""
    check_request(r)
    base = r.params.seed if r.params.seed is not None else default_seed
    return [int(t) for t in r.prompt_ids], to_sglang_sampling_params(r.params, derive_seed(base, 0))


@dataclass
class _Stream:
    task: Any  # asyncio.Task of Engine.async_generate
    srid: str
    input_ids: List[int]
    finished_at: Optional[float] = None
    routing_shape: Optional[Tuple[int, ...]] = None  # (layers, top_k, experts): return_routed_experts was asked


def _stamp(st: _Stream, _task) -> None:
    st.finished_at = time.time()


class SGLangStreaming:
    """The streaming methods of SGLangEngine (mixed in before RolloutEngine). They use the
    engine's ``_engine`` (``sglang.Engine``), ``_streams`` (our rid -> :class:`_Stream`),
    ``_seed_rng``, ``_rid_prefix``, ``_routing_shape``, ``_check_can_generate`` and
    ``_wants_routing``, all set up by SGLangEngine."""

    def submit(self, requests) -> None:
        self._check_can_generate("submit")
        loop = self._engine.loop
        for r in requests:
            if r.rid in self._streams:
                raise ValueError(f"request id {r.rid!r} is already outstanding")
            ids, sp = build_stream_request(r, self._seed_rng.getrandbits(63))
            srid = sglang_rid(self._rid_prefix, r.rid)
            routed = self._wants_routing(r.params)
            if routed:
                coro = self._engine.async_generate(
                    input_ids=ids, sampling_params=sp, return_logprob=True, rid=srid, return_routed_experts=True
                )
            else:
                coro = self._engine.async_generate(input_ids=ids, sampling_params=sp, return_logprob=True, rid=srid)
            task = loop.create_task(coro)
            st = _Stream(task, srid, ids, routing_shape=self._routing_shape if routed else None)
            task.add_done_callback(functools.partial(_stamp, st))
            self._streams[r.rid] = st

    def poll(self, timeout_s: float = 1.0) -> List[Finished]:
        tasks = [st.task for st in self._streams.values()]
        if tasks and not any(t.done() for t in tasks):
            self._engine.loop.run_until_complete(
                asyncio.wait(tasks, timeout=max(0.0, float(timeout_s)), return_when=asyncio.FIRST_COMPLETED)
            )
        return self._take([rid for rid, st in self._streams.items() if st.task.done()])

    def abort_requests(self, rids=None) -> List[Finished]:
        want = [rid for rid in (self._streams if rids is None else rids) if rid in self._streams]
        running = [rid for rid in want if not self._streams[rid].task.done()]
        self._run_until(lambda: all(self._dispatched(rid) for rid in running), "reach the scheduler")
        srids = [self._streams[rid].srid for rid in running if not self._streams[rid].task.done()]
        in_loop(self._engine.loop, self._engine.tokenizer_manager.abort_request, [{"rid": r} for r in srids])
        self._run_until(lambda: all(self._streams[rid].task.done() for rid in running), "answer their abort")
        return self._take(want)

    def _dispatched(self, rid: str) -> bool:
        st = self._streams[rid]
        state = self._engine.tokenizer_manager.rid_to_state.get(st.srid)
        return st.task.done() or (state is not None and state.dispatched)

    def _run_until(self, cond, what: str, timeout_s: float = STREAM_ABORT_TIMEOUT_S) -> None:
        """Drive the Engine's loop until ``cond()`` holds; an error after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"SGLang: aborted requests did not {what} within {timeout_s:.0f}s")
            self._engine.loop.run_until_complete(asyncio.sleep(0.005))

    def _take(self, rids) -> List[Finished]:
        out = []
        for rid in rids:
            st = self._streams.pop(rid)
            out.append(
                Finished(
                    rid,
                    from_sglang_output(st.task.result(), st.input_ids, st.routing_shape),
                    st.finished_at or time.time(),
                )
            )
        return out
