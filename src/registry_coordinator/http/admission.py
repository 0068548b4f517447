"""Admission: turning a start request into a run, or a precise reason it is refused; and
the routes around it — the workflows a start may name, an operator's hold and release.

A caller's Idempotency-Key stands for one start request (workflow, version as asked,
input): the same request again returns the original run, anything else under that key
is refused. Whether admission is held is decided by the statement that admits the run
(:func:`store.admit`), so a hold and a start cannot pass each other.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from quart import Response

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.engine import operator_actions, store
from registry_coordinator.engine.database import Database
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.archive import gone
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import authenticated, body_json, json_response

START_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool


def _start_key(start_key: str | None) -> str:
    if start_key is None:
        raise Problem(
            400,
            "request.idempotency-key-missing",
            "send an Idempotency-Key header: a value you choose, reused on retries",
        )
    if not START_KEY.match(start_key):
        raise Problem(
            400,
            "request.idempotency-key-invalid",
            "the Idempotency-Key must be 1 to 200 visible ASCII characters",
        )
    return start_key


def _start_request(body: JSON) -> tuple[str, str | None, JSON]:
    """The workflow, version (None: the one pinned last) and input a start body asks for."""
    if not isinstance(body, dict):
        raise Problem(
            400, "request.invalid", "the body must be a JSON object {workflow, version?, input}"
        )
    unknown = sorted(set(body) - {"workflow", "version", "input"})
    if unknown:
        raise Problem(
            400,
            "request.invalid",
            f"unknown fields: {', '.join(unknown)}; "
            "a start has workflow, version (optional) and input",
        )
    workflow, version = body.get("workflow"), body.get("version")
    if not isinstance(workflow, str) or (version is not None and not isinstance(version, str)):
        raise Problem(400, "request.invalid", "workflow (and version, if given) must be strings")
    if "input" not in body:
        raise Problem(400, "request.invalid", "the start needs an input (use {} for none)")
    return workflow, version, body["input"]


async def start(
    db: Database,
    workflows: Workflows,
    timer: Timer,
    caller: Caller,
    start_key: str | None,
    body: JSON,
    traceparent: str | None = None,
) -> Started:
    """Admit the run a start asks for, in the caller's trace context ``traceparent``
    (checked: ``tracing.accepted``) if it was sent in one, or refuse it with a Problem."""
    key = _start_key(start_key)
    workflow, version, given = _start_request(body)
    caller.require("start", workflow)
    pinned = workflows.for_start(workflow, version)
    if pinned is None:
        named = f"{workflow} version {version}" if version else workflow
        raise Problem(
            404,
            "workflow.not-pinned",
            f"no pinned workflow {named}",
            pinned=sorted({f"{p.definition.id}@{p.definition.version}" for p in workflows.pinned}),
        )
    problems = pinned.definition.schema_errors(pinned.definition.workflow.input_schema, given)
    if problems:
        raise Problem(
            422,
            "input.invalid",
            "the input does not fit the workflow's input schema",
            errors=problems,
        )
    try:
        admitted = await store.admit(
            db,
            pinned.definition,
            pinned.digest,
            caller.client,
            key,
            given,
            version,
            traceparent=traceparent,
        )
    except store.AdmissionHeld as held:
        raise Problem(
            503, "admission.held", f"new runs are not admitted: {held.reason} ({held.actor})"
        ) from None
    except store.StartArchived as archived:
        raise gone(archived.row) from None
    except store.KeyReused as reused:
        raise Problem(
            409,
            "run.key-reused",
            "this Idempotency-Key already started a run of another workflow, version or "
            "input: send a new key for a new start",
            run=str(reused.run_id),
        ) from None
    if admitted.created:
        timer.runnable()
    return Started(str(admitted.run_id), admitted.created)


async def pinned(context: Context) -> Response:
    """The workflows this service runs, by id, version and digest: what a start may name."""
    await authenticated(context)
    return json_response(
        {
            "workflows": [
                {
                    "id": p.definition.id,
                    "version": p.definition.version,
                    "digest": p.digest,
                    "title": p.definition.workflow.title,
                }
                for p in context.workflows.pinned
            ]
        }
    )


async def change(
    context: Context, who: Caller, held: bool, body: Callable[[], Awaitable[JSON]]
) -> str:
    """Hold or release admission for ``who``, an operator (checked first), with the reason
    in the request's ``body``; the reason as recorded."""
    who.require_operator()
    reason = require_reason(await body())
    await operator_actions.set_admission(context.db, held, who.actor, reason)
    return reason


async def _change(context: Context, held: bool) -> Response:
    who = await authenticated(context)
    reason = await change(context, who, held, body_json)
    return json_response({"held": held, "reason": reason, "actor": who.actor})


async def hold(context: Context) -> Response:
    """Refuse new starts (503 admission.held) until released; runs admitted go on."""
    return await _change(context, held=True)


async def release(context: Context) -> Response:
    return await _change(context, held=False)


async def unknown_change(context: Context, change: str) -> Response:
    """Any other POST under /v1/admission: no such route, said before asking who calls."""
    raise Problem(404, "route.not-found", f"no admission action {change}")
