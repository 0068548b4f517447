"""A connection's pace on Trio's mock clock: whenever requests ask, none leaves before the
rate and the burst let it, none waits longer than they make it, and a product's pause
holds back every request until its end."""

from __future__ import annotations

from datetime import timedelta

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from registry_coordinator.config import Rate
from registry_coordinator.engine.pacing import Pace

#: When each request asks to leave, in seconds after the start.
asking = st.lists(st.floats(0, 5, allow_nan=False), min_size=1, max_size=40)


def _left(
    pace: Pace, asked: list[float], gate: str = "leave", pauses: tuple[float, ...] = ()
) -> list[float]:
    """When each request of ``asked`` left, on a mock clock that starts at 0, the product
    having asked at once to wait each of ``pauses`` (seconds)."""
    left: list[float] = []

    async def one(at: float) -> None:
        await trio.sleep_until(at)
        await getattr(pace, gate)()
        left.append(trio.current_time())

    async def main() -> None:
        for seconds in pauses:
            pace.slow_down(timedelta(seconds=seconds))
        async with trio.open_nursery() as nursery:
            for at in sorted(asked):
                nursery.start_soon(one, at)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return sorted(left)


@settings(deadline=None)
@given(asking, st.integers(1, 50), st.integers(1, 10), st.sampled_from(["leave", "ticket"]))
def test_no_request_leaves_before_the_rate_lets_it_nor_waits_longer(
    asked: list[float], per_second: int, burst: int, gate: str
) -> None:
    left = _left(Pace(Rate(per_second, burst)), asked, gate)
    interval = 1 / per_second
    for i, at in enumerate(left):  # any k in a row take at least (k - burst) intervals
        for j in range(i + burst, len(left)):
            assert left[j] - at >= (j - i - burst + 1) * interval - 1e-9
    # The rule is exact: each leaves as soon as it asked, or as the one before it let it.
    expected, due = [], float("-inf")
    for at in sorted(asked):
        go = max(at, due - (burst - 1) * interval)
        due = max(due, at) + interval
        expected.append(go)
    assert [round(x, 6) for x in left] == [round(x, 6) for x in sorted(expected)]


@settings(deadline=None)
@given(asking, st.booleans())
def test_a_products_pause_holds_back_every_request_until_its_end(
    asked: list[float], limited: bool
) -> None:
    pace = Pace(Rate(1000, 1000) if limited else None)
    left = _left(pace, asked, pauses=(3, 1))  # a shorter pause does not cut it short
    assert all(at >= 3 for at in left) and pace.pauses == 1
    assert left == sorted(max(at, 3) for at in asked)
