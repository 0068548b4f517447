"""The service loops' backoff: pauses computed, never slept, against the hand-written
loops it replaced in the worker, the timer, the listener and the call tasks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from registry_coordinator.engine.backoff import (
    ANSWER_RECORDING,
    DATABASE_OUTAGE,
    LISTENER_RECONNECT,
    Backoff,
)


def doubled_until(first: float, cap: float, count: int) -> list[float]:
    """The pauses a loop slept that started at ``first`` and doubled after each sleep."""
    pauses, pause = [], first
    for _ in range(count):
        pauses.append(pause)
        pause = min(pause * 2, cap)
    return pauses


def test_the_database_outage_pauses_are_the_workers_and_the_timers() -> None:
    """Both slept ``min(30, 0.5 * 2 ** failures)`` after ``failures`` in a row."""
    assert [DATABASE_OUTAGE.pause(n) for n in range(1, 41)] == [
        min(30.0, 0.5 * 2**n) for n in range(1, 41)
    ]


def test_the_listener_and_the_call_tasks_keep_their_own_numbers() -> None:
    assert [LISTENER_RECONNECT.pause(n) for n in range(1, 21)] == doubled_until(0.1, 10.0, 20)
    assert [ANSWER_RECORDING.pause(n) for n in range(1, 11)] == doubled_until(0.5, 5.0, 10)
    assert [ANSWER_RECORDING.pause(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_very_long_outage_pauses_at_the_cap_without_overflowing() -> None:
    """``0.5 * 2 ** 1100`` raises OverflowError: a worker that had counted that many
    failures (nine hours at the cap) would have ended the service's nursery."""
    assert DATABASE_OUTAGE.pause(1100) == 30.0
    assert LISTENER_RECONNECT.pause(10**9) == 10.0


@given(
    first=st.floats(min_value=1e-3, max_value=10.0),
    factor=st.floats(min_value=1.0, max_value=1e6),
    failures=st.integers(min_value=1, max_value=10_000),
)
def test_pauses_start_at_first_double_and_stop_at_the_cap(
    first: float, factor: float, failures: int
) -> None:
    backoff = Backoff(first, first * factor)
    assert backoff.pause(1) == min(first, backoff.cap)
    assert backoff.pause(failures) <= backoff.cap
    after = backoff.pause(failures + 1)
    assert after == min(backoff.cap, 2 * backoff.pause(failures))
