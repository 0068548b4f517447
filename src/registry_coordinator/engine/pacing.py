"""Flow control per connection: a request rate and a burst, and a product's own word to
slow down (``429`` or ``503`` with ``Retry-After``), which holds back the whole connection
rather than the one run that heard it.

A :class:`Pace` is two gates over one rule, the generic cell rate algorithm (a token
bucket kept as the instant the next request is due): at most ``burst`` requests at once,
then one each ``1 / perSecond`` seconds.

- :meth:`Pace.ticket`, taken by a call *before* its request is sealed: it waits for the
  call's turn, so that a backlog (after an outage, a redrive) waits with nothing sealed,
  and a kill meanwhile leaves nothing whose outcome is unknown.
- :meth:`Pace.leave`, passed by every request (calls, result reads, receipt lookups,
  feed pages) just before it is sent: the gate that makes the limit exact, whatever the
  time a call took between its ticket and its sending. A call normally finds it open,
  its ticket having waited already.

A pause (:meth:`Pace.slow_down`) moves both gates' next instant to its end. The pace is
one process's: with ``serve --processes N`` each process keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import trio

from registry_coordinator.config import Rate


@dataclass
class _Gate:
    """One gate of the rule: the instant its next request is due (Trio's clock)."""

    due: float = field(default=float("-inf"))

    def turn(self, now: float, interval: float, tolerance: float) -> float:
        """When a request asking at ``now`` may go, the gate moved past it."""
        at = max(now, self.due - tolerance)
        self.due = max(self.due, now) + interval
        return at


class Pace:
    """A connection's pace: its :class:`Rate` (None: no limit but a product's pause)."""

    def __init__(self, rate: Rate | None) -> None:
        self.rate = rate
        self._tickets = _Gate()
        self._sending = _Gate()
        self.paused_until = float("-inf")  # a product asked to wait until then
        self.pauses = 0  # how many times a product asked

    def _turn(self, gate: _Gate) -> float:
        now = trio.current_time()
        if self.rate is None:
            return max(now, self.paused_until)
        interval = 1 / self.rate.per_second
        return gate.turn(max(now, self.paused_until), interval, (self.rate.burst - 1) * interval)

    async def ticket(self) -> None:
        """Wait for a call's turn, before its request is sealed."""
        await trio.sleep_until(self._turn(self._tickets))

    async def leave(self) -> None:
        """Wait until a request may be sent. A request whose turn has come passes with one
        checkpoint, not a timed sleep until an instant already past, which cost four times
        a checkpoint (``./run bench pacing``: docs/performance.md)."""
        turn = self._turn(self._sending)
        if turn <= trio.current_time():
            await trio.lowlevel.checkpoint()
        else:
            await trio.sleep_until(turn)

    def slow_down(self, wait: timedelta) -> None:
        """The product asked for ``wait`` before more: nothing more goes to it until then."""
        until = trio.current_time() + wait.total_seconds()
        if until > self.paused_until:
            self.paused_until = until
            self.pauses += 1
