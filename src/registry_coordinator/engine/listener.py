"""The listener: one dedicated connection LISTENing for work that became due.

Admissions and webhook deliveries NOTIFY ``coordinator_wake`` (in the statements
that write them); the listener wakes an idle worker, so a run woken in another
process resumes in milliseconds. Notifications are best-effort: after every
(re)connect the workers catch up from the tables, and the timer's sweep is the
safety net, so correctness never depends on a notification arriving. A data key's
erasure is told on the same channel: this process's sealer forgets the key at once, and
after a reconnect every key erased while it was away; so is a connection paused or
resumed (``store.pauses``): the process reads the pauses again, and after a reconnect;
and a bulk job started or resumed: the bulk runner looks at once.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from registry_coordinator.engine.backoff import LISTENER_RECONNECT
from registry_coordinator.engine.timers import Timer
from registry_coordinator.store import bulk_jobs, keys, pauses
from registry_coordinator.store.database import Database, Unavailable, notifications

log = logging.getLogger(__name__)
CHANNEL = "coordinator_wake"


async def _nothing() -> None:
    return None


class Listener:
    def __init__(
        self, db: Database, timer: Timer, paused: Callable[[], Awaitable[None]] = _nothing
    ) -> None:
        """``paused`` reads the paused connections again: told of a change, and on connect."""
        self.db = db
        self.timer = timer
        self.paused = paused
        #: Told of a bulk job started or resumed (``store.bulk_jobs``), and on connect.
        self.bulk: Callable[[], None] = lambda: None
        self.connected = False
        self.reconnects = 0
        self.first_connected = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        failures = 0  # connections refused or lost since the listener was last connected
        started = False
        while True:
            try:
                async with notifications(self.db, CHANNEL) as received:
                    await self.paused()  # before the workers start: none sends over one
                    self.connected = True
                    self.first_connected.set()
                    failures = 0
                    if not started:
                        task_status.started()
                        started = True
                    else:
                        self.reconnects += 1
                        log.info("listener reconnected; catching up from the tables")
                    self.timer.wake_all()  # anything notified while we were away
                    await keys.forget_erased(self.db)
                    self.bulk()
                    async for payload in received:
                        if payload == pauses.NOTICE:
                            await self.paused()
                            self.timer.runnable()  # a resume made its parked runs due
                        elif payload == bulk_jobs.NOTICE:
                            self.bulk()
                        elif not keys.forget_notified(self.db, payload):
                            self.timer.runnable()
            except Unavailable as exc:
                pause = LISTENER_RECONNECT.pause(failures + 1)
                log.warning("listener disconnected (%s); reconnecting in %.1f s", exc, pause)
            self.connected = False
            if not started:
                task_status.started()
                started = True
            failures += 1
            await trio.sleep(LISTENER_RECONNECT.pause(failures))
