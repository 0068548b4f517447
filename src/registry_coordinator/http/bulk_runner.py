"""The task that carries out bulk jobs (``store.bulk_jobs``): one per process, in the
service's nursery.

It leases one running job at a time and takes its runs in the order the preview found
them, at the job's rate (a :class:`~registry_coordinator.engine.pacing.Pace`), each run
through exactly the action an operator takes on one run (``routes.runs.ACTIONS``), as
the operator who started the job, with the job's reason, fenced by the run's seq at the
preview. Before each run it renews its lease, so a pause or a cancel stops it before the
next run, and a process that lost its lease (killed, stalled) leaves the job to the next
that claims it; the fence makes that harmless, as the run settled with the action cannot
be taken twice. A resend or a reconcile's receipt lookup then goes through its
connection's own rate limit too. A run the action refuses is settled ``refused`` with the
problem's code; one whose seq moved, ``changed``.

Told of a job started or resumed (``bulk`` on the wake channel, or by this process, and
whenever its listener connects), it looks at once; otherwise once a lease's length.
"""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

import trio

from registry_coordinator import store
from registry_coordinator.config import Rate
from registry_coordinator.custody import Unopenable
from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.engine.pacing import Pace
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import Said, needs_approval
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.routes.runs import ACTIONS
from registry_coordinator.store import bulk_jobs
from registry_coordinator.store.bulk_jobs import JobFence, Settled
from registry_coordinator.store.database import Unavailable
from registry_coordinator.store.faults import crash_point

log = logging.getLogger(__name__)

#: How long a process holds a job between two of its runs before another may take it.
LEASE = timedelta(seconds=30)
#: How often an idle runner looks for a job no notice told it of: one whose holder died
#: (its lease ends after as long), or one started while this process's listener was away.
IDLE = LEASE.total_seconds()
#: How many of a job's runs are read at once.
BATCH = 50
#: Who a job's own changes are recorded as (its end).
SERVICE = "coordinator"
#: Why a run was not acted on where no refusal of the action's says: its sealed data does
#: not open here, or a defect of Coordinator's met taking it.
_UNOPENABLE, _DEFECT = "run.data-unopenable", "engine-defect"


class BulkRunner:
    def __init__(self, context: Context, owner: str) -> None:
        self.context = context
        self.owner = owner
        self._told = trio.Event()

    def tell(self) -> None:
        """A job was started or resumed: look now."""
        self._told.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        failures = 0
        while True:
            try:
                job = await bulk_jobs.claim(self.context.db, self.owner, LEASE)
                if job is not None:
                    await self._carry(job)
                failures = 0
            except Unavailable as exc:
                failures += 1
                log.warning("bulk jobs: database unavailable: %s", exc)
                await trio.sleep(DATABASE_OUTAGE.pause(failures))
                continue
            if job is None:
                with trio.move_on_after(IDLE):
                    await self._told.wait()
                self._told = trio.Event()

    async def _carry(self, job_id: uuid.UUID) -> None:
        """Take the job's runs until none is left, or the job is no longer this process's
        to take (paused, cancelled, its lease lost)."""
        db = self.context.db
        job = await bulk_jobs.job(db, job_id)
        if job is None or job.started_by is None or job.reason is None:
            return
        pace = Pace(Rate(job.per_second, 1))
        said = Said(job.reason)
        while batch := await bulk_jobs.next_runs(db, job_id, BATCH):
            for run_id, fence in batch:
                await pace.ticket()
                if not await bulk_jobs.renew(db, job_id, self.owner, LEASE):
                    return
                await self._one(job, run_id, fence, said)
        if await bulk_jobs.finish(db, job_id, SERVICE):
            log.info("bulk job %s is done: %d runs", job_id, job.total)

    async def _one(
        self, job: bulk_jobs.BulkJob, run_id: uuid.UUID, fence: JobFence, said: Said
    ) -> None:
        """Take the job's action on one run, or settle why not: a run whose data does not
        open here, or that meets a defect of ours, is settled refused with its code (and
        the defect logged), and the job goes on: one run never stops the others."""
        try:
            await self._take(job, run_id, fence, said)
        except Unopenable:
            await bulk_jobs.settle(self.context.db, job.id, run_id, Settled.REFUSED, _UNOPENABLE)
        except Unavailable:
            raise  # the database's outage: the job is taken again once it is back
        except Exception:
            log.exception("bulk job %s: a defect taking a run", job.id, extra={"run": run_id})
            await bulk_jobs.settle(self.context.db, job.id, run_id, Settled.REFUSED, _DEFECT)

    async def _take(
        self, job: bulk_jobs.BulkJob, run_id: uuid.UUID, fence: JobFence, said: Said
    ) -> None:
        db = self.context.db
        run = await store.status(db, run_id)
        if run is None:  # archived since the preview
            await bulk_jobs.settle(db, job.id, run_id, Settled.CHANGED, "run.archived")
            return
        assert job.started_by is not None
        context = self.context
        if await needs_approval(db, context.workflows, context.products, run, job.action):
            await bulk_jobs.settle(db, job.id, run_id, Settled.REFUSED, "approval.required")
            return
        try:
            await ACTIONS[job.action].take(self.context, run, job.started_by, said, fence)
            crash_point("bulk-committed")  # the action and its settling committed
        except Problem as refused:
            outcome = Settled.CHANGED if refused.code == "run.changed" else Settled.REFUSED
            await bulk_jobs.settle(db, job.id, run_id, outcome, refused.code)
