"""Engine workers: claim due runs and advance them, one committed step at a time.

A worker holds a claimed run under a lease and drives it through
:func:`steps.on_due` — the same semantics the offline test runner uses —
committing each transition with its history event before taking the next step.
It lets go when the run waits, ends, or is held. If the process dies, the lease
runs out and any worker, here or in another process, picks the run up again from
its last committed step.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

import trio

from . import store
from .config import EngineConfig
from .database import Database, Unavailable
from .faults import crash_point
from .steps import Advance, Send, on_due
from .timers import Timer
from .workflows import Workflows

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self, db: Database, workflows: Workflows, timer: Timer, config: EngineConfig
    ) -> None:
        self.db = db
        self.workflows = workflows
        self.timer = timer
        self.config = config
        self.process = uuid.uuid4().hex[:12]
        self.stopping = False
        self.stopped = trio.Event()

    def stop(self) -> None:
        """Stop claiming; workers finish the step they are on, then return."""
        self.stopping = True
        self.timer.wake_all()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for index in range(self.config.workers):
                    nursery.start_soon(self._work, f"{self.process}/{index}")
                task_status.started()
        finally:
            self.stopped.set()

    async def _work(self, owner: str) -> None:
        failures = 0
        while not self.stopping:
            try:
                run = await store.claim(self.db, owner, self.config.lease)
                if run is None:
                    await self.timer.idle()
                    continue
                crash_point("after-claim")
                await self._advance(run)
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("database unavailable: %s", exc)
                await trio.sleep(min(30.0, 0.5 * 2**failures))
            except Exception:
                # A defect, not an outage: the run is left to its lease and tried again
                # later; this worker carries on with other runs.
                log.exception("worker %s: unexpected error", owner)
                await trio.sleep(1.0)

    async def _advance(self, run: store.Claimed) -> None:
        definition = await self.workflows.by_digest(self.db, run.digest)
        while True:
            now = run.now()
            if self.stopping:
                await store.release(self.db, run, now)
                return
            transition = on_due(
                definition, run.record(), run.step, run.state == "waiting", run.timer_at, now
            )
            if transition is None:
                due = (
                    run.deadline_at if run.timer_at is None else min(run.timer_at, run.deadline_at)
                )
                await store.release(self.db, run, due)
                self._schedule(run, due)
                return
            if isinstance(transition, Send):
                raise NotImplementedError("call steps are not implemented yet")
            crash_point("before-commit")
            try:
                committed = await store.commit(
                    self.db, definition, run, transition, self.config.lease
                )
            except store.LeaseLost:
                log.warning("run %s: lease lost to another worker; leaving it", run.id)
                return
            crash_point("after-commit")
            if not isinstance(transition, Advance):
                if committed.due_at is not None:
                    self._schedule(committed.run, committed.due_at)
                return
            run = committed.run

    def _schedule(self, run: store.Claimed, due: datetime) -> None:
        self.timer.scheduled((due - run.now()).total_seconds())
