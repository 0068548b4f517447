"""Four eyes (``store.approvals``), for operators: the actions waiting for a second one.

``GET /v1/approvals`` lists those pending; ``POST /v1/approvals/{id}/approve`` or
``.../reject``, with a reason, decides one. An approval is decided by an operator other
than the one who asked (``403 approval.self`` otherwise); approved, the action is taken as
the operator who asked, exactly as on one run, recorded in the run's history with both
people and both reasons, and only while the run is as it was when it was asked for (a
run that changed since makes the approval stale: nothing is taken).
"""

from __future__ import annotations

import uuid

from quart import Response

from registry_coordinator import store
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import Said, require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import authenticated, body_json, json_response
from registry_coordinator.http.routes.runs import ACTIONS, approval_shown, run_status
from registry_coordinator.store import approvals
from registry_coordinator.store.approvals import Approval, ApprovalFence, ApprovalState

DECISIONS = ("approve", "reject")


async def listing(context: Context) -> Response:
    """The approvals still to decide, the oldest asked first."""
    who = await authenticated(context)
    who.require_operator()
    return json_response(
        {"approvals": [approval_shown(a) for a in await approvals.pending(context.db)]}
    )


async def _pending(context: Context, text: str, actor: str) -> Approval:
    """The pending approval ``text`` names, for ``actor`` to decide: refused if there is
    none, it is decided, or ``actor`` asked for it."""
    try:
        found = await approvals.get(context.db, uuid.UUID(text))
    except ValueError:
        found = None
    if found is None:
        raise Problem(404, "approval.not-found", f"no approval {text}")
    if found.state != ApprovalState.PENDING:
        raise Problem(409, "approval.decided", f"the approval is {found.state} already")
    if found.requested_by == actor:
        raise Problem(
            403,
            "approval.self",
            "you asked for this action: a second operator, not you, approves or rejects it",
        )
    return found


async def decide(
    context: Context, text: str, decision: str, actor: str, reason: str
) -> tuple[Approval, store.RunStatus | None]:
    """Approve or reject the approval ``text`` names for ``actor``, with ``reason``: the
    approval as decided, and the run as it stands after an approved action."""
    if decision not in DECISIONS:
        raise Problem(404, "route.not-found", f"no approval decision {decision}: approve, reject")
    found = await _pending(context, text, actor)
    if decision == "reject":
        await approvals.decide(context.db, found.id, ApprovalState.REJECTED, actor, reason)
        return await _again(context, found.id), None
    run = await store.status(context.db, found.run_id)
    if run is None:
        raise Problem(404, "run.not-found", f"no run {found.run_id}: it was archived")
    fence = ApprovalFence(found.id, found.seq, actor, reason)
    said = Said.of(found.said)
    try:
        await ACTIONS[found.action].take(context, run, found.requested_by, said, fence)
    except Problem as refused:
        if refused.code in ("run.changed", "run.not-held", "run.ended"):
            await approvals.decide(context.db, found.id, ApprovalState.STALE, actor, reason)
        raise
    return await _again(context, found.id), await store.status(context.db, found.run_id)


async def _again(context: Context, approval: uuid.UUID) -> Approval:
    found = await approvals.get(context.db, approval)
    assert found is not None, "an approval is never deleted"
    return found


async def decision(context: Context, approval: str, decision: str) -> Response:
    """Approve or reject an approval, with a reason."""
    if decision not in DECISIONS:
        raise Problem(404, "route.not-found", f"no approval decision {decision}: approve, reject")
    who = await authenticated(context)
    who.require_operator()
    reason = require_reason(await body_json())
    decided, run = await decide(context, approval, decision, who.actor, reason)
    return json_response(
        {"approval": approval_shown(decided), "run": None if run is None else run_status(run)}
    )
