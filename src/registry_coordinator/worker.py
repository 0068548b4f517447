"""Engine workers: claim due runs and advance them, one committed step at a time.

A worker holds a claimed run under a lease and drives it through
:func:`steps.on_due` — the same semantics the offline test runner uses —
committing each transition with its history event before taking the next step.
It lets go when the run waits, ends or is held, and hands a run at a call step to
that connection's pool, so a slow product never ties up a worker. The lease
keeper extends the leases of every run this process holds; if the process dies,
the leases run out and any worker, here or in another process, picks the runs up
again from their last committed step.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import trio

from . import logs, store
from .calls import Calls
from .config import EngineConfig
from .database import Database, Unavailable
from .definition import Definition
from .faults import crash_point
from .metrics import Metrics
from .steps import Fetch, Send, on_due
from .timers import Timer
from .workflows import Workflows

log = logging.getLogger(__name__)
#: How long a run waits before a worker tries again when its connection's queue is full.
SATURATED_BACKOFF = timedelta(seconds=1)


class Engine:
    def __init__(
        self,
        db: Database,
        workflows: Workflows,
        timer: Timer,
        calls: Calls,
        config: EngineConfig,
        metrics: Metrics,
        holdings: store.Holdings,
        owner: str,
    ) -> None:
        self.db = db
        self.workflows = workflows
        self.timer = timer
        self.calls = calls
        self.config = config
        self.metrics = metrics
        self.holdings = holdings
        self.owner = owner  # this process, as a lease holder
        calls.proceed = self.advance
        self.stopping = False
        self.stopped = trio.Event()

    def stop(self) -> None:
        """Stop claiming; workers finish the step they are on, then return."""
        self.stopping = True
        self.timer.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(self.config.workers):
                    nursery.start_soon(self._work)
                task_status.started()
        finally:
            self.stopped.set()

    async def keep_leases(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Extend the leases of the claims this process is working on, well before they
        run out, for as long as it lives."""
        task_status.started()
        period = self.config.lease.total_seconds() / 3
        while True:
            await trio.sleep(period)
            tokens = self.holdings.tokens()
            if not tokens:
                continue
            try:
                await store.extend_leases(self.db, tokens, self.config.lease)
            except Unavailable as exc:
                log.warning("could not extend leases: %s", exc)

    async def _work(self) -> None:
        failures = 0
        while not self.stopping:
            try:
                run = await store.claim(self.db, self.owner, self.config.lease)
                if run is None:
                    await self.timer.idle()
                    continue
                # There may be more where this came from: pass the wake-up on to an idle
                # worker, so a burst spreads over all of them without waking them all at once.
                self.timer.runnable()
                crash_point("after-claim")
                with self.holdings.holding(run.token):
                    definition = await self.workflows.by_digest(self.db, run.digest)
                    await self.advance(definition, run)
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("database unavailable: %s", exc)
                await trio.sleep(min(30.0, 0.5 * 2**failures))
            except Exception:
                # A defect, not an outage: the run is left to its lease and tried again
                # later; this worker carries on with other runs.
                log.exception("worker: unexpected error")
                await trio.sleep(1.0)

    async def advance(
        self, definition: Definition, run: store.Claimed, ahead: store.Ahead | None = None
    ) -> None:
        """Take a held run's steps until it waits, ends, is held, or calls out; ``ahead``
        is its next step when that was already decided."""
        while True:
            now = run.now() if ahead is None else ahead.at
            if self.stopping:
                await store.release(self.db, run, now)
                return
            transition = (
                ahead.transition
                if ahead is not None
                else on_due(
                    definition,
                    run.record(),
                    run.step,
                    run.state == "waiting",
                    run.timer_at,
                    now,
                    run.dispatched,
                )
            )
            if transition is None:
                due = (
                    run.deadline_at if run.timer_at is None else min(run.timer_at, run.deadline_at)
                )
                await store.release(self.db, run, due)
                self._schedule(run, due)
                return
            if isinstance(transition, Fetch):
                self.calls.fetch(definition, run, transition)
                return
            if isinstance(transition, Send):
                if self.calls.product(definition, run.step).saturated:
                    await store.release(self.db, run, now + SATURATED_BACKOFF)
                    self._schedule(run, now + SATURATED_BACKOFF)
                else:
                    self.calls.submit(definition, run, transition.request)
                return
            crash_point("before-commit")
            try:
                committed = await store.commit(
                    self.db,
                    definition,
                    run,
                    transition,
                    self.config.lease,
                    poll=self.calls.poll(definition, run.step),
                    now=now,
                    go_on=True,
                )
            except store.LeaseLost:
                log.warning("lease lost to another worker; leaving the run", extra={"run": run.id})
                return
            crash_point("after-commit")
            if run.timer_at is not None and now >= run.timer_at:
                self.metrics.timer_lateness.observe((now - run.timer_at).total_seconds())
            self.metrics.committed(definition, committed)
            logs.transitions(committed, run.id)
            if not committed.held:
                if committed.due_at is not None:
                    self._schedule(committed.run, committed.due_at)
                return
            run, ahead = committed.run, committed.ahead

    def _schedule(self, run: store.Claimed, due: datetime) -> None:
        self.timer.scheduled((due - run.now()).total_seconds())
