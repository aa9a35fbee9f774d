"""``--async-mode one-step-off``: the rollout of step n+1 runs while step n trains.

The rollout manager's ``collect`` runs in a thread of the driver (Ray's calls are
thread-safe; the manager, its engine pool and the reward pool are touched by that thread only
while it runs) with the weights the engines hold, those before step n: its tokens are stamped
one version behind the step that trains on them (``RolloutManager.collect(step, version)``), so
the trainer weighs each of them with min(pi_old / pi_engine, --tis-cap), the decoupled loss
(``config.validate.stale_token_mode``). The driver joins the thread before it syncs the new
weights into the engines: a sync never meets a generating engine.
"""

from __future__ import annotations

import threading
from typing import Optional


class RolloutPrefetch:
    """One rollout collected in the background: :meth:`start`, then :meth:`take` (its result, or
    its exception re-raised in the caller's thread)."""

    def __init__(self, manager):
        self.manager = manager
        self.step: Optional[int] = None
        self._thread: Optional[threading.Thread] = None
        self._result = None
        self._error: Optional[BaseException] = None

    def start(self, step: int, version: int) -> None:
        if self._thread is not None:
            raise RuntimeError(f"a rollout (step {self.step}) is already being collected")
        self.step, self._result, self._error = step, None, None
        self._thread = threading.Thread(
            target=self._collect, args=(step, version), name=f"rollout-step-{step}", daemon=True
        )
        self._thread.start()

    def _collect(self, step: int, version: int) -> None:
        try:
            self._result = self.manager.collect(step, version)
        except BaseException as e:  # noqa: BLE001 - handed to the driver's thread by take()
            self._error = e

    def has(self, step: int) -> bool:
        """Whether the rollout of ``step`` was started (and not taken yet)."""
        return self._thread is not None and self.step == step

    def wait(self) -> None:
        """Until the collection ended (the engines are idle then)."""
        if self._thread is not None:
            self._thread.join()

    def take(self):
        """The collected rollout (waits for it); the collection's own exception if it failed."""
        if self._thread is None:
            raise RuntimeError("no rollout is being collected")
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        return self._result
