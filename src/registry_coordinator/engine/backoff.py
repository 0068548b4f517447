"""How long the service's own loops wait before trying the database again.

Every loop that can find the database gone — a worker claiming, the timer looking for
due work, the listener connecting, a call task recording an answer — waits a little
longer after each failure in a row, from a first pause up to a cap, and starts again
from the first pause once it succeeds. The pause is only computed here: the caller
keeps its count of failures and does its own sleeping, so this module holds no state
and needs no clock.

There is no jitter: the loops that retry are few (a process's workers, its timer, its
listener and its calls in flight), and each try is one connection from a pool. A
workflow's call retries are another matter, spread by jitter and documented with the
workflow format (``steps.backoff``).

Past the cap, more doublings change nothing; the exponent stops where the cap is
reached, so ``2 ** n`` cannot overflow however long an outage lasts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Pauses that double from ``first`` after each failure in a row, up to ``cap``
    (seconds)."""

    first: float
    cap: float

    def pause(self, failures: int) -> float:
        """The pause after ``failures`` failures in a row, counting from 1."""
        doublings = min(failures - 1, math.ceil(math.log2(self.cap / self.first)))
        return min(self.cap, math.ldexp(self.first, doublings))  # first * 2 ** doublings


#: A worker or the timer that found the database unavailable. A blip (a failover, a
#: restart) costs about a second; a long outage a log line every 30 s per loop, not a
#: storm of them. The cap is the default lease and sweep interval: once the database
#: is back, work resumes no later than the timer's sweep would find it anyway.
DATABASE_OUTAGE = Backoff(first=1.0, cap=30.0)

#: The listener, whose connection was refused or lost. It is the fast path for a run
#: woken in another process, so a dropped connection is retried at once (0.1 s); and
#: ``/ready`` answers 503 while it is away, so the cap (10 s) is also how long the
#: service may stay unready after the database is back. What it misses meanwhile, the
#: catch-up after reconnecting and the timer's sweep cover.
LISTENER_RECONNECT = Backoff(first=0.1, cap=10.0)

#: A call task with an answer in hand that the database could not record. The run is
#: held under a lease kept meanwhile, and every pause is time the run stands still, so
#: the cap is short (5 s): the calls in flight are bounded by the pools, and one
#: statement each every few seconds costs the database little.
ANSWER_RECORDING = Backoff(first=0.5, cap=5.0)
