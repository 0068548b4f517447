"""Bulk jobs (``store.bulk_jobs``), for operators: one action on every run a filter finds.

``POST /v1/bulk-jobs`` previews a job: the filter's runs are found and kept with their
state, and the answer gives their count and a sample; nothing is done. ``POST
/v1/bulk-jobs/{id}/start`` with a reason starts it; ``pause``, ``resume`` and ``cancel``
take a reason too. ``GET /v1/bulk-jobs`` lists the latest, ``GET /v1/bulk-jobs/{id}``
shows one's progress, the runs it did not act on and why, and who changed it, when and
why. The runs are taken by :mod:`http.bulk_runner`, each exactly as an operator's action
on one run, and only while it is as the preview found it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from quart import Response

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, storable
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import (
    authenticated,
    body_json,
    cursor,
    instant,
    json_response,
    moment,
)
from registry_coordinator.http.routes import runs
from registry_coordinator.store import bulk_jobs
from registry_coordinator.store.bulk_jobs import CHANGES, BulkJob

#: The most runs one job takes: a larger redrive is several jobs, each narrowed.
MAX_RUNS = 20_000
#: How many of the runs a preview shows.
SAMPLE = 10
#: The rate a job takes runs at unless told, and the most it may.
PER_SECOND, MAX_PER_SECOND = 5, 100
#: The filter's fields: what each selects (``store.RunFilter``).
FILTER_FIELDS = (
    "workflow",
    "version",
    "state",
    "holdCode",
    "connection",
    "admittedAfter",
    "admittedBefore",
    "fields",
)
_PAGE = 1000


@dataclass(frozen=True)
class Asked:
    """A job as an operator asks for it: the action, the filter as given and as the store
    takes it, and the rate."""

    action: str
    filter: dict[str, JSON]
    which: store.RunFilter
    per_second: int


def _text(given: dict[str, JSON], name: str) -> str | None:
    value = given.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not storable(value):
        raise Problem(400, "request.invalid-filter", f"filter.{name} must be text")
    return value


def asked(context: Context, body: JSON) -> Asked:
    """What a preview asks for (an API body, or the console's form as one), refused 400
    naming what is wrong."""
    if not isinstance(body, dict):
        raise Problem(400, "bulk.invalid", 'give {"action": ..., "filter": {...}}')
    action = body.get("action")
    if action not in runs.ACTIONS:
        raise Problem(400, "bulk.invalid", f"action must be one of {', '.join(runs.ACTIONS)}")
    given = body.get("filter", {})
    if not isinstance(given, dict) or set(given) - set(FILTER_FIELDS):
        raise Problem(
            400,
            "request.invalid-filter",
            f"filter is an object of {', '.join(FILTER_FIELDS)}",
        )
    rate = body.get("perSecond", PER_SECOND)
    if not isinstance(rate, int) or isinstance(rate, bool) or not 1 <= rate <= MAX_PER_SECOND:
        raise Problem(
            400, "bulk.invalid", f"perSecond must be a whole number from 1 to {MAX_PER_SECOND}"
        )
    fields = given.get("fields", [])
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        raise Problem(400, "request.invalid-filter", 'filter.fields is a list of "NAME:VALUE"')
    workflow = _text(given, "workflow")
    which = store.RunFilter(
        caller=None,
        readable=None,
        state=runs.state_filter(_text(given, "state")),
        workflow=workflow,
        version=_text(given, "version"),
        since=moment("filter.admittedAfter", _text(given, "admittedAfter")),
        until=moment("filter.admittedBefore", _text(given, "admittedBefore")),
        fields=runs.search_fields(context, workflow, [str(f) for f in fields]),
        hold_code=_text(given, "holdCode"),
        connection=_text(given, "connection"),
        at_steps=runs.calls_over(context, _text(given, "connection")),
    )
    kept = {k: v for k, v in given.items() if v not in (None, "", [])}
    return Asked(str(action), kept, which, rate)


async def found(context: Context, which: store.RunFilter) -> list[store.RunStatus]:
    """Every run ``which`` finds, newest first, refused past :data:`MAX_RUNS`."""
    found: list[store.RunStatus] = []
    after = cursor(None)
    while True:
        page = await store.runs_page(context.db, which, after, _PAGE)
        found.extend(page)
        if len(found) > MAX_RUNS:
            raise Problem(
                422,
                "bulk.too-many",
                f"the filter finds more than {MAX_RUNS} runs: narrow it (by workflow, hold "
                "code, or the time they were admitted) and take them in several jobs",
            )
        if len(page) < _PAGE:
            return found
        after = (page[-1].admitted_at, page[-1].id)


async def preview(
    context: Context, actor: str, given: Asked
) -> tuple[uuid.UUID, list[store.RunStatus]]:
    """A job previewed for ``actor``: its id, and the runs it will take, in its order."""
    chosen = await found(context, given.which)
    if not chosen:
        raise Problem(422, "bulk.no-runs", "the filter finds no run: nothing to do")
    job = await bulk_jobs.preview(
        context.db,
        given.action,
        given.filter,
        given.per_second,
        actor,
        [(run.id, run.seq) for run in chosen],
    )
    return job, chosen


def shown(job: BulkJob) -> dict[str, JSON]:
    """A job as the API shows it."""
    return {
        "id": str(job.id),
        "action": job.action,
        "filter": job.filter,
        "state": job.state,
        "perSecond": job.per_second,
        "createdAt": instant(job.created_at),
        "createdBy": job.created_by,
        "startedBy": job.started_by,
        "reason": job.reason,
        "updatedAt": instant(job.updated_at),
        "runs": {
            "total": job.total,
            "pending": job.pending,
            "acted": job.acted,
            "unconfirmed": job.unconfirmed,
            "changed": job.changed,
            "refused": job.refused,
        },
    }


async def _operator(context: Context) -> str:
    who = await authenticated(context)
    who.require_operator()
    return who.actor


def job_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise Problem(404, "bulk.not-found", f"no bulk job {text}") from None


async def known(context: Context, text: str) -> BulkJob:
    """The job ``text`` names, refused 404 if there is none."""
    job = await bulk_jobs.job(context.db, job_id(text))
    if job is None:
        raise Problem(404, "bulk.not-found", f"no bulk job {text}")
    return job


async def create(context: Context) -> Response:
    """Preview a job: its runs found and kept, their count and a sample answered."""
    actor = await _operator(context)
    given = asked(context, await body_json())
    job, chosen = await preview(context, actor, given)
    made = await known(context, str(job))
    return json_response(
        {**shown(made), "sample": [runs.run_status(r) for r in chosen[:SAMPLE]]}, 201
    )


async def listing(context: Context) -> Response:
    await _operator(context)
    return json_response({"jobs": [shown(j) for j in await bulk_jobs.latest(context.db, 50)]})


async def status(context: Context, job: str) -> Response:
    """A job's progress, the runs it did not act on and why, and its changes."""
    await _operator(context)
    found_job = await known(context, job)
    left = await bulk_jobs.settled(context.db, found_job.id, 100, every=False)
    changes = await bulk_jobs.events(context.db, found_job.id)
    return json_response(
        {
            **shown(found_job),
            "notActedOn": [
                {
                    "run": str(r.run_id),
                    "outcome": r.outcome,
                    "code": r.code,
                    "at": instant(r.settled_at),
                }
                for r in left
            ],
            "events": [
                {"kind": e.kind, "at": instant(e.at), "by": e.actor, "reason": e.reason}
                for e in changes
            ],
        }
    )


async def change_job(context: Context, job: str, change: str, actor: str, reason: str) -> BulkJob:
    """Start, pause, resume or cancel a job for ``actor``, with ``reason``, as the API and
    the console take it: the job as it stands after, or a refusal naming its state."""
    if change not in CHANGES:
        raise Problem(404, "route.not-found", f"no bulk job change {change}: {', '.join(CHANGES)}")
    current = await known(context, job)
    if not await bulk_jobs.change(context.db, current.id, change, actor, reason):
        now = await known(context, job)
        raise Problem(409, "bulk.state", f"the job is {now.state}: it cannot {change}")
    if change in ("start", "resume"):
        context.bulk_started()
    return await known(context, job)


async def change(context: Context, job: str, change: str) -> Response:
    """Start, pause, resume or cancel a job, with a reason."""
    if change not in CHANGES:
        raise Problem(404, "route.not-found", f"no bulk job change {change}: {', '.join(CHANGES)}")
    actor = await _operator(context)
    reason = require_reason(await body_json())
    return json_response(shown(await change_job(context, job, change, actor, reason)))
