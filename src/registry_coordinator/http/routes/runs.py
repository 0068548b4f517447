"""The runs routes: start, list, status, history, and one handler for each action on a run.

A caller sees its own runs (an operator sees every run), and only of the workflows its
token's policies cover for the action, as they covered the run's start: a run it may not
see is answered exactly as a run that does not exist. Every action answers with the run's
status as it stands after the action.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from quart import Response, request

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, storable
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.authoring.workflow import Call
from registry_coordinator.http import operations
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import Said
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import (
    RETRY_AFTER,
    authenticated,
    body_json,
    cursor,
    instant,
    json_response,
    next_cursor,
    problem_body,
    serving,
)
from registry_coordinator.http.routes import admission
from registry_coordinator.http.routes.archive import archived_status, gone
from registry_coordinator.observability import logs
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store import approvals
from registry_coordinator.store.operator_actions import Fence

#: What a listing lists: live runs, or archived ones.
Listed = TypeVar("Listed", store.RunStatus, store.ArchivedRun)


def run_status(run: store.RunStatus) -> JSON:
    """A run's status as the API shows it."""
    return {
        "id": str(run.id),
        "workflow": {"id": run.workflow_id, "version": run.version, "digest": run.digest},
        "caller": run.caller,
        "state": run.state,
        "step": run.step,
        "outcome": run.outcome,
        "output": run.output,
        "failure": {"code": run.failure_code, "detail": run.detail} if run.failure_code else None,
        "hold": _hold(run) if run.hold_code else None,
        "admittedAt": instant(run.admitted_at),
        "deadlineAt": instant(run.deadline_at),
        "updatedAt": instant(run.updated_at),
        "endedAt": instant(run.ended_at),
        "head": run.head,
    }


def _hold(run: store.RunStatus) -> JSON:
    """Why a run is held, and the product's answer if one came back after its claim on
    the run was lost (the evidence ``reconcile`` uses)."""
    hold: JSON = {"code": run.hold_code, "detail": run.detail}
    if run.late_status is not None:
        hold["lateAnswer"] = {
            "attempt": run.late_attempt,
            "status": run.late_status,
            "at": instant(run.late_at),
        }
    return hold


def _not_found(run_id: str) -> Problem:
    return Problem(404, "run.not-found", f"no run {run_id} that you may see")


def _run_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise _not_found(text) from None


async def visible_run(context: Context, who: Caller, run_id: str, action: str) -> store.RunStatus:
    """A run the caller may see (its own, or any for an operator) and may take ``action``
    on: its token's policies must cover the run's workflow, as they did its start."""
    who.require(action)
    run = await store.status(context.db, _run_id(run_id))
    if run is None:
        archived = await store.archived(context.db, _run_id(run_id))
        if archived is None or not (who.operator or archived.caller == who.client):
            raise _not_found(run_id)
        who.require(action, archived.workflow_id)
        raise gone(archived)
    if not (who.operator or run.caller == who.client):
        raise _not_found(run_id)
    who.require(action, run.workflow_id)
    return run


async def _current(context: Context, run_id: uuid.UUID) -> store.RunStatus:
    """The run as it stands now, after an action on it: 410 if it was archived meanwhile
    (the run, long ended, left for its bundle)."""
    run = await store.status(context.db, run_id)
    if run is None:
        archived = await store.archived(context.db, run_id)
        assert archived is not None  # runs leave the hot tables only for archived_runs
        raise gone(archived)
    return run


def _refuse_if_stopping(context: Context) -> None:
    """A process that is shutting down admits none: a run it admitted now would wait for
    a restart. Nor does one that serves operators only, in a restored database's recovery."""
    if context.recovery is not None:
        raise Problem(503, "service.recovery-only", f"no run is admitted now: {context.recovery}")
    if context.stopping.is_set():
        raise Problem(
            503,
            "service.stopping",
            f"this process is shutting down: send the same start again in {RETRY_AFTER} s, "
            "to it once restarted or to another process",
        )


async def start(context: Context) -> Response:
    """Admit a run (201), or find the one this Idempotency-Key started (200), answering
    with its status as it stood then (one statement for a run created). Not while the
    process shuts down. With tracing on, the run's spans are children of this request's,
    which continues the caller's trace (W3C ``traceparent``) if it was sent in one."""
    who = await authenticated(context)
    body = await body_json()
    _refuse_if_stopping(context)
    started = await admission.start(
        context.db,
        context.workflows,
        context.timer,
        who,
        request.headers.get("Idempotency-Key"),
        body,
        serving(),
    )
    if started.created:
        context.metrics.runs_started.labels(started.run.workflow_id).inc()
        logs.started(started.run_id, started.run.workflow_id, started.run.version)
    status = 201 if started.created else 200
    headers = {"Location": f"/v1/runs/{started.run_id}"}
    return json_response(run_status(started.run), status, headers)


async def start_batch(context: Context) -> Response:
    """Many starts in one request (``{"starts": [{key, workflow, version?, input}]}``):
    200 with each start's result, in order, as a single start with its key would have
    answered — its status (201 created, 200 found) and run, or its status and problem.
    A start refused does not stop the others; a batch that is not one is refused whole,
    as is every start while the process shuts down."""
    who = await authenticated(context)
    body = await body_json()
    _refuse_if_stopping(context)
    started = await admission.start_batch(
        context.db,
        context.workflows,
        context.timer,
        who,
        body,
        serving(),
    )
    results: list[JSON] = []
    for key, outcome in started:
        if isinstance(outcome, Problem):
            results.append(
                {
                    "key": key,
                    "status": outcome.status,
                    "problem": problem_body(
                        outcome.status, outcome.code, outcome.detail, **outcome.extra
                    ),
                }
            )
            continue
        if outcome.created:
            context.metrics.runs_started.labels(outcome.run.workflow_id).inc()
            logs.started(outcome.run.id, outcome.run.workflow_id, outcome.run.version)
        status = 201 if outcome.created else 200
        results.append({"key": key, "status": status, "run": run_status(outcome.run)})
    return json_response({"results": results})


def state_filter(text: str | None) -> RunState | None:
    """A ``state`` filter as the store takes it, refused unless it names a state."""
    if text is None:
        return None
    try:
        return RunState(text)
    except ValueError:
        raise Problem(
            400, "request.invalid-filter", f"state must be one of {', '.join(RunState)}"
        ) from None


def search_fields(
    context: Context, workflow: str | None, given: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    """``field`` filters (``NAME:VALUE``, each matched exactly) as the store takes them,
    refused unless ``workflow`` (or, not named, some pinned workflow) declares NAME."""
    declared = {
        name
        for pinned in context.workflows.pinned
        if workflow is None or pinned.definition.id == workflow
        for name in pinned.definition.search
    }
    fields = []
    for text in given:
        name, colon, value = text.partition(":")
        if not colon or not value or not storable(value):
            raise Problem(
                400,
                "request.invalid-filter",
                "field must be NAME:VALUE, a search field's name and the exact value to find",
            )
        if name not in declared:
            said = (
                f"workflow {workflow} declares no search field {name}"
                if workflow is not None
                else f"no workflow declares the search field {name}"
            )
            known = f" (declared: {', '.join(sorted(declared))})" if declared else ""
            raise Problem(400, "request.invalid-filter", f"{said}{known}")
        fields.append((name, value))
    return tuple(fields)


def calls_over(context: Context, connection: str | None) -> tuple[tuple[str, str], ...]:
    """The (digest, step) of each pinned definition's call over ``connection``, for a
    filter of the runs at one (refused unless the connection is configured)."""
    if connection is None:
        return ()
    if connection not in context.products:
        raise Problem(
            400,
            "request.invalid-filter",
            f"no connection {connection}: the configured ones are "
            f"{', '.join(sorted(context.products)) or 'none'}",
        )
    return tuple(
        (pinned.digest, step.id)
        for pinned in context.workflows.pinned
        for step in pinned.definition.workflow.steps.values()
        if isinstance(step, Call) and step.connection == connection
    )


def visible_to(who: Caller) -> tuple[str | None, frozenset[str] | None]:
    """Whose runs ``who`` may read (None: everyone's), of which workflows (None: all): an
    operator every run, a client its own of the workflows its policies let it read."""
    return (None if who.operator else who.client), who.workflows_for("read")


async def listing(context: Context) -> Response:
    """A page of the runs the caller may read, newest first, with the cursor of the next."""
    who = await authenticated(context)
    who.require("read")
    workflow = request.args.get("workflow")
    if not storable(workflow):
        raise Problem(400, "request.invalid-filter", "workflow holds text that cannot be stored")
    state = state_filter(request.args.get("state"))
    try:
        limit = int(request.args.get("limit", "50"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise Problem(400, "request.invalid-filter", "limit must be a number from 1 to 100")
    archived = request.args.get("archived", "false")
    if archived not in ("true", "false"):
        raise Problem(400, "request.invalid-filter", "archived must be true or false")
    fields = search_fields(context, workflow, request.args.getlist("field"))
    connection = request.args.get("connection") or None
    caller, readable = visible_to(who)
    which = store.RunFilter(
        caller=caller,
        readable=readable,
        state=state,
        workflow=workflow,
        fields=fields,
        connection=connection,
        at_steps=calls_over(context, connection),
    )
    after = cursor(request.args.get("cursor"))
    if archived == "true":
        if fields or connection:
            raise Problem(
                400,
                "request.invalid-filter",
                "archived runs are not found by search fields or connection: leave those "
                "out, or archived",
            )
        gone_runs = await store.archived_page(context.db, which, after, limit + 1)
        return _page(gone_runs, limit, archived_status)
    return _page(await store.runs_page(context.db, which, after, limit + 1), limit, run_status)


def _page(rows: Sequence[Listed], limit: int, shown: Callable[[Listed], JSON]) -> Response:
    """A listing's page: up to ``limit`` of ``rows`` as ``shown``, and the cursor of the
    next page if there are more (``rows`` holds one more run than the page, if any)."""
    page = rows[:limit]
    more = len(rows) > limit
    return json_response(
        {"runs": [shown(r) for r in page], "next": next_cursor(page[-1]) if more else None}
    )


async def status(context: Context, run_id: str) -> Response:
    who = await authenticated(context)
    return json_response(run_status(await visible_run(context, who, run_id, "read")))


async def history(context: Context, run_id: str) -> Response:
    who = await authenticated(context)
    run = await visible_run(context, who, run_id, "read")
    events = await store.history(context.db, run.id)
    return json_response(
        {
            "run": str(run.id),
            "events": [
                {
                    "seq": e.seq,
                    "at": format_instant(e.at),
                    "kind": e.kind,
                    "step": e.step,
                    "actor": e.actor,
                    "detail": e.detail,
                    "hash": e.hash,
                }
                for e in events
            ],
        }
    )


@dataclass(frozen=True)
class Action:
    """An action on one run, as the API and the console take it: the policy action a caller
    needs on the run's workflow, whether it needs an operator, and what it does, answering
    with the HTTP status of its outcome."""

    permission: str
    operator: bool
    #: What it does: the status of its outcome.
    take: Take


class Take(Protocol):
    """An action on ``run`` for ``actor`` with what was said; a bulk job taking it gives
    its ``fence``."""

    def __call__(
        self,
        context: Context,
        run: store.RunStatus,
        actor: str,
        said: Said,
        fence: Fence | None = None,
    ) -> Awaitable[int]: ...


async def _cancel(
    context: Context, run: store.RunStatus, actor: str, said: Said, fence: Fence | None = None
) -> int:
    """Cancel the run (200), or, with a call in flight, once that call settles (202)."""
    if not await operations.cancel(context.db, run.id, actor, said.reason, fence):
        return 202
    context.after.cancelled(run.workflow_id)
    logs.cancelled(run.id)
    return 200


async def _retry_same(
    context: Context, run: store.RunStatus, actor: str, said: Said, fence: Fence | None = None
) -> int:
    await operations.retry_same(
        context.db, context.timer, context.products, run.id, actor, said, fence
    )
    return 200


async def _reconcile(
    context: Context, run: store.RunStatus, actor: str, said: Said, fence: Fence | None = None
) -> int:
    await operations.reconcile(
        context.db,
        context.workflows,
        context.products,
        context.timer,
        run.id,
        actor,
        said.reason,
        fence,
    )
    return 200


#: The actions on a run, by the name of their route. A caller may cancel its own runs; the
#: other two need an operator.
ACTIONS = {
    "cancel": Action("cancel", operator=False, take=_cancel),
    "retry-same": Action("read", operator=True, take=_retry_same),
    "reconcile": Action("read", operator=True, take=_reconcile),
}


def may_take(who: Caller, name: str, workflow: str) -> bool:
    """Whether ``who`` may take the action ``name`` on a run of ``workflow`` it can see."""
    action = ACTIONS[name]
    return (who.operator or not action.operator) and who.may(action.permission, workflow)


@dataclass(frozen=True)
class Taken:
    """What became of an action: the run as it stands after, the status of the outcome,
    and the approval it waits for instead, where a second operator must approve it."""

    run: store.RunStatus
    status: int
    approval: approvals.Approval | None = None


async def act(
    context: Context, who: Caller, run_id: str, name: str, body: Callable[[], Awaitable[JSON]]
) -> Taken:
    """Take the action ``name`` on a run for ``who``, with the reason in the request's
    ``body``: the caller checked an operator if the action needs one, then the run, then the
    body and its reason, in the order a refusal names them. A retry-same or cancel of a
    mutation in doubt over a ``fourEyes`` connection is kept for a second operator
    instead (202, and the approval)."""
    action = ACTIONS[name]
    if action.operator:
        who.require_operator()
    run = await visible_run(context, who, run_id, action.permission)
    said = operations.Said.of(await body())
    if await operations.needs_approval(context.db, context.workflows, context.products, run, name):
        asked = await approvals.request(
            context.db, run.id, run.seq, name, said.as_json(), who.actor
        )
        if asked is None:
            raise Problem(
                409,
                "approval.pending",
                "an action on this run already waits for a second operator's approval: "
                "decide that one first (GET /v1/approvals)",
            )
        return Taken(run, 202, asked)
    status = await action.take(context, run, who.actor, said)
    return Taken(await _current(context, run.id), status)


def approval_shown(approval: approvals.Approval) -> JSON:
    """An approval as the API shows it."""
    return {
        "id": str(approval.id),
        "run": str(approval.run_id),
        "action": approval.action,
        "state": approval.state,
        "requestedBy": approval.requested_by,
        "requestedAt": instant(approval.requested_at),
        "reason": approval.said.get("reason"),
        "decidedBy": approval.decided_by,
        "decidedAt": instant(approval.decided_at),
        "decision": approval.decision,
    }


async def _api_action(context: Context, run_id: str, name: str) -> Response:
    who = await authenticated(context)
    taken = await act(context, who, run_id, name, body_json)
    if taken.approval is not None:
        return json_response({"approval": approval_shown(taken.approval)}, 202)
    return json_response(run_status(taken.run), taken.status)


async def cancel(context: Context, run_id: str) -> Response:
    return await _api_action(context, run_id, "cancel")


async def retry_same(context: Context, run_id: str) -> Response:
    return await _api_action(context, run_id, "retry-same")


async def reconcile(context: Context, run_id: str) -> Response:
    return await _api_action(context, run_id, "reconcile")


async def unknown_action(context: Context, run_id: str, action: str) -> Response:
    """Any other POST under a run: no such route, and said so before asking who calls."""
    raise Problem(404, "route.not-found", f"no run action {action}")
