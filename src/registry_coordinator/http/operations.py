"""Operator actions: resolve held runs, cancel runs, hold and release admission.

Every action needs a reason and is recorded in the run's history with who took
it. None takes an operator's word as evidence that a product acted:
``retry-same`` takes the step again, resending the exact sealed request with its
original key (the product's idempotency decides); ``reconcile`` completes a step
only on the product's own evidence — its receipt for the original key, or an
answer to the call that came back after Coordinator's claim on the run was lost;
and ``cancel`` stops future dispatch without undoing anything a product accepted.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from registry_coordinator.authoring.canonical import JSON, UnusableJson, strict_json
from registry_coordinator.authoring.catalog import Operation, Recovery
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.workflow import Call
from registry_coordinator.engine import store
from registry_coordinator.engine.calls import Product
from registry_coordinator.engine.database import Connection, Database, Row
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.problems import Problem
from registry_coordinator.semantics.codes import TERMINAL
from registry_coordinator.semantics.steps import Reply, ReplyKind, build_receipt_request, detail

MAX_REASON = 1000


def require_reason(body: JSON) -> str:
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise Problem(
            400,
            "request.reason-missing",
            f'give a reason: {{"reason": "..."}}, 1 to {MAX_REASON} characters',
        )
    return reason.strip()


async def _locked(conn: Connection, run_id: uuid.UUID) -> Row:
    run = await conn.row("operator_run", {"id": run_id})
    if run is None:
        raise Problem(404, "run.not-found", f"no run {run_id} that you may see")
    return run


async def cancel(db: Database, run_id: uuid.UUID, actor: str, reason: str) -> bool:
    """Cancel a run now, or — with a call in flight — once that call settles (False)."""
    async with db.connection() as conn, conn.transaction():
        run = await _locked(conn, run_id)
        if run["state"] in TERMINAL:
            raise Problem(409, "run.ended", f"the run already ended {run['state']}")
        event = {"reason": reason}
        if run["dispatched_at"] is not None:
            await conn.row(
                "operator_note",
                {
                    "id": run_id,
                    "seq": run["seq"],
                    "cancel": True,
                    "kind": "cancel-requested",
                    "actor": actor,
                    "event": event,
                },
            )
            return False
        await conn.row(
            "operator_cancel",
            {
                "id": run_id,
                "seq": run["seq"],
                "actor": actor,
                "detail": f"cancelled: {reason}",
                "event": event,
            },
        )
        return True


async def _held(conn: Connection, run_id: uuid.UUID) -> Row:
    run = await _locked(conn, run_id)
    if run["state"] != "held":
        raise Problem(409, "run.not-held", f"the run is {run['state']}, not held")
    return run


async def retry_same(
    db: Database, timer: Timer, run_id: uuid.UUID, actor: str, reason: str
) -> None:
    """Make a held run take its step again: a call resends its sealed request, byte for
    byte, with its original key (or, if it never sealed one, sends it for the first time)."""
    async with db.connection() as conn, conn.transaction():
        run = await _held(conn, run_id)
        await conn.row(
            "operator_resume",
            {
                "id": run_id,
                "seq": run["seq"],
                "actor": actor,
                "event": {"reason": reason, "held": run["hold_code"]},
            },
        )
    timer.runnable()


@dataclass(frozen=True)
class Evidence:
    """What a product said of a held call: its receipt for the original key, or its answer
    to a sending that came back after Coordinator's claim on the run was lost."""

    source: str  # receipt or late-answer
    status: int | None
    body: JSON  # the confirmed output, when ``problems`` is empty
    problems: list[str]

    @property
    def confirmed(self) -> bool:
        return not self.problems


def _judge(source: str, definition: Definition, operation: Operation, reply: Reply) -> Evidence:
    """A product's answer as evidence: confirmed only as a 2xx that fits the response schema."""
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
        return Evidence(source, None, None, [reply.detail or "no answer"])
    if reply.status // 100 != 2:
        return Evidence(source, reply.status, None, [f"answered {reply.status}"])
    try:
        body = strict_json(reply.body)
    except UnusableJson as exc:
        return Evidence(source, reply.status, None, [str(exc)])
    return Evidence(
        source, reply.status, body, definition.schema_errors(operation.response_schema, body)
    )


async def reconcile(
    db: Database,
    workflows: Workflows,
    products: dict[str, Product],
    timer: Timer,
    run_id: uuid.UUID,
    actor: str,
    reason: str,
) -> None:
    """Complete a held call on the product's own evidence — its receipt for the original
    key, or else an answer to it that came back late — or refuse, leaving the run held."""
    async with db.connection() as conn:
        async with conn.transaction():
            run = await _held(conn, run_id)
        definition = await workflows.by_digest(db, run["digest"])
        step = definition.step(run["step"])
        sealed = await conn.row("sealed_request", {"id": run_id, "step": run["step"]})
        if not isinstance(step, Call) or sealed is None:
            raise Problem(
                409,
                "run.nothing-to-resend",
                f"the run is held at {run['step']}, where no request was sent: retry-same "
                "takes the step again, or cancel",
            )
        operation = definition.operations[step.id]
        evidence: Evidence | None = None
        if operation.recovery is Recovery.SAME_COMMAND_AND_RECEIPT:
            product = products[step.connection]
            lookup = build_receipt_request(operation, sealed["idempotency_key"])
            async with product.limiter:
                reply = await product.read(lookup)
            evidence = _judge("receipt", definition, operation, reply)
        if evidence is None or not evidence.confirmed:
            late = await store.late_answer(db, run_id, step.id)
            if late is not None:
                answer = Reply(
                    ReplyKind.RESPONSE, late["late_status"], bytes(late["late_response"])
                )
                evidence = _judge("late-answer", definition, operation, answer)
        if evidence is None:
            raise Problem(
                409,
                "run.no-receipt",
                f"{operation.product}/{operation.name} has no receipt lookup, and no answer to "
                "it came back; check the product, then retry-same or cancel",
            )
        async with conn.transaction():
            current = await _locked(conn, run_id)
            if current["seq"] != run["seq"]:
                raise Problem(409, "run.changed", "the run changed meanwhile; look again")
            event = {
                "reason": reason,
                "evidence": evidence.source,
                "receiptStatus": evidence.status,
                "key": sealed["idempotency_key"],
            }
            if evidence.confirmed:
                await conn.row(
                    "operator_complete",
                    {
                        "id": run_id,
                        "seq": run["seq"],
                        "next": step.next,
                        "step": step.id,
                        "outputs": {step.id: evidence.body},
                        "actor": actor,
                        "event": event,
                    },
                )
            else:
                event["why"] = (
                    "no receipt" if evidence.status == 404 else detail("; ".join(evidence.problems))
                )
                await conn.row(
                    "operator_note",
                    {
                        "id": run_id,
                        "seq": run["seq"],
                        "cancel": False,
                        "kind": "reconcile-unconfirmed",
                        "actor": actor,
                        "event": event,
                    },
                )
    if not evidence.confirmed:
        if evidence.status == 404:
            raise Problem(
                409,
                "reconcile.no-receipt",
                "the product has no record of the original request: it was not "
                "applied; retry-same sends it, or cancel",
            )
        raise Problem(
            502,
            "reconcile.unavailable",
            f"the product's evidence could not be used ({detail('; '.join(evidence.problems))});"
            " the run stays held",
        )
    timer.runnable()


async def set_admission(db: Database, held: bool, actor: str, reason: str) -> None:
    await db.execute("set_admission", {"held": held, "reason": reason, "actor": actor})
