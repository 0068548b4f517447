"""The timer service: wakes wait-untils when their instant comes, and idle workers
when other work falls due.

It holds two numbers — when the next wait-until falls due, and when any run does —
never the waiting runs themselves, which live only in PostgreSQL. Wait-untils it
takes on itself, through every step after them that needs nothing from outside, many
runs to a transaction (:mod:`sleepers`), so a burst of them falling due in the same
second is on time however busy the workers are; then it wakes the workers to go on
with the runs whose next step calls a product or waits for a result. Other due work
(a wait-for's timeout, a call's retry, a deadline, a lapsed lease) is a worker's
to take: the timer only wakes idle workers for it. It asks the database again when
something earlier is scheduled, when a worker runs out of work, or after the sweep
interval (the safety net for work another process scheduled).
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta

import trio

from registry_coordinator import store
from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.store.database import Database, Unavailable

log = logging.getLogger(__name__)
#: Wait-untils woken per transaction: large enough that a burst costs a few statements,
#: small enough that one transaction holds its row locks only briefly.
BATCH = 500
#: Batches at a time in a burst: while one batch's statement runs in PostgreSQL, the next
#: is decided here, so the two use a core each (measured: 10,000 due at one instant
#: finished by p99 2.2-2.4 s with two, 3.1-3.8 s with one; docs/performance.md).
LANES = 2
#: How soon to look again at a wait-until that was due but not woken (a worker or an
#: operator held it for that moment): soon, without spinning.
RECHECK = 0.01


class Timer:
    def __init__(self, db: Database, sweep: timedelta, sleepers: Sleepers) -> None:
        self.db = db
        self.sweep = sweep.total_seconds()
        self.sleepers = sleepers
        self._idle = trio.lowlevel.ParkingLot()
        self._changed = trio.Event()
        self._target = math.inf  # trio time the timer next looks at the database
        self._ticking = False
        self._scheduled_meanwhile = math.inf  # the earliest scheduled during a tick
        self._closed = False

    @property
    def next_look(self) -> float:
        """The Trio time at which the timer next looks at the database (unless woken)."""
        return self._target

    def scheduled(self, seconds: float) -> None:
        """A run falls due ``seconds`` from now; wake early if that is sooner than planned.
        While a tick is reading the database, the tick's answer may already be stale: the
        instant is kept, and the timer looks again by then at the latest."""
        if seconds <= 0:
            self._idle.unpark()
            return
        at = trio.current_time() + seconds
        if self._ticking:
            self._scheduled_meanwhile = min(self._scheduled_meanwhile, at)
        elif at < self._target:
            self._changed.set()

    def runnable(self) -> None:
        """Work is due now (a run was admitted): hand it to an idle worker, if one waits."""
        self._idle.unpark()

    async def idle(self) -> None:
        """A worker found nothing to claim: park it until work falls due (or shutdown)."""
        if self._closed:
            return
        self._changed.set()
        await self._idle.park()

    def wake_all(self) -> None:
        self._idle.unpark_all()

    def close(self) -> None:
        """Shutdown: wake every parked worker, and park none from now on."""
        self._closed = True
        self._idle.unpark_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        while True:
            self._changed = trio.Event()
            self._ticking, self._scheduled_meanwhile = True, math.inf
            try:
                delay = await self._tick()
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("timer: database unavailable: %s", exc)
                delay = DATABASE_OUTAGE.pause(failures)
            except Exception:
                # A defect of Coordinator's own: due wait-untils are claimed by the workers
                # like any due run meanwhile, so none is lost; look again after a pause.
                failures += 1
                log.exception("timer: unexpected error")
                delay = DATABASE_OUTAGE.pause(failures)
            finally:
                self._ticking = False
            self._target = min(trio.current_time() + delay, self._scheduled_meanwhile)
            with trio.move_on_at(self._target):
                await self._changed.wait()

    async def _wake_sleepers(self) -> int:
        """Wake every due wait-until, :data:`LANES` batches at a time; how many there were.
        A lane that fails cancels the other (the nursery does), and its error is the tick's:
        an outage is an outage, not an error group."""
        woken = 0

        async def lane() -> None:
            nonlocal woken
            while not self._closed:
                batch = await self.sleepers.wake(BATCH)
                woken += batch.taken + batch.left
                if batch.due or batch.left:
                    self._idle.unpark_all()  # runs whose next step is a worker's are due
                if batch.taken + batch.left < BATCH:
                    return

        try:
            async with trio.open_nursery() as nursery:
                for _ in range(LANES):
                    nursery.start_soon(lane)
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        if woken:
            self._idle.unpark_all()  # and whatever the workers held back meanwhile
        return woken

    async def _tick(self) -> float:
        """Wake what is due; return how long until the timer must look again."""
        due = await store.next_due(self.db)
        if due.sleeper is not None and due.sleeper <= 0 and await self._wake_sleepers():
            due = await store.next_due(self.db)
        delays = [self.sweep]
        if due.sleeper is not None:
            delays.append(max(due.sleeper, RECHECK))
        if due.work is not None and self._idle.statistics().tasks_waiting:
            if due.work <= 0:
                # Idle workers claim until they run out, then park again, which makes
                # the timer look again: nothing to time for them meanwhile.
                self._idle.unpark_all()
            else:
                delays.append(due.work)
        return min(delays)
