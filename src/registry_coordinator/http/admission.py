"""Admission: turning a start request into a run, or a precise reason it is refused.

A caller's Idempotency-Key stands for one start request (workflow, version as asked,
input): the same request again returns the original run, anything else under that key
is refused. Whether admission is held is decided by the statement that admits the run
(:func:`store.admit`), so a hold and a start cannot pass each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.engine import store
from registry_coordinator.engine.database import Database
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.problems import Problem

START_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


@dataclass(frozen=True)
class Started:
    run_id: str
    created: bool


async def start(
    db: Database,
    workflows: Workflows,
    timer: Timer,
    caller: Caller,
    start_key: str | None,
    body: JSON,
) -> Started:
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
    problems = pinned.definition.schema_errors(
        pinned.definition.workflow.input_schema, body["input"]
    )
    if problems:
        raise Problem(
            422,
            "input.invalid",
            "the input does not fit the workflow's input schema",
            errors=problems,
        )
    try:
        admitted = await store.admit(
            db, pinned.definition, pinned.digest, caller.client, start_key, body["input"], version
        )
    except store.AdmissionHeld as held:
        raise Problem(
            503, "admission.held", f"new runs are not admitted: {held.reason} ({held.actor})"
        ) from None
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
