"""Admission: turning a start request into a run, or a precise reason it is refused; and
the routes around it — the workflows a start may name, an operator's hold and release.

A caller's Idempotency-Key stands for one start request (workflow, version as asked,
input): the same request again returns the original run, anything else under that key
is refused. Whether admission is held is decided by the statement that admits the run
(:func:`store.admit`, :func:`store.admit_many` for a batch), so a hold and a start cannot
pass each other.

A batch is many starts in one request, each with its own key (the header's rule) and
its own outcome, exactly the one it would get alone: its run, or the refusal a single
start would answer. A batch the API cannot read as a list of distinct starts is refused
whole, and changes nothing; otherwise the starts admitted are admitted in one statement.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from quart import Response

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.definition import ConcurrencyKeyMissing, SubjectMissing
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import authenticated, body_json, json_response
from registry_coordinator.http.routes.archive import gone
from registry_coordinator.observability import tracing
from registry_coordinator.store import operator_actions
from registry_coordinator.store.database import Database

START_KEY = re.compile(r"[\x21-\x7e]{1,200}")
#: The most starts one batch may carry: what one statement admits in well under a second.
MAX_BATCH = 500
_START_FIELDS = frozenset({"workflow", "version", "input"})


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool
    run: store.RunStatus  # as it stood when admitted or found (``runs.run_status``)


def _start_key(start_key: str | None) -> str:
    if start_key is None:
        raise Problem(
            400,
            "request.idempotency-key-missing",
            "send an Idempotency-Key header: a value you choose, reused on retries",
        )
    if not START_KEY.fullmatch(start_key):
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
    unknown = sorted(set(body) - _START_FIELDS)
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


def _checked(
    workflows: Workflows,
    caller: Caller,
    key: str,
    workflow: str,
    version: str | None,
    given: JSON,
) -> store.Start:
    """The start the store takes, once the caller's policies cover the workflow (403),
    it is pinned (404) and the input fits its schema and gives its subject (422)."""
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
        subject = pinned.definition.subject_of(given)
    except SubjectMissing as exc:
        raise Problem(422, "input.no-subject", str(exc)) from None
    try:
        concurrency = pinned.definition.concurrency_of(given)
    except ConcurrencyKeyMissing as exc:
        raise Problem(422, "input.no-concurrency-key", str(exc)) from None
    search = pinned.definition.search_of(given)
    return store.Start(
        pinned.definition, pinned.digest, key, given, version, subject, concurrency, search
    )


#: Why the store may not admit a start.
Refused = store.KeyReused | store.StartArchived | store.AdmissionHeld | store.RunConcurrent


def _refusal(refused: Refused) -> Problem:
    """The refusal a start the store did not admit is answered with."""
    if isinstance(refused, store.AdmissionHeld):
        which = "new runs" if refused.workflow is None else f"new runs of {refused.workflow}"
        return Problem(
            503, "admission.held", f"{which} are not admitted: {refused.reason} ({refused.actor})"
        )
    if isinstance(refused, store.StartArchived):
        return gone(refused.run)
    if isinstance(refused, store.RunConcurrent):
        if refused.run_id is None:
            return Problem(
                409,
                "run.concurrent",
                "a run of this workflow for the same concurrency key was live and has just "
                "ended: send the start again",
            )
        return Problem(
            409,
            "run.concurrent",
            f"run {refused.run_id} of this workflow is live for the same concurrency key: "
            "wait for it to end, or cancel it, then start again",
            run=str(refused.run_id),
        )
    return Problem(
        409,
        "run.key-reused",
        "this Idempotency-Key already started a run of another workflow, version or "
        "input: send a new key for a new start",
        run=str(refused.run_id),
    )


def _started(admitted: store.Admitted) -> Started:
    return Started(str(admitted.run_id), admitted.created, admitted.run)


async def start(
    db: Database,
    workflows: Workflows,
    timer: Timer,
    caller: Caller,
    start_key: str | None,
    body: JSON,
    serving: tracing.Serving = tracing.NO_SERVING,
) -> Started:
    """Admit the run a start asks for, or refuse it with a Problem; a run created keeps
    the trace context of the request's span (``serving``)."""
    key = _start_key(start_key)
    asked = _checked(workflows, caller, key, *_start_request(body))
    run_id = uuid.uuid4()  # before the request's span: its trace may be the run's id
    try:
        admitted = await store.admit(
            db,
            asked.definition,
            asked.digest,
            caller.client,
            key,
            asked.run_input,
            asked.asked_version,
            run_id=run_id,
            traceparent=serving.start(run_id),
            subject=asked.subject,
            concurrency=asked.concurrency,
            search=asked.search,
        )
    except (
        store.AdmissionHeld,
        store.StartArchived,
        store.KeyReused,
        store.RunConcurrent,
    ) as refused:
        raise _refusal(refused) from None
    if admitted.created:
        timer.runnable()
    return _started(admitted)


def _batch(body: JSON) -> list[tuple[str, tuple[str, str | None, JSON]]]:
    """Each start of a batch body, in order: its key, and what it asks for. Refused whole
    (400) unless it is {starts: [...]} of 1 to MAX_BATCH starts, each a start body with a
    key of its own."""
    shape = 'the body must be a JSON object {"starts": [{key, workflow, version?, input}, ...]}'
    if not isinstance(body, dict) or set(body) != {"starts"}:
        raise Problem(400, "request.invalid", shape)
    starts = body["starts"]
    if not isinstance(starts, list) or not 1 <= len(starts) <= MAX_BATCH:
        raise Problem(
            400,
            "request.invalid",
            f"starts must be a list of 1 to {MAX_BATCH} starts: send more in further batches",
        )
    asked: list[tuple[str, tuple[str, str | None, JSON]]] = []
    first: dict[str, int] = {}
    for n, each in enumerate(starts):
        if not isinstance(each, dict):
            raise Problem(400, "request.invalid", f"starts[{n}] is not a start: {shape}")
        fields = {name: value for name, value in each.items() if name != "key"}
        key = each.get("key")
        if key is None:
            raise Problem(
                400,
                "request.idempotency-key-missing",
                f"starts[{n}] has no key: give each start a key you choose, reused on retries",
            )
        if not isinstance(key, str) or not START_KEY.fullmatch(key):
            raise Problem(
                400,
                "request.idempotency-key-invalid",
                f"starts[{n}].key must be 1 to 200 visible ASCII characters",
            )
        if key in first:
            raise Problem(
                400,
                "request.invalid",
                f"starts[{first[key]}] and starts[{n}] have the same key {key}: "
                "give each start of a batch its own key",
            )
        first[key] = n
        try:
            asked.append((key, _start_request(fields)))
        except Problem as refusal:
            raise Problem(400, refusal.code, f"starts[{n}]: {refusal.detail}") from None
    return asked


async def start_batch(
    db: Database,
    workflows: Workflows,
    timer: Timer,
    caller: Caller,
    body: JSON,
    serving: tracing.Serving = tracing.NO_SERVING,
) -> list[tuple[str, Started | Problem]]:
    """Admit the starts of a batch, as :func:`start` admits one, each run created keeping
    a trace context of the request's (``serving``): each start's key and its run or its
    refusal, in order. A caller no policy lets start anything, or a body that is not a batch, is
    refused whole (a Problem raised)."""
    caller.require("start")
    results: dict[str, Started | Problem] = {}
    admissible: list[store.Start] = []
    asked = _batch(body)
    for key, request in asked:
        try:
            admissible.append(_checked(workflows, caller, key, *request))
        except Problem as refusal:
            results[key] = refusal
    if admissible:
        ids = [uuid.uuid4() for _ in admissible]
        outcomes = await store.admit_many(db, caller.client, admissible, ids, serving.starts(ids))
        for each, outcome in zip(admissible, outcomes, strict=True):
            if isinstance(outcome, store.Admitted):
                if outcome.created:
                    serving.admitted(outcome.run_id, each.definition.id)
                results[each.start_key] = _started(outcome)
            else:
                results[each.start_key] = _refusal(outcome)
    if any(isinstance(r, Started) and r.created for r in results.values()):
        timer.runnable()
    return [(key, results[key]) for key, _ in asked]


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
) -> tuple[str, str | None]:
    """Hold or release admission for ``who``, an operator (checked first), with the reason
    in the request's ``body``: every start, or those of the pinned workflow the body names
    (``workflow``). The reason as recorded, and the workflow."""
    who.require_operator()
    given = await body()
    reason = require_reason(given)
    workflow = given.get("workflow") if isinstance(given, dict) else None
    if workflow in (None, ""):
        await operator_actions.set_admission(context.db, held, who.actor, reason)
        return reason, None
    if not isinstance(workflow, str) or context.workflows.for_start(workflow, None) is None:
        pinned = sorted({p.definition.id for p in context.workflows.pinned})
        raise Problem(
            404,
            "workflow.not-pinned",
            f"no pinned workflow {workflow!r} to hold the starts of: one of {', '.join(pinned)}",
        )
    await operator_actions.set_workflow_hold(context.db, workflow, held, who.actor, reason)
    return reason, workflow


async def _change(context: Context, held: bool) -> Response:
    who = await authenticated(context)
    reason, workflow = await change(context, who, held, body_json)
    return json_response({"held": held, "reason": reason, "actor": who.actor, "workflow": workflow})


async def hold(context: Context) -> Response:
    """Refuse new starts (503 admission.held) until released; runs admitted go on."""
    return await _change(context, held=True)


async def release(context: Context) -> Response:
    return await _change(context, held=False)


async def unknown_change(context: Context, change: str) -> Response:
    """Any other POST under /v1/admission: no such route, said before asking who calls."""
    raise Problem(404, "route.not-found", f"no admission action {change}")
