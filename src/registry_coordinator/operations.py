"""Operator actions: resolve held runs, cancel runs, hold and release admission.

Every action needs a reason and is recorded in the run's history with who took
it. None takes an operator's word as evidence that a product acted:
``retry-same`` resends the exact sealed request with its original key (the
product's idempotency decides), ``reconcile`` completes a step only on the
product's own receipt, and ``cancel`` stops future dispatch without undoing
anything a product accepted.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from .authoring import Call
from .calls import Product
from .catalog import Recovery
from .database import Connection, Database, Row
from .problems import Problem
from .steps import ReplyKind, build_receipt_request
from .store import TERMINAL
from .timers import Timer
from .workflows import Workflows

JSON = Any
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


async def _held_call(
    conn: Connection, workflows: Workflows, db: Database, run_id: uuid.UUID
) -> tuple[Row, Call, Any]:
    run = await _locked(conn, run_id)
    if run["state"] != "held":
        raise Problem(409, "run.not-held", f"the run is {run['state']}, not held")
    definition = await workflows.by_digest(db, run["digest"])
    step = definition.step(run["step"])
    if not isinstance(step, Call) or run["attempt"] == 0:
        raise Problem(
            409,
            "run.nothing-to-resend",
            f"the run is held at {run['step']}, which has no sealed request",
        )
    return run, step, definition


async def retry_same(
    db: Database, workflows: Workflows, timer: Timer, run_id: uuid.UUID, actor: str, reason: str
) -> None:
    """Make a held run resend its call's sealed request, byte for byte, with its key."""
    async with db.connection() as conn, conn.transaction():
        run, _, _ = await _held_call(conn, workflows, db, run_id)
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


async def reconcile(
    db: Database,
    workflows: Workflows,
    products: dict[str, Product],
    timer: Timer,
    run_id: uuid.UUID,
    actor: str,
    reason: str,
) -> None:
    """Complete a held call from the product's receipt for its original key, or refuse."""
    async with db.connection() as conn:
        async with conn.transaction():
            run, step, definition = await _held_call(conn, workflows, db, run_id)
        operation = definition.operations[step.id]
        if operation.recovery is not Recovery.SAME_COMMAND_AND_RECEIPT:
            raise Problem(
                409,
                "run.no-receipt",
                f"{operation.product}/{operation.name} has no receipt lookup; check the "
                "product, then retry-same or cancel",
            )
        sealed = await conn.row("sealed_request", {"id": run_id, "step": run["step"]})
        assert sealed is not None and sealed["idempotency_key"] is not None
        product = products[step.connection]
        lookup = build_receipt_request(operation, sealed["idempotency_key"])
        async with product.limiter:
            reply = await product.send(lookup, product.url(lookup.target))
        body: JSON = None
        problems = ["no answer"]
        if (
            reply.kind is ReplyKind.RESPONSE
            and reply.status is not None
            and reply.status // 100 == 2
        ):
            try:
                body = json.loads(reply.body)
                problems = definition.schema_errors(operation.response_schema, body)
            except ValueError:
                problems = ["the receipt is not JSON"]
        confirmed = not problems
        async with conn.transaction():
            current = await _locked(conn, run_id)
            if current["seq"] != run["seq"]:
                raise Problem(409, "run.changed", "the run changed meanwhile; look again")
            detail = {
                "reason": reason,
                "receiptStatus": reply.status,
                "key": sealed["idempotency_key"],
            }
            if confirmed:
                await conn.row(
                    "operator_complete",
                    {
                        "id": run_id,
                        "seq": run["seq"],
                        "next": step.next,
                        "step": step.id,
                        "outputs": {step.id: body},
                        "actor": actor,
                        "event": detail,
                    },
                )
            else:
                detail["why"] = "; ".join(problems) if reply.status != 404 else "no receipt"
                await conn.row(
                    "operator_note",
                    {
                        "id": run_id,
                        "seq": run["seq"],
                        "cancel": False,
                        "kind": "reconcile-unconfirmed",
                        "actor": actor,
                        "event": detail,
                    },
                )
    if not confirmed:
        if reply.status == 404:
            raise Problem(
                409,
                "reconcile.no-receipt",
                "the product has no record of the original request: it was not "
                "applied; retry-same sends it, or cancel",
            )
        raise Problem(
            502,
            "reconcile.unavailable",
            f"the receipt could not be read ({reply.status or reply.detail}); the run stays held",
        )
    timer.runnable()


async def set_admission(db: Database, held: bool, actor: str, reason: str) -> None:
    await db.execute("set_admission", {"held": held, "reason": reason, "actor": actor})


async def admission_held(db: Database) -> Row | None:
    row = await db.row("admission_state")
    return row if row is not None and row["held"] else None
