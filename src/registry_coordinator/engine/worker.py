"""Engine workers: claim due runs and advance them, one committed step at a time.

A worker holds a claimed run under a lease and drives it through
:func:`steps.on_due` — the same semantics the offline test runner uses —
committing each transition with its history event before taking the next step.
It lets go when the run waits, ends or is held, and hands a run at a call step to
that connection's pool, so a slow product never ties up a worker. The lease
keeper extends the leases of every run this process holds; if the process dies,
the leases run out and any worker, here or in another process, picks the runs up
again from their last committed step.

An unexpected error while a worker holds a run — its definition cannot be loaded,
an exception of Coordinator's own — is counted on the run (``store.record_defect``):
the run is tried again after a backoff, and held for an operator after a few in a
row, rather than claimed again and again. A run whose deadline has passed expires
even when its definition cannot be loaded.

Each step the loop takes is a span (:func:`tracing.step`), current while the step is
decided and committed or handed to a pool, so its log lines carry the trace id and a
call task started in it continues it.
"""

from __future__ import annotations

import logging
from datetime import datetime

import trio

from registry_coordinator import store
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.config import EngineConfig
from registry_coordinator.custody import Unopenable
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.engine.calls import Calls, Product
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.observability import tracing
from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.semantics.steps import (
    NO_VERIFICATION,
    Check,
    Expire,
    Fetch,
    Send,
    Transition,
    Verification,
    detail,
    on_due,
)
from registry_coordinator.store.database import Database, Unavailable
from registry_coordinator.store.faults import crash_point

log = logging.getLogger(__name__)


class Engine:
    """The workers, the lease keeper, and the call pools a run at a call step is handed
    to. The engine builds its pools (:attr:`calls`), so a run whose call completes its
    step goes on in :meth:`advance` without being claimed again; the pools know only
    that method, not the engine."""

    def __init__(
        self,
        db: Database,
        workflows: Workflows,
        timer: Timer,
        products: dict[str, Product],
        config: EngineConfig,
        after: AfterCommit,
        holdings: store.Holdings,
        owner: str,
        high_water: HighWater,
    ) -> None:
        self.db = db
        self.workflows = workflows
        self.timer = timer
        self.calls = Calls(
            db, products, timer, config.lease, after, holdings, self.advance, high_water
        )
        self.config = config
        self.after = after
        self.metrics = after.metrics
        self.holdings = holdings
        self.owner = owner  # this process, as a lease holder
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
                    await self._take(run)
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("database unavailable: %s", exc)
                await trio.sleep(DATABASE_OUTAGE.pause(failures))
            except Exception:
                # Not even the defect could be recorded: the run is left to its lease,
                # and this worker carries on with other runs.
                log.exception("worker: unexpected error")
                await trio.sleep(1.0)

    async def _take(self, run: store.Claimed) -> None:
        """Advance a claimed run; a defect of Coordinator's own is counted on the run
        (and, after a few in a row, holds it) instead of leaving it to its lease."""
        try:
            definition = await self.workflows.by_digest(self.db, run.digest)
        except Unavailable:
            raise
        except Exception as exc:
            if run.now() >= run.deadline_at:
                with tracing.step(run, None, Expire()) as step:
                    await self._commit(None, run, Expire(), run.now(), step)
                return
            why = exc.diagnostics[0].message if isinstance(exc, Refused) else str(exc)
            log.error("the run's definition cannot be used: %s", why, extra={"run": run.id})
            await self._defect(run, HoldCode.DEFINITION_UNUSABLE, f"its definition: {why}")
            return
        try:
            await self.advance(definition, run)
        except Unavailable:
            raise
        except Unopenable as exc:  # what was read of it; no retry opens it
            await self._defect(run, HoldCode.DATA_UNOPENABLE, str(exc))
        except Exception as exc:
            log.exception("worker: unexpected error", extra={"run": run.id})
            await self._defect(run, HoldCode.ENGINE_DEFECT, f"{type(exc).__name__}: {exc}")

    async def _defect(self, run: store.Claimed, code: HoldCode, what: str) -> None:
        why = detail(f"failed at step {run.step}: {what}")
        if await store.record_defect(self.db, run, code, why):
            log.error("run held (%s): %s", code, why, extra={"run": run.id})
        else:
            self.timer.scheduled(store.DEFECT_BACKOFF.total_seconds())

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
                    run.state == RunState.WAITING,
                    run.timer_at,
                    now,
                    run.dispatched,
                    run.checks,
                    self._verification(definition, run.step),
                )
            )
            if transition is None:
                due = (
                    run.deadline_at if run.timer_at is None else min(run.timer_at, run.deadline_at)
                )
                await store.release(self.db, run, due)
                self._schedule(run, due)
                return
            with tracing.step(run, definition, transition) as step:
                if isinstance(transition, Fetch | Send | Check):
                    product = self.calls.connection(definition, run.step)
                    if product.saturated(read=not isinstance(transition, Send)):
                        # Its queue is full: come back when it has had time to drain.
                        step.outcome("queue-full")
                        later = now + product.drain_time()
                        await store.release(self.db, run, later)
                        self._schedule(run, later)
                    # The call task starts in this span: its request's span is a child.
                    elif isinstance(transition, Fetch):
                        self.calls.fetch(definition, run, transition)
                    elif isinstance(transition, Check):
                        self.calls.check(definition, run, transition)
                    else:
                        self.calls.submit(definition, run, transition.request)
                    return
                crash_point("before-commit")
                committed = await self._commit(definition, run, transition, now, step)
            if committed is None or not committed.held:
                return
            run, ahead = committed.run, committed.ahead

    def _verification(self, definition: Definition, step_id: str) -> Verification:
        """How often the product of the call at ``step_id`` may be asked about an unknown
        outcome (nothing to ask at a step that calls nothing)."""
        if step_id not in definition.operations:
            return NO_VERIFICATION
        return self.calls.connection(definition, step_id).config.verification

    async def _commit(
        self,
        definition: Definition | None,
        run: store.Claimed,
        transition: Transition,
        now: datetime,
        step: tracing.StepSpan,
    ) -> store.Committed | None:
        """Commit a step's transition (and the steps after it that need nothing from
        outside), telling ``step``'s span how it went; None if another holder has the run
        now."""
        try:
            committed = await store.commit(
                self.db,
                definition,
                run,
                transition,
                self.config.lease,
                poll=self.calls.poll(definition, run.step) if definition else None,
                now=now,
                go_on=definition is not None,
            )
        except store.LeaseLost:
            step.outcome("lease-lost")
            log.warning("lease lost to another worker; leaving the run", extra={"run": run.id})
            return None
        crash_point("after-commit")
        if run.timer_at is not None and now >= run.timer_at:
            self.metrics.timer_lateness.observe((now - run.timer_at).total_seconds())
        self.after(definition, committed, step=step)
        return committed

    def _schedule(self, run: store.Claimed, due: datetime) -> None:
        self.timer.scheduled((due - run.now()).total_seconds())
