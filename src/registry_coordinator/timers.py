"""The timer service: sleeps until the earliest due run, then wakes idle workers.

It holds one number — the instant the next run falls due — never the waiting
runs themselves, which live only in PostgreSQL. It asks the database again when
something earlier is scheduled, when a worker runs out of work, or after the
sweep interval (the safety net for work another process scheduled).
"""

from __future__ import annotations

import math
from datetime import timedelta

import trio

from . import store
from .database import Database


class Timer:
    def __init__(self, db: Database, sweep: timedelta) -> None:
        self.db = db
        self.sweep = sweep.total_seconds()
        self._idle = trio.lowlevel.ParkingLot()
        self._changed = trio.Event()
        self._target = math.inf  # trio time of the earliest due run we know of
        self._closed = False

    def scheduled(self, seconds: float) -> None:
        """A run falls due ``seconds`` from now; wake early if that is sooner than planned."""
        if seconds <= 0:
            self._idle.unpark()
        elif trio.current_time() + seconds < self._target:
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
        while True:
            self._changed = trio.Event()
            if not self._idle.statistics().tasks_waiting:
                # Every worker is busy and will claim again when done: nothing to time.
                self._target = math.inf
                await self._changed.wait()
                continue
            seconds = await store.next_due(self.db)
            if seconds is not None and seconds <= 0:
                self._target = math.inf
                self._idle.unpark_all()
                await self._changed.wait()
                continue
            delay = self.sweep if seconds is None else min(seconds, self.sweep)
            self._target = trio.current_time() + delay
            with trio.move_on_at(self._target):
                await self._changed.wait()
