"""The timer's batches: due wait-untils taken on through every step that needs nothing
from outside, many runs to a transaction.

When thousands of wait-untils fall due in the same second, taking each run on by
itself (claim, commit, each a statement and a flush of the WAL) made the last of them
finish a minute late. Here one transaction locks a batch of due sleepers
(``store.due_sleepers``), decides each run's steps in Python with the same semantics a
worker uses (:func:`steps.on_due`, then :func:`statements.plan`, whose
:func:`steps.chain` takes the wait-until completed and every choose, finish or wait-until
after it, each with its own history event), and writes them all in one statement
(``store.advance_sleepers``). A run whose next step needs a product or a wait is left due
at once for any worker, exactly as a worker that gave up its lease would leave it.

Invariants:

- A batch commits whole or not at all: killed before its COMMIT, its runs are still
  asleep and due, and the next batch (in this process or another) wakes them once.
- The rows stay locked from the moment they are read until the commit, so nothing an
  operator, a delivery or another process does to a run is overwritten; they skip
  what is locked rather than wait.
- A run the batch cannot decide (its definition cannot be loaded, or deciding raised)
  is not guessed at: its ``wakes_to`` is cleared in the same transaction, which makes it
  a worker's to wake, and the worker's own path records the defect or holds the run.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from registry_coordinator import store
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.semantics.steps import on_due
from registry_coordinator.store.database import Database, Unavailable
from registry_coordinator.store.faults import crash_point
from registry_coordinator.store.statements import Plan, plan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Woken:
    """What one batch did."""

    taken: int  # runs it moved
    due: int  # of those, runs it left due at once for a worker (their next step calls out)
    left: int  # runs it left to the workers, undecided
    lateness: list[float]  # how late each moved run's wait-until was, in seconds


class Sleepers:
    """Wakes due wait-untils in batches, as ``owner`` (its history events' actor)."""

    def __init__(
        self, db: Database, workflows: Workflows, owner: str, lease: timedelta, after: AfterCommit
    ) -> None:
        self.db = db
        self.workflows = workflows
        self.owner = owner
        self.lease = lease  # kept by no batch; statements.plan asks for it
        self.after = after  # with no timer to tell: the timer looks after each burst

    async def wake(self, limit: int) -> Woken:
        """Take on up to ``limit`` due wait-untils, oldest first, in one transaction."""
        async with self.db.connection() as conn, conn.transaction():
            sleepers = await store.due_sleepers(conn, self.owner, limit)
            if not sleepers:
                return Woken(0, 0, 0, [])
            now = sleepers[0].now()  # one instant for the batch, as the database read it
            plans: list[tuple[Definition, Plan, float]] = []
            undecided: list[uuid.UUID] = []
            for run in sleepers:
                decided = await self._decide(run, now)
                if decided is None:
                    undecided.append(run.id)
                else:
                    assert run.timer_at is not None
                    plans.append((*decided, (now - run.timer_at).total_seconds()))
            actor = store.actor(self.owner)
            moved = await store.advance_sleepers(conn, [p for _, p, _ in plans], now, actor)
            await store.leave_to_workers(conn, undecided)
            crash_point("mid-wake")
        lateness = []
        due = 0
        for definition, planned, late in plans:
            if planned.run.id in moved:
                committed = planned.committed()
                self.after(definition, committed)
                lateness.append(late)
                due += committed.due_at == now
        self.after.metrics.woke(lateness)
        return Woken(len(moved), due, len(undecided), lateness)

    async def _decide(self, run: store.Claimed, now: datetime) -> tuple[Definition, Plan] | None:
        """The run's plan at ``now``, or None (logged) if it cannot be decided here."""
        try:
            definition = await self.workflows.by_digest(self.db, run.digest)
            transition = on_due(
                definition, run.record(), run.step, True, run.timer_at, now, run.dispatched
            )
            if transition is None:  # not due after all: a worker looks at it when it is
                return None
            planned = plan(
                definition,
                run,
                transition,
                self.lease,
                keep_lease=False,
                poll=None,
                now=now,
                settlement=None,
                go_on=True,
            )
        except Unavailable:
            raise
        except Exception:
            log.exception("timer: a wait-until left to the workers", extra={"run": run.id})
            return None
        return definition, planned
