"""Delivery with retries: when Redis or Kafka is down, wait and try again; drop nothing.

At-least-once + idempotency = exactly-once effect:
1. The worker consumes input, runs detectors and the guard, ``add``s the outputs to sinks.
2. It calls ``flush()``. :func:`retry_call` retries a failed flush with capped exponential
   backoff and jitter; the sink keeps its buffer between attempts, so nothing is dropped.
3. Only after ``flush()`` returned does the caller commit its input offsets. A crash before
   that replays the input; the detectors re-derive the same diagnosis ids, the guard the
   same command ids (diagnosis id + action + target), and the Redis queue's seen-keys
   (``SET NX`` + ``XADD`` in one script) drop the repeats. A retried flush whose first
   attempt did reach Redis is dropped the same way.

Only :class:`~schemas.errors.ServiceUnavailable` is retried; anything else is a bug or a bad
record and propagates. Time and randomness are injected (``sleep``, ``rng``) so tests run
without waiting.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from schemas.errors import ConfigError, ServiceUnavailable
from schemas.records import DeadLetter
from sinks.base import Sink, SinkItem

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff ``base_s * factor**n`` capped at ``cap_s``, minus up to ``jitter`` of it.

    ``max_attempts=0`` retries forever (the worker then stalls its partition rather than
    drop anything: back-pressure, not loss). Otherwise the last error is re-raised.
    """

    base_s: float = 0.2
    factor: float = 2.0
    cap_s: float = 10.0
    jitter: float = 0.5  # fraction of each delay drawn at random ("equal jitter" at 0.5)
    max_attempts: int = 0

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.cap_s >= self.base_s and self.factor >= 1):
            raise ConfigError(f"retry: need 0 <= base_s <= cap_s and factor >= 1, got {self}")
        if not 0 <= self.jitter <= 1 or self.max_attempts < 0:
            raise ConfigError(f"retry: need jitter in [0, 1] and max_attempts >= 0, got {self}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        exp = min(attempt - 1, 64)
        raw = min(self.cap_s, self.base_s * math.pow(self.factor, exp))
        return raw * (1.0 - self.jitter * rng.random())


def retry_call(fn: Callable[[], T], policy: RetryPolicy | None = None, *,
               sleep: Callable[[float], None] = time.sleep,
               rng: random.Random | None = None,
               on_retry: Callable[[int, float, ServiceUnavailable], None] | None = None) -> T:
    """Call ``fn`` until it stops raising ServiceUnavailable (or attempts run out)."""
    policy = policy or RetryPolicy()
    rng = rng or random.Random()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except ServiceUnavailable as e:
            if policy.max_attempts and attempt >= policy.max_attempts:
                raise
            wait = policy.delay(attempt, rng)
            if on_retry is not None:
                on_retry(attempt, wait, e)
            sleep(wait)


class RetryingSink:
    """Wrap a sink so ``setup`` and ``flush`` retry with backoff; ``add`` passes through."""

    def __init__(self, inner: Sink, policy: RetryPolicy | None = None, *,
                 sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None,
                 on_retry: Callable[[int, float, ServiceUnavailable], None] | None = None
                 ) -> None:
        self.inner = inner
        self.policy = policy or RetryPolicy()
        self._sleep, self._rng, self._on_retry = sleep, rng or random.Random(), on_retry
        self.retries = 0

    def _retry(self, fn: Callable[[], None]) -> None:
        def counted(attempt: int, wait: float, err: ServiceUnavailable) -> None:
            self.retries += 1
            if self._on_retry is not None:
                self._on_retry(attempt, wait, err)

        retry_call(fn, self.policy, sleep=self._sleep, rng=self._rng, on_retry=counted)

    def setup(self) -> None:
        self._retry(self.inner.setup)

    def add(self, item: SinkItem) -> None:
        self.inner.add(item)

    def add_dead_letter(self, dead: DeadLetter) -> None:
        self.inner.add(dead)

    def flush(self) -> None:
        self._retry(self.inner.flush)


class FanoutSink:
    """Send every item to several sinks (e.g. Redis queue + Kafka audit + metrics)."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def setup(self) -> None:
        for s in self.sinks:
            s.setup()

    def add(self, item: SinkItem) -> None:
        for s in self.sinks:
            s.add(item)

    def add_dead_letter(self, dead: DeadLetter) -> None:
        self.add(dead)

    def flush(self) -> None:
        for s in self.sinks:
            s.flush()
