"""A remote reward model over HTTP: batched, asynchronous, with timeouts and retries.

Protocol (one POST per batch of at most ``batch_size`` samples)::

    POST <url>   {"records": [{"prompt", "response", "label", "data_source", "metadata"}, ...]}
    200          {"rewards": [<reward>, ...]}      # one per record, in order

A ``<reward>`` is what a reward function may return (a float score, a bool, or a dict with
"score" and optionally "acc", "pred", "reason"; see `megatron_dapo.reward.result`).

Batches go out concurrently (at most ``max_concurrency`` in flight) on an asyncio event
loop (aiohttp). Each request has a total budget of ``timeout_s``; a connection error, a
timeout, HTTP 429 or a 5xx answer is retried up to ``max_retries`` times with exponential
back-off; any other failure (4xx, a malformed answer) is not. When a batch fails for good
the whole call raises `RemoteRewardError`, whose message names the endpoint: a reward
model that is down stops the run loudly instead of scoring samples as wrong.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Optional
from urllib.parse import urlsplit

from .result import RewardResult, to_reward_result

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class RemoteRewardError(RuntimeError):
    """A remote reward model did not give usable rewards; the message names its URL."""


def check_url(url: Any) -> str:
    """Return `url` if it is an ``http(s)://host[:port][/path]`` URL, else raise ValueError."""
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"remote reward model URL must look like http(s)://host[:port]/path, got {url!r}")
    return url


class RemoteRewardModel:
    """Score `RewardInput` records with a reward model served over HTTP.

    Args:
        url: the endpoint (``http(s)://host[:port]/path``).
        timeout_s: budget of one request (connect + send + answer), seconds.
        max_retries: retries of a request after a retryable failure (0: try once).
        batch_size: records per request.
        max_concurrency: requests in flight at once.
        backoff_s: first back-off; doubles per retry.
        headers: extra HTTP headers (e.g. an authorization token).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        batch_size: int = 64,
        max_concurrency: int = 4,
        backoff_s: float = 0.5,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        self.url = check_url(url)
        if not timeout_s or timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if batch_size < 1 or max_concurrency < 1:
            raise ValueError(f"batch_size and max_concurrency must be >= 1, got {batch_size!r}, {max_concurrency!r}")
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.batch_size = int(batch_size)
        self.max_concurrency = int(max_concurrency)
        self.backoff_s = float(backoff_s)
        self.headers = dict(headers or {})
        #: Requests sent so far, and how many of them were retries.
        self.requests = 0
        self.retries = 0

    def score(self, inputs: Sequence[Any]) -> list[RewardResult]:
        """Blocking form of `score_async` (runs its own event loop; call it from a thread
        that has none)."""
        return asyncio.run(self.score_async(inputs))

    async def score_async(self, inputs: Sequence[Any]) -> list[RewardResult]:
        """Rewards of `inputs` (RewardInput records), in order; raises RemoteRewardError."""
        import aiohttp

        inputs = list(inputs)
        if not inputs:
            return []
        batches = [inputs[i : i + self.batch_size] for i in range(0, len(inputs), self.batch_size)]
        gate = asyncio.Semaphore(self.max_concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as session:

            async def one(batch):
                async with gate:
                    return await self._post(session, batch)

            tasks = [asyncio.ensure_future(one(b)) for b in batches]
            try:
                done = await asyncio.gather(*tasks)
            finally:
                for t in tasks:
                    t.cancel()
        return [r for batch in done for r in batch]

    async def _post(self, session, batch: list) -> list[RewardResult]:
        import aiohttp

        payload = {"records": [inp.to_dict() for inp in batch]}
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                self.retries += 1
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
            self.requests += 1
            try:
                async with session.post(self.url, json=payload) as resp:
                    body = await resp.text()
                    if resp.status in RETRY_STATUS:
                        last = f"HTTP {resp.status}: {body[:200]}"
                        continue
                    if resp.status != 200:
                        raise self._error(len(batch), attempt + 1, f"HTTP {resp.status}: {body[:200]}")
                    return self._parse(body, len(batch))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if isinstance(exc, asyncio.TimeoutError):
                    last = f"no answer within {self.timeout_s:g} s"
        raise self._error(len(batch), self.max_retries + 1, last)

    def _error(self, n: int, attempts: int, what: str) -> RemoteRewardError:
        return RemoteRewardError(
            f"remote reward model at {self.url}: a batch of {n} record(s) failed after {attempts} attempt(s): {what}"
        )

    def _parse(self, body: str, n: int) -> list[RewardResult]:
        try:
            data = json.loads(body)
        except ValueError:
            raise RemoteRewardError(f"remote reward model at {self.url}: answer is not JSON: {body[:200]!r}") from None
        rewards = data.get("rewards") if isinstance(data, dict) else None
        if not isinstance(rewards, list) or len(rewards) != n:
            got = f"{len(rewards)} rewards" if isinstance(rewards, list) else f"{body[:200]!r}"
            raise RemoteRewardError(
                f'remote reward model at {self.url}: expected {{"rewards": [...]}} with {n} entries, got {got}'
            )
        out = []
        for i, value in enumerate(rewards):
            try:
                out.append(to_reward_result(value))
            except (TypeError, ValueError) as exc:
                raise RemoteRewardError(f"remote reward model at {self.url}: reward {i} is unusable: {exc}") from None
        return out
