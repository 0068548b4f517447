"""Operator actions: resolve held runs, cancel runs, and the reason every action needs.

Every action needs a reason and is recorded in the run's history with who took
it. None takes an operator's word as evidence that a product acted:
``retry-same`` takes the step again, resending the exact sealed request with its
original key (the product's idempotency decides); ``reconcile`` completes a step
only on the product's own evidence — its receipt for the original key, or an
answer to the call that came back after Coordinator's claim on the run was lost;
and ``cancel`` stops future dispatch without undoing anything a product accepted.

Here are the decisions and the refusals a caller sees; the statements, each run under the
run's lock, are :mod:`store.operator_actions` (as is holding and releasing admission).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, UnusableJson, strict_json
from registry_coordinator.authoring.catalog import Operation
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.authoring.workflow import Call
from registry_coordinator.engine.calls import Product
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.problems import Problem
from registry_coordinator.semantics.codes import TERMINAL, HoldCode, RunState
from registry_coordinator.semantics.steps import Reply, ReplyKind, Request, detail
from registry_coordinator.store import operator_actions
from registry_coordinator.store.database import Database
from registry_coordinator.store.operator_actions import Fence, LockedRun, OperatorRun

MAX_REASON = 1000
#: Where a resend goes when its connection changed since its request was sealed.
BINDINGS = ("sealed", "current")


def require_reason(body: JSON) -> str:
    reason = body.get("reason") if isinstance(body, dict) else None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
        raise Problem(
            400,
            "request.reason-missing",
            f'give a reason: {{"reason": "..."}}, 1 to {MAX_REASON} characters',
        )
    return reason.strip()


@dataclass(frozen=True)
class Said:
    """What an operator gave with an action: the reason every action needs, and what they
    attest they checked at the product, which a release after a restore needs."""

    reason: str
    attestation: str | None = None
    #: Which binding a resend goes over when its connection changed since it was sealed:
    #: ``sealed`` (where it was sent) or ``current`` (the connection as it is now).
    binding: str | None = None

    @classmethod
    def of(cls, body: JSON) -> Said:
        """The reason, attestation and binding of an action's request body, refused if
        unusable."""
        reason = require_reason(body)
        binding = body.get("binding") if isinstance(body, dict) else None
        if binding not in (None, "", *BINDINGS):
            raise Problem(
                400,
                "request.binding-invalid",
                f'binding is one of {", ".join(BINDINGS)}: {{"binding": "current"}}',
            )
        binding = str(binding) if binding else None
        attestation = body.get("attestation") if isinstance(body, dict) else None
        if attestation is None or (isinstance(attestation, str) and not attestation.strip()):
            return cls(reason, binding=binding)
        if not isinstance(attestation, str) or len(attestation) > MAX_REASON:
            raise Problem(
                400,
                "request.attestation-missing",
                f'an attestation is text: {{"attestation": "..."}}, 1 to {MAX_REASON} characters',
            )
        return cls(reason, attestation.strip(), binding)

    def as_json(self) -> dict[str, JSON]:
        """What was said, as :meth:`of` reads it back."""
        said: dict[str, JSON] = {"reason": self.reason}
        if self.attestation is not None:
            said["attestation"] = self.attestation
        if self.binding is not None:
            said["binding"] = self.binding
        return said


@asynccontextmanager
async def _locked(
    db: Database, run_id: uuid.UUID, fence: Fence | None = None
) -> AsyncIterator[LockedRun]:
    """The run locked for an action; for a bulk job (``fence``), only if the run is as
    the job's preview found it."""
    async with operator_actions.locked(db, run_id, fence) as locked:
        if locked is None:
            raise Problem(404, "run.not-found", f"no run {run_id} that you may see")
        if fence is not None and locked.run.seq != fence.seq:
            raise Problem(
                409,
                "run.changed",
                "the run changed since this action was asked for (a bulk job's preview, an "
                "approval's request): it is left alone",
            )
        yield locked


@asynccontextmanager
async def _held(
    db: Database, run_id: uuid.UUID, fence: Fence | None = None
) -> AsyncIterator[LockedRun]:
    async with _locked(db, run_id, fence) as locked:
        state = locked.run.state
        if state != RunState.HELD:
            raise Problem(409, "run.not-held", f"the run is {state}, not held")
        yield locked


async def cancel(
    db: Database, run_id: uuid.UUID, actor: str, reason: str, fence: Fence | None = None
) -> bool:
    """Cancel a run now, or — with a call in flight — once that call settles (False);
    for the bulk job ``fence`` names, if one takes the action."""
    async with _locked(db, run_id, fence) as locked:
        state = locked.run.state
        if state in TERMINAL:
            raise Problem(409, "run.ended", f"the run already ended {state}")
        event = {"reason": reason}
        if locked.run.dispatched_at is not None:
            await locked.note("cancel-requested", actor, event, cancel=True)
            return False
        await locked.cancel(actor, f"cancelled by {actor}: the reason is in its history", event)
        return True


async def retry_same(
    db: Database,
    timer: Timer,
    products: dict[str, Product],
    run_id: uuid.UUID,
    actor: str,
    said: Said,
    fence: Fence | None = None,
) -> None:
    """Make a held run take its step again: a call resends its sealed request, byte for
    byte, with its original key (or, if it never sealed one, sends it for the first time).
    A run held after a restore goes on only with the operator's attestation of what they
    found at the product, recorded with the reason: the database cannot say what it did.
    A request sealed under a binding its connection no longer has goes where the operator
    says, and nowhere without it. For the bulk job ``fence`` names, if one takes it."""
    async with _held(db, run_id, fence) as locked:
        held = locked.run.hold_code
        event: dict[str, JSON] = {"reason": said.reason, "held": held}
        if held == HoldCode.RESTORED_REVIEW and said.attestation is None:
            raise Problem(
                400,
                "request.attestation-missing",
                "the run was held after the database was restored from a backup, which "
                "may not know what it did since: check the product for its effects and "
                'say what you found: {"reason": "...", "attestation": "..."}',
            )
        if said.attestation is not None:
            event["attestation"] = said.attestation
        rebind = False
        sealed = await store.sealed_at(db, run_id, locked.run.step)
        change = binding_change(sealed, products) if sealed is not None else None
        if change is not None:
            if said.binding is None:
                raise Problem(
                    409,
                    "run.binding-changed",
                    f"{change.text()}: say where the resend goes, "
                    '{"binding": "sealed"} or {"binding": "current"}',
                    sealed=change.sealed,
                    current=change.current,
                )
            if said.binding == "current" and change.current is None:
                raise Problem(
                    409,
                    "run.binding-changed",
                    f"{change.text()}, so it can only go where it was sealed to: "
                    '{"binding": "sealed"}, or cancel',
                    sealed=change.sealed,
                    current=None,
                )
            rebind = said.binding == "current"
            event["binding"] = {"chose": said.binding, "sealed": change.sealed_url}
            if rebind:
                event["binding"] = {**event["binding"], "current": change.current_url}
        await locked.resume(actor, event, rebind=rebind)
    timer.runnable()


#: The holds of a run whose mutation may or may not have taken effect.
IN_DOUBT = frozenset({HoldCode.OUTCOME_UNKNOWN, HoldCode.DISPATCH_INTERRUPTED})
#: The actions a second operator must approve on such a run over a ``fourEyes`` connection.
SECOND_EYES = ("retry-same", "cancel")


async def needs_approval(
    db: Database,
    workflows: Workflows,
    products: dict[str, Product],
    run: store.RunStatus,
    action: str,
) -> bool:
    """Whether ``action`` on ``run`` takes effect only once a second operator approves it:
    a retry-same or cancel of a run held with its mutation in doubt, at a call over a
    connection configured ``fourEyes``."""
    if action not in SECOND_EYES or run.state != RunState.HELD or run.hold_code not in IN_DOUBT:
        return False
    try:
        step = (await workflows.by_digest(db, run.digest)).step(run.step)
    except (LookupError, Refused):
        return False
    product = products.get(step.connection) if isinstance(step, Call) else None
    return product is not None and product.config.four_eyes


@dataclass(frozen=True)
class BindingChange:
    """A sealed request's binding beside its connection's now (None: no longer configured)."""

    sealed: dict[str, JSON]
    current: dict[str, JSON] | None
    sealed_url: str
    current_url: str | None

    def text(self) -> str:
        name = self.sealed["connection"]
        if self.current is None:
            return (
                f"the request was sealed to {self.sealed_url} over connection {name}, "
                "which is no longer configured"
            )
        parts = ("baseUrl", "identity", "parameters")
        changed = [k for k in parts if self.sealed.get(k) != self.current.get(k)]
        return (
            f"the request was sealed to {self.sealed_url} over connection {name}, whose "
            f"{' and '.join(changed)} changed since (it would now go to {self.current_url})"
        )


def binding_change(sealed: store.Sealed, products: dict[str, Product]) -> BindingChange | None:
    """How a sealed request's binding differs from its connection's now, if it does."""
    bound = sealed.binding
    if bound is None:
        return None
    product = products.get(str(bound["connection"]))
    current = product.config.binding() if product is not None else None
    if current == bound:
        return None
    url = None
    if product is not None:
        url = product.config.base_url + sealed.url.removeprefix(str(bound["baseUrl"]))
    return BindingChange(bound, current, sealed.url, url)


@dataclass(frozen=True)
class Evidence:
    """What a product said of a held call: its receipt for the original key, or its answer
    to a sending that came back after Coordinator's claim on the run was lost."""

    source: str  # receipt or late-answer
    status: int | None
    body: JSON  # the confirmed output, when ``problems`` is empty
    problems: list[str]
    lookup: JSON = None  # the receipt lookup made, if any: {url, status, outcome}
    #: The product said it holds no receipt that matches (which proves nothing either way).
    unresolved: bool = False

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


async def _evidence(
    db: Database,
    products: dict[str, Product],
    definition: Definition,
    step: Call,
    run_id: uuid.UUID,
    sealed: Request,
) -> Evidence | None:
    """The product's receipt for the sealed call's original key, where it has a receipt
    lookup and the receipt confirms the call; else an answer to the call that came back
    late, if any."""
    operation = definition.operations[step.id]
    evidence: Evidence | None = None
    lookup: JSON = None
    if operation.receipt is not None:
        reply, url = await products[step.connection].look_up_receipt(operation, sealed)
        lookup = {"url": url, "status": reply.status, "outcome": reply.kind.value}
        evidence = _judge("receipt", definition, operation, reply)
        if reply.status in operation.receipt.unresolved:
            evidence = replace(evidence, unresolved=True)
    if evidence is None or not evidence.confirmed:
        late = await store.late_answer(db, run_id, step.id)
        if late is not None:
            answer = Reply(ReplyKind.RESPONSE, late.status, late.response)
            evidence = replace(
                _judge("late-answer", definition, operation, answer),
                unresolved=evidence.unresolved if evidence else False,
            )
    return None if evidence is None else replace(evidence, lookup=lookup)


@dataclass(frozen=True)
class Found:
    """What reconcile finds for a held call, before it records anything: the run as judged
    held, its step, the original key, and the product's evidence."""

    run: OperatorRun
    step: Call
    key: str
    evidence: Evidence


async def find_evidence(
    db: Database,
    workflows: Workflows,
    products: dict[str, Product],
    run_id: uuid.UUID,
    fence: Fence | None = None,
) -> Found:
    """Ask what reconcile would: the product's receipt for the original key, or else an
    answer to it that came back late. Changes nothing; the console shows it before an
    operator confirms. Refused as reconcile is when the run is not held at a sent call.

    The run is not locked while the product is asked."""
    async with _held(db, run_id, fence) as locked:
        run = locked.run
    try:
        definition = await workflows.by_digest(db, run.digest)
    except (LookupError, Refused) as unusable:
        raise Problem(
            409,
            "run.definition-unusable",
            f"this build cannot load the run's definition ({unusable}), so it cannot judge "
            "the product's evidence: run a build that can, or retry-same or cancel",
        ) from None
    step = definition.step(run.step)
    found = await store.sealed_at(db, run_id, run.step)
    if not isinstance(step, Call) or found is None:
        raise Problem(
            409,
            "run.nothing-to-resend",
            f"the run is held at {run.step}, where no request was sent: retry-same "
            "takes the step again, or cancel",
        )
    sealed = found.request
    key = sealed.idempotency_key
    assert key is not None  # a mutation's request is sealed with its key
    evidence = await _evidence(db, products, definition, step, run_id, sealed)
    if evidence is None:
        operation = definition.operations[step.id]
        raise Problem(
            409,
            "run.no-receipt",
            f"{operation.product}/{operation.name} has no receipt lookup, and no answer to "
            "it came back; check the product, then retry-same or cancel",
        )
    return Found(run, step, key, evidence)


async def reconcile(
    db: Database,
    workflows: Workflows,
    products: dict[str, Product],
    timer: Timer,
    run_id: uuid.UUID,
    actor: str,
    reason: str,
    fence: Fence | None = None,
) -> None:
    """Complete a held call on the product's own evidence (:func:`find_evidence`), or
    refuse, leaving the run held. The action is recorded only if the run is as it was when
    it was judged held (its ``seq``), else refused ``run.changed``; for the bulk job
    ``fence`` names, if one takes it."""
    found = await find_evidence(db, workflows, products, run_id, fence)
    await _record(db, found, actor, reason, fence)
    timer.runnable()


async def _record(db: Database, found: Found, actor: str, reason: str, fence: Fence | None) -> None:
    """Record what reconcile found: the step completed on confirming evidence; otherwise
    the attempt in history, and the refusal that says why the run stays held."""
    run, step, evidence, key = found.run, found.step, found.evidence, found.key
    event: dict[str, JSON] = {
        "reason": reason,
        "evidence": evidence.source,
        "receiptStatus": evidence.status,
        "key": key,
    }
    if evidence.lookup is not None:
        event["receiptLookup"] = evidence.lookup
    async with _locked(db, run.id, fence) as current:
        if current.run.seq != run.seq:
            raise Problem(409, "run.changed", "the run changed meanwhile; look again")
        if evidence.confirmed:
            await current.complete(step.id, step.next, evidence.body, actor, event)
            return
        event["why"] = (
            "no matching receipt" if evidence.unresolved else detail("; ".join(evidence.problems))
        )
        await current.note(operator_actions.UNCONFIRMED, actor, event)
    if evidence.unresolved:
        raise Problem(
            409,
            "reconcile.no-receipt",
            "the product holds no receipt that matches the original key and request, which "
            "is not evidence that it had no effect: check the product, then retry-same (it "
            "resends the original under its key) or cancel",
        )
    raise Problem(
        502,
        "reconcile.unavailable",
        f"the product's evidence could not be used ({detail('; '.join(evidence.problems))});"
        " the run stays held",
    )
