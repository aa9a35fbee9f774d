"""``--async-mode one-step-off`` and ``bounded``: rollouts generated ahead of the trainer, each
admitted only while it is at most ``k`` weight versions old.

Versions are counted in steps, as ``Sample.token_versions`` are: the weights a synchronous run
generates step n with are version n (those after step n - 1), so a rollout generated for step
m with engine version v is ``m - v`` versions old when step m trains on it.

A producer thread of the driver collects the rollouts of the next steps in order
(``RolloutManager.collect(m, version)``; the manager, its engine pool and the reward pool are
touched by that thread only, except while it is paused) and queues them. It generates step m
only while

* ``m - v <= k`` for the engines' version v: no rollout is generated staler than the allowed
  lag ``k`` (``one-step-off``: k = 1; ``bounded``: ``--max-staleness``; ``--staleness-control
  ess`` moves k between 0 and that bound);
* ``m <= limit``: not past the next checkpoint step (a checkpoint holds no rollout in flight, so
  a resume continues exactly) nor past the last step.

:meth:`RolloutQueue.take` hands step m's rollout to the trainer when it is admissible
(``algo.staleness.admit``: at most ``k`` versions old *now*; k may have dropped since it was
generated). An inadmissible rollout, and every queued one after it, is thrown away and
regenerated: its prompts are drawn again first (``RolloutManager.replay``), with the engines'
current weights; the count is logged (``async_regenerated_steps``). The driver syncs new weights
into the engines only inside :meth:`RolloutQueue.paused` (the producer between two
collections): a sync never meets a generating engine here (docs/rollout.md, 'Asynchronous DAPO').
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

from ..algo.staleness import admit


class RolloutQueue:
    """The producer thread and its queue (module doc). ``version``: the engines' weight version
    now; ``lag``: the allowed staleness k; ``limit``: the last step it may generate."""

    def __init__(self, manager, version: int, lag: int, limit: int):
        self.manager = manager
        self.version, self.lag, self.limit = version, lag, limit
        self.next_step: Optional[int] = None  # the next step to generate (None: not started)
        self.regenerated = 0  # rollouts thrown away by the admission rule and generated again
        self._items: dict = {}  # step -> (version, result or exception)
        self._cv = threading.Condition()
        self._busy = False
        self._pause = 0
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    # -- the driver's side ----------------------------------------------------------------
    def start(self, first_step: int) -> None:
        """Generate from ``first_step`` on (the producer starts at once)."""
        with self._cv:
            if self._thread is not None:
                raise RuntimeError("the rollout producer is already running")
            self.next_step = first_step
            self._thread = threading.Thread(target=self._produce, name="rollout-producer", daemon=True)
        self._thread.start()

    def update(self, *, version: Optional[int] = None, lag: Optional[int] = None, limit: Optional[int] = None) -> None:
        """New engine version (after a sync), allowed lag or limit; wakes the producer."""
        with self._cv:
            if version is not None:
                self.version = version
            if lag is not None:
                self.lag = lag
            if limit is not None:
                self.limit = limit
            self._cv.notify_all()

    def queued(self) -> dict:
        """``{step: version}`` of the rollouts generated and not taken yet."""
        with self._cv:
            return {m: v for m, (v, _) in self._items.items()}

    def take(self, step: int):
        """Step ``step``'s rollout and the version that generated it, admissible at the lag now
        (waits for it; the collection's own exception if it failed)."""
        with self._cv:
            if self._thread is None:
                raise RuntimeError("the rollout producer is not running")
            while True:
                if step in self._items:
                    v, res = self._items[step]
                    if isinstance(res, BaseException):
                        self._items.pop(step)
                        raise res
                    if admit(v, step, self.lag):
                        self._items.pop(step)
                        return res, v
                    self._regenerate_from(step)
                self._cv.wait()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The producer idle (its current collection ended) for the duration: the engines
        generate nothing inside (the driver syncs weights here)."""
        with self._cv:
            self._pause += 1
            while self._busy:
                self._cv.wait()
        try:
            yield
        finally:
            with self._cv:
                self._pause -= 1
                self._cv.notify_all()

    def stop(self) -> None:
        """End the producer (after its current collection); queued rollouts are dropped."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._items.clear()

    # -- internals --------------------------------------------------------------------------
    def _regenerate_from(self, step: int) -> None:
        """Throw away ``step``'s rollout and every later one (called holding the lock; waits for
        the producer's current collection, which is of a later step); their prompts are drawn
        again first, and the producer goes on from ``step``."""
        while self._busy:
            self._cv.wait()
        dropped = sorted(m for m in self._items if m >= step)
        prompts: list = []
        for m in dropped:
            _, res = self._items.pop(m)
            if not isinstance(res, BaseException):
                prompts += [g.samples[0].prompt_index for g in res.generated]
        self.manager.replay(prompts)
        self.regenerated += len(dropped)
        self.next_step = step
        self._cv.notify_all()

    def _may_generate(self) -> bool:
        m = self.next_step
        return m is not None and m <= self.limit and m - self.version <= self.lag and m not in self._items

    def _produce(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (self._pause or not self._may_generate()):
                    self._cv.wait()
                if self._stop:
                    return
                m, v = self.next_step, self.version
                assert m is not None  # (_may_generate)
                self._busy = True
            try:
                res = self.manager.collect(m, version=v)
            except BaseException as e:  # noqa: BLE001 - handed to the driver's thread by take()
                res = e
            with self._cv:
                self._busy = False
                self._items[m] = (v, res)
                if self.next_step == m:  # (not reset by a regeneration meanwhile)
                    self.next_step = m + 1
                if isinstance(res, BaseException):
                    self._stop = True  # the driver re-raises it at take()
                self._cv.notify_all()
