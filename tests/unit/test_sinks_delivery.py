"""Retries: capped exponential backoff with injected jitter and sleep; nothing dropped."""

from __future__ import annotations

import random

import pytest

from schemas.errors import ConfigError, ServiceUnavailable
from schemas.records import IsolationCommand
from sinks.delivery import FanoutSink, RetryingSink, RetryPolicy, retry_call
from sinks.memory import MemorySink


class FixedRng(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(("attempt", "expected"), [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4),
                                                   (7, 10.0), (50, 10.0), (10_000, 10.0)])
def test_backoff_doubles_and_caps_without_jitter(attempt: int, expected: float) -> None:
    p = RetryPolicy(base_s=0.2, factor=2, cap_s=10, jitter=0.0)
    assert p.delay(attempt, random.Random(1)) == pytest.approx(expected)


@pytest.mark.parametrize(("draw", "factor"), [(0.0, 1.0), (0.5, 0.75), (0.999999, 0.5)])
def test_jitter_takes_up_to_its_fraction_off(draw: float, factor: float) -> None:
    p = RetryPolicy(base_s=1, cap_s=1, jitter=0.5)
    assert p.delay(3, FixedRng(draw)) == pytest.approx(factor, rel=1e-5)


def _flaky(failures: int):
    calls = {"n": 0}

    def fn() -> str:
        calls["n"] += 1
        if calls["n"] <= failures:
            raise ServiceUnavailable(f"down #{calls['n']}")
        return "ok"

    return fn, calls


def test_retry_call_retries_until_success_with_injected_sleep() -> None:
    fn, calls = _flaky(4)
    slept: list[float] = []
    seen: list[int] = []
    assert retry_call(fn, RetryPolicy(jitter=0), sleep=slept.append,
                      on_retry=lambda a, w, e: seen.append(a)) == "ok"
    assert calls["n"] == 5 and seen == [1, 2, 3, 4]
    assert slept == pytest.approx([0.2, 0.4, 0.8, 1.6])


def test_retry_call_gives_up_after_max_attempts() -> None:
    fn, calls = _flaky(10)
    with pytest.raises(ServiceUnavailable, match="down #3"):
        retry_call(fn, RetryPolicy(max_attempts=3), sleep=lambda s: None)
    assert calls["n"] == 3


def test_other_errors_are_not_retried() -> None:
    def boom() -> None:
        raise ValueError("bug")

    with pytest.raises(ValueError):
        retry_call(boom, sleep=lambda s: pytest.fail("slept"))


@pytest.mark.parametrize("kw", [{"base_s": -1}, {"cap_s": 0.1, "base_s": 1}, {"factor": 0.5},
                                {"jitter": 2}, {"max_attempts": -1}])
def test_bad_policy(kw: dict) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kw)


class DownThenUp(MemorySink):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def flush(self) -> None:
        if self.failures:
            self.failures -= 1
            raise ServiceUnavailable("down")
        super().flush()


def _cmd(i: int) -> IsolationCommand:
    return IsolationCommand(id=f"d{i}:isolate_host:h{i}", job="j", action="isolate_host",
                            target=f"h{i}", reason="r", diagnosis_id=f"d{i}", issued_at=float(i))


def test_retrying_sink_keeps_everything_across_failed_flushes() -> None:
    inner = DownThenUp(failures=3)
    sink = RetryingSink(inner, sleep=lambda s: None, rng=random.Random(0))
    for i in range(4):
        sink.add(_cmd(i))
    sink.add(_cmd(1))
    sink.flush()
    assert sink.retries == 3 and [c.id for c in inner.commands] == [_cmd(i).id for i in range(4)]
    assert inner.duplicates == 1


def test_fanout_reaches_every_sink() -> None:
    a, b = MemorySink(), MemorySink()
    f = FanoutSink(a, b)
    f.setup()
    f.add(_cmd(1))
    f.flush()
    assert a.commands == b.commands == [_cmd(1)]
