"""Building the ``transition`` statement: what a run's columns and history become.

Pure: nothing here sends a statement or reads a clock (``now`` is an argument, as in
:mod:`steps`), so the parameters a transition commits with can be tested without
PostgreSQL. :func:`columns` is an exhaustive ``match`` over the transitions: a new
kind of transition that it does not handle is a type error (``assert_never``), not a
run committed with default columns. :func:`plan` takes the steps after an Advance
that need nothing from outside into the same statement (``go_on``), each with its
own event, so a crash commits all of them or none.

A transition that follows a product's answer is preceded, in the same statement, by the
event that says what became of the request (:class:`Outcome`): a dispatched call's fate
(:data:`CALL_OUTCOMES`) or the result read that completes a wait-for (``result-read``).
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Required, TypedDict, assert_never

from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.authoring.workflow import WaitFor
from registry_coordinator.custody import Purpose, Sealer, sealer_for
from registry_coordinator.semantics.codes import FailureCode, RunState
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Check,
    Expire,
    Failed,
    Fetch,
    Finished,
    Held,
    Reply,
    ReplyKind,
    Retry,
    Send,
    Sleep,
    Transition,
    Verify,
    chain,
    detail,
    woke,
)
from registry_coordinator.store.claims import (
    Ahead,
    CancelledInFlight,
    Claimed,
    Committed,
    Settlement,
)

#: What became of a dispatched request, by the outcome its execution records: the history
#: event the statement that records the outcome writes first. A closed list of three, so
#: that history tells a request the product answered (``{attempt, status}``) from one that
#: certainly never left (``{attempt, detail}``: connection refused, the service stopped
#: before sending) and from one that may have reached the product with no answer recorded
#: (``{attempt, detail}``: a timeout, a reset, the service stopping during the call or
#: before recording what came back). ``call-dispatched``, written before a byte is sent,
#: says only that the request was sealed to be sent. ``record_defect`` writes ``call-lost``
#: for the sending a defect of Coordinator's own stopped (outcome ``defect``).
CALL_OUTCOMES = {
    "response": "call-answered",
    "not-sent": "call-not-sent",
    "lost": "call-lost",
    "interrupted": "call-lost",
}
#: Why a call found dispatched by its next holder has no answer recorded.
INTERRUPTED = "the service stopped after dispatching it and before recording its answer"

#: The parameters of a ``transition`` statement that belong to its first transition.
_AS_THE_FIRST_HAS_THEM = (
    "token",
    "event_step",
    "honour_cancel",
    "call_status",
    "call_response",
    "call_outcome",
)


@dataclass(frozen=True)
class Outcome:
    """A history event the ``transition`` statement writes before its first transition's:
    what became of the request the transition follows from."""

    kind: str
    detail: dict[str, JSON]


def call_outcome(settlement: Settlement, attempt: int, why: str = "") -> Outcome:
    """The event for the ``attempt``-th sending of a call settled as ``settlement``;
    ``why`` says why no answer came (the reply's detail), for one that has none."""
    kind = CALL_OUTCOMES[settlement.outcome]
    if settlement.outcome == "response":
        return Outcome(kind, {"attempt": attempt, "status": settlement.status})
    if settlement.outcome == "interrupted":
        return Outcome(kind, {"attempt": attempt, "detail": detail(why or INTERRUPTED)})
    return Outcome(kind, {"attempt": attempt, "detail": detail(why or "no detail")})


def result_read(url: str, status: int, key: str) -> Outcome:
    """The event for the read of a wait-for's result that completes its step. The
    statement adds ``delivered``: whether a signed webhook had delivered this result and
    key (the read is then the authoritative confirmation of it). It says no more than
    that — not that the delivery caused this read: a read a webhook woke may have found
    no result yet, and a later poll the one that did."""
    return Outcome("result-read", {"url": url, "status": status, "key": key})


def receipt_looked_up(url: str, reply: Reply, check: int) -> Outcome:
    """The event for the ``check``-th lookup of a call's receipt that the engine made
    itself, before what it led to: the step completed on it, asked again, or held."""
    said: dict[str, JSON] = {"url": url, "check": check, "outcome": reply.kind.value}
    if reply.kind is ReplyKind.RESPONSE:
        said["status"] = reply.status
    else:
        said["detail"] = detail(reply.detail)
    return Outcome("receipt-looked-up", said)


def result_polled(url: str, reply: Reply) -> dict[str, JSON]:
    """A read of a wait-for's result that found none usable yet, as its ``result-polled``
    event says it (recorded only when it differs from the wait's last: ``release_wait``)."""
    said: dict[str, JSON] = {"url": url, "status": reply.status, "outcome": reply.kind.value}
    if reply.kind is not ReplyKind.RESPONSE:
        said["detail"] = detail(reply.detail)
    return said


class _Run(TypedDict):
    """The columns of a run a transition writes, as the ``transition`` statement names
    them: in a chain of transitions in one statement, the last one's."""

    id: uuid.UUID
    now: datetime
    actor: str
    step: str
    state: RunState
    attempt: int
    checks: int
    timer_at: datetime | None
    wakes_to: str | None  # a wait-until's next step, for the timer's batches
    due_at: datetime | None
    lease_owner: str | None
    lease_token: uuid.UUID | None
    outcome: str | None
    output: Jsonb | None
    failure_code: str | None
    hold_code: str | None
    detail: str | None
    ends: bool


class _First(TypedDict):
    """What a statement takes from its first transition: the claim it is fenced on, the
    step its first event is at, whether an operator's cancel is honoured now, and the
    settled call, if one led to it."""

    token: uuid.UUID
    event_step: str
    honour_cancel: bool
    call_status: int | None
    call_response: bytes | None
    call_outcome: str | None


class Columns(_Run, _First):
    """One transition: the run's columns as it leaves them, what its step recorded, and
    its history event."""

    outputs: dict[str, JSON]
    completed: dict[str, str]
    kind: str
    event: dict[str, JSON]


class Statement(_Run, _First):
    """The parameters of one ``transition`` statement: the run's columns as its last
    transition leaves them, what every step recorded, and an event for each."""

    outputs: dict[str, JSON]
    completed: dict[str, str]
    leaves_wait: bool
    kinds: list[str]
    event_steps: list[str]
    events: list[Jsonb]


class _Changes(TypedDict, total=False):
    """What one kind of transition sets of the columns :func:`columns` resets, and the
    event it writes (always)."""

    step: str
    state: RunState
    attempt: int
    checks: int
    timer_at: datetime | None
    wakes_to: str | None
    due_at: datetime | None
    lease_owner: str | None
    lease_token: uuid.UUID | None
    outputs: dict[str, JSON]
    completed: dict[str, str]
    outcome: str | None
    output: Jsonb | None
    failure_code: str | None
    hold_code: str | None
    detail: str | None
    ends: bool
    kind: Required[str]
    event: Required[dict[str, JSON]]


#: A wait-for's wait, registered with the transition that begins it (``register_wait``).
Wait = dict[str, object]


@dataclass(frozen=True)
class Plan:
    """One ``transition`` statement and what committing it makes of the run."""

    statement: Statement
    wait: Wait | None  # a wait-for's wait to register with it
    taken: tuple[tuple[str, Transition | CancelledInFlight], ...]  # (step, transition), in order
    run: Claimed  # the run as the statement leaves it
    ahead: Ahead | None  # the step after the chain, decided while building it

    def committed(self, due_at: datetime | None = None) -> Committed:
        """What the holder gets back once the statement committed; ``due_at`` when a
        registered wait found its result delivered already (due at once, not as planned)."""
        return Committed(
            self.run,
            due_at if due_at is not None else self.statement["due_at"],
            self.taken,
            self.statement["outcome"],
            self.statement["lease_token"] is not None,
            self.ahead,
        )


def plan(
    definition: Definition | None,
    run: Claimed,
    transition: Transition | CancelledInFlight,
    lease: timedelta,
    *,
    keep_lease: bool,
    poll: timedelta | None,
    now: datetime,
    settlement: Settlement | None,
    go_on: bool,
    outcome: Outcome | None = None,
) -> Plan:
    """The statement for ``transition`` and, with ``go_on``, the steps taken after it in
    the same statement (:func:`steps.chain` decides which, at ``now``; the first step it
    does not take is handed on as :attr:`Plan.ahead` rather than decided again — to a
    holder that keeps its lease; without ``keep_lease`` the run is left due at once, and
    whoever claims it decides that step again). ``outcome``, if any, is the event written
    before the first transition's (:class:`Outcome`)."""
    params, wait = columns(definition, run, transition, lease, keep_lease, poll, now, settlement)
    taken: list[tuple[str, Transition | CancelledInFlight]] = [(run.step, transition)]
    events = [params]
    moved = after(run, params, now)
    if outcome is not None:
        moved = replace(moved, seq=moved.seq + 1)
    ahead = None
    if go_on and isinstance(transition, Advance):
        assert definition is not None
        chained = chain(definition, run.record(), run.step, transition, now)
        for step, following in chained.taken:
            assert step == moved.step  # the statement's columns and the record agree
            params, _ = columns(definition, moved, following, lease, keep_lease, poll, now)
            taken.append((step, following))
            events.append(params)
            moved = after(moved, params, now)
        if chained.ahead is not None:
            ahead = Ahead(chained.ahead, now)
    leaves_wait = run.state == RunState.WAITING
    merged = statement(events, leaves_wait=leaves_wait, outcome=outcome)
    return Plan(merged, wait, tuple(taken), moved, ahead)


def after(run: Claimed, params: Columns, now: datetime) -> Claimed:
    """The run as a transition's columns leave it."""
    return replace(
        run,
        seq=run.seq + 1,
        state=params["state"],
        step=params["step"],
        attempt=params["attempt"],
        checks=params["checks"],
        timer_at=params["timer_at"],
        dispatched=False,
        outputs={**run.outputs, **params["outputs"]},
        completed={**run.completed, **dict.fromkeys(params["completed"], now)},
    )


def statement(
    transitions: list[Columns], *, leaves_wait: bool, outcome: Outcome | None = None
) -> Statement:
    """One ``transition`` statement for transitions taken one after another: the run's
    columns as the last leaves them, what each step recorded, an event for each (after
    ``outcome``'s, at the first one's step), and the settled call (if any) and the
    cancellation check as the first has them. With ``leaves_wait`` the run was waiting,
    and any wait it had registered is dropped."""
    first, last = transitions[0], transitions[-1]
    before = [] if outcome is None else [(outcome.kind, first["event_step"], outcome.detail)]
    written = before + [(t["kind"], t["event_step"], t["event"]) for t in transitions]
    return {
        "id": last["id"],
        "now": last["now"],
        "actor": last["actor"],
        "step": last["step"],
        "state": last["state"],
        "attempt": last["attempt"],
        "checks": last["checks"],
        "timer_at": last["timer_at"],
        "wakes_to": last["wakes_to"],
        "due_at": last["due_at"],
        "lease_owner": last["lease_owner"],
        "lease_token": last["lease_token"],
        "outcome": last["outcome"],
        "output": last["output"],
        "failure_code": last["failure_code"],
        "hold_code": last["hold_code"],
        "detail": last["detail"],
        "ends": last["ends"],
        "token": first["token"],
        "event_step": first["event_step"],
        "honour_cancel": first["honour_cancel"],
        "call_status": first["call_status"],
        "call_response": first["call_response"],
        "call_outcome": first["call_outcome"],
        "leaves_wait": leaves_wait,
        "outputs": {k: v for t in transitions for k, v in t["outputs"].items()},
        "completed": {k: v for t in transitions for k, v in t["completed"].items()},
        "kinds": [kind for kind, _, _ in written],
        "event_steps": [step for _, step, _ in written],
        "events": [Jsonb(event) for _, _, event in written],
    }


#: The columns of ``advance_sleepers`` that each woken run has one of, as a ``transition``
#: statement's parameters name them (``output`` goes boxed: see :func:`batch`).
_BATCHED = (
    "id",
    "event_step",
    "state",
    "step",
    "attempt",
    "timer_at",
    "wakes_to",
    "due_at",
    "outputs",
    "completed",
    "outcome",
    "failure_code",
    "hold_code",
    "detail",
    "ends",
)


def batch(plans: list[Plan], now: datetime, actor: str, sealer: Sealer | None) -> dict[str, object]:
    """One ``advance_sleepers`` statement for many runs' plans, all decided at ``now`` by
    ``actor`` and none keeping a lease: each run's ``transition`` parameters as a record,
    and every run's events as records naming their run and place, in one jsonb document
    each — which PostgreSQL unpacks far more cheaply than psycopg escapes a text array
    of each column. A finished run's output goes boxed (``[output]``), so that a null
    output stays the JSON null a ``transition`` statement writes, not an SQL NULL.
    A plan that records a call's outcome, reads a result, registers a wait or keeps its
    lease has no place here: it needs its own statement. What a sealed run records is
    sealed with ``sealer`` (:func:`sealed`)."""
    runs: list[dict[str, object]] = []
    events: list[dict[str, object]] = []
    for plan in plans:
        params = sealed(plan, sealer)
        assert plan.wait is None and params["lease_token"] is None, "needs its own statement"
        assert params["call_outcome"] is None and "result-read" not in params["kinds"]
        kinds = params["kinds"]
        output = params["output"]
        runs.append(
            {name: value for name, value in params.items() if name in _BATCHED}
            | {
                "seq": plan.run.seq - len(kinds),
                "count": len(kinds),
                "output": None if output is None else [output.obj],
            }
        )
        for n, (kind, step, event) in enumerate(
            zip(kinds, params["event_steps"], params["events"], strict=True), 1
        ):
            events.append(
                {"run": params["id"], "n": n, "kind": kind, "step": step, "detail": event.obj}
            )
    return {
        "runs": Jsonb(runs, dumps=_dumps),
        "events": Jsonb(events, dumps=_dumps),
        "now": now,
        "actor": actor,
    }


def sealed_outputs(
    sealer: Sealer | None, run: uuid.UUID, data_key: int | None, outputs: dict[str, JSON]
) -> dict[str, JSON]:
    """Steps' ``outputs`` as the run's row holds them: sealed under its ``data_key``, if
    its data is."""
    if data_key is None:
        return outputs
    custody = sealer_for(sealer, run).under(data_key)
    return {step: custody.seal(run, Purpose.OUTPUT, step, value) for step, value in outputs.items()}


def sealed(plan: Plan, sealer: Sealer | None) -> Statement:
    """The plan's statement as the run's row holds what it records: its steps' outputs,
    its output, the product's answer it settles and its events' personal fields sealed,
    if the run's data is (a run admitted without custody keeps its values as they are,
    so that its row stays readable)."""
    statement, data_key = plan.statement, plan.run.data_key
    if data_key is None:
        return statement
    run = statement["id"]
    custody = sealer_for(sealer, run).under(data_key)
    copy = statement.copy()
    copy["outputs"] = sealed_outputs(sealer, run, data_key, statement["outputs"])
    output = statement["output"]
    if output is not None:
        copy["output"] = Jsonb(custody.seal(run, Purpose.OUTPUT, "", output.obj))
    answer = statement["call_response"]
    if answer is not None:
        copy["call_response"] = custody.seal_sending(
            run, statement["event_step"], "response", answer
        )
    copy["events"] = [
        Jsonb(custody.seal_detail(run, step, event.obj))
        for step, event in zip(statement["event_steps"], statement["events"], strict=True)
    ]
    return copy


def _dumps(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), default=_plain)


def _plain(value: object) -> str:
    """Instants and ids as PostgreSQL reads them back into timestamptz and uuid columns."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no place in a batch")


def columns(
    definition: Definition | None,
    run: Claimed,
    transition: Transition | CancelledInFlight,
    lease: timedelta,
    keep_lease: bool,
    poll: timedelta | None,
    now: datetime,
    settlement: Settlement | None = None,
) -> tuple[Columns, Wait | None]:
    """The run's new columns and history event for a transition; and a wait to register.

    Every column a transition does not set goes back to its default (running, attempt 0,
    no timer, no lease, no outcome): each transition says only what it sets, so nothing
    is left over from the step before by omission.
    """
    changes, wait = _changes(definition, run, transition, lease, keep_lease, poll, now)
    params: Columns = {
        "id": run.id,
        "token": run.token,
        "now": now,
        "step": run.step,
        "event_step": run.step,
        "actor": run.actor,
        "state": RunState.RUNNING,
        "attempt": 0,
        "checks": 0,
        "timer_at": None,
        "wakes_to": None,
        "due_at": None,
        "lease_owner": None,
        "lease_token": None,
        "outputs": {},
        "completed": {},
        "outcome": None,
        "output": None,
        "failure_code": None,
        "hold_code": None,
        "detail": None,
        "ends": False,
        "honour_cancel": not isinstance(transition, CancelledInFlight),
        "call_status": settlement.status if settlement else None,
        "call_response": settlement.response if settlement else None,
        "call_outcome": settlement.outcome if settlement else None,
        **changes,
    }
    return params, wait


def _changes(
    definition: Definition | None,
    run: Claimed,
    transition: Transition | CancelledInFlight,
    lease: timedelta,
    keep_lease: bool,
    poll: timedelta | None,
    now: datetime,
) -> tuple[_Changes, Wait | None]:
    """What ``transition`` sets of the columns :func:`columns` resets, with its event: a
    match over every transition, so one added to ``steps.Transition`` and not handled
    here is a type error (``assert_never``), never a run committed with the defaults."""
    step = run.step
    completed = {step: format_instant(now)}
    match transition:
        case CancelledInFlight():
            return _cancelled(transition, step, completed), None
        case Advance():
            return _advanced(transition, run, lease if keep_lease else None, now), None
        case Finished(outcome=outcome, output=output):
            return {
                "state": RunState.FINISHED,
                "completed": completed,
                "outcome": outcome,
                "output": Jsonb(output),
                "ends": True,
                "kind": "finished",
                "event": {"outcome": outcome},
            }, None
        case Failed() | Held():
            return _stopped(transition, run.attempt), None
        case Expire():
            deadline = format_instant(run.deadline_at)
            return {
                "state": RunState.EXPIRED,
                "failure_code": FailureCode.DEADLINE_REACHED.value,
                "detail": f"the deadline {deadline} passed at step {step}",
                "ends": True,
                "kind": "expired",
                "event": {"deadline": deadline},
            }, None
        case Sleep(until=until):
            assert definition is not None
            return {
                "state": RunState.WAITING,
                "timer_at": until,
                "wakes_to": woke(definition, step).next,  # for the timer's batches
                "due_at": min(until, run.deadline_at),
                "kind": "waiting",
                "event": {"until": format_instant(until)},
            }, None
        case Await():
            assert definition is not None
            return _awaiting(definition, run, transition, poll, now)
        case Retry(at=at, detail=detail):
            return {
                "attempt": run.attempt,
                "checks": run.checks,  # a product that asks to wait has confirmed nothing
                "timer_at": at,
                "due_at": min(at, run.deadline_at),
                "kind": "retry-scheduled",
                "event": {"at": format_instant(at), "detail": detail},
            }, None
        case Verify(at=at, detail=detail):
            return {
                "attempt": run.attempt,
                "checks": run.checks + 1,
                "timer_at": at,
                "due_at": min(at, run.deadline_at),
                "kind": "verify-scheduled",
                "event": {"at": format_instant(at), "check": run.checks + 1, "detail": detail},
            }, None
        case Send() | Fetch() | Check():
            raise TypeError(f"{type(transition).__name__} is not committed by the store")
        case _:
            assert_never(transition)


def _cancelled(transition: CancelledInFlight, step: str, completed: dict[str, str]) -> _Changes:
    """The run ends cancelled as its call settles, keeping the call's answer if the step
    would have completed with it."""
    instead = transition.instead
    changes: _Changes = {
        "state": RunState.CANCELLED,
        "detail": transition.reason,
        "ends": True,
        "kind": "cancelled",
        "event": {"reason": transition.reason},
    }
    if isinstance(instead, Advance) and instead.has_output:
        changes["outputs"] = {step: instead.output}
        changes["completed"] = completed
    return changes


def _advanced(advance: Advance, run: Claimed, lease: timedelta | None, now: datetime) -> _Changes:
    """The step completed (with its output, if it has one) and the run goes on at the next:
    due at once, or, with a ``lease`` kept, held by its holder for that long meanwhile."""
    changes: _Changes = {
        "step": advance.next,
        "due_at": now if lease is None else now + lease,
        "lease_owner": None if lease is None else run.owner,
        "lease_token": None if lease is None else run.token,
        "completed": {run.step: format_instant(now)},
        "kind": "step-completed",
        "event": {"via": advance.via, "next": advance.next},
    }
    if advance.has_output:
        changes["outputs"] = {run.step: advance.output}
    return changes


def _stopped(transition: Failed | Held, attempt: int) -> _Changes:
    """A failure ends the run; a hold stops it for an operator, at the same attempt."""
    failed = isinstance(transition, Failed)
    return {
        "state": RunState.FAILED if failed else RunState.HELD,
        "failure_code": transition.code.value if failed else None,
        "hold_code": None if failed else transition.code.value,
        "detail": transition.detail,
        "ends": failed,
        "attempt": attempt,
        "kind": "failed" if failed else "held",
        "event": {"code": transition.code.value, "detail": transition.detail},
    }


def _awaiting(
    definition: Definition, run: Claimed, transition: Await, poll: timedelta | None, now: datetime
) -> tuple[_Changes, Wait]:
    """A wait-for begins: the run waits, and its wait is registered with the transition."""
    wait_step = definition.step(run.step)
    assert isinstance(wait_step, WaitFor)
    timeout = transition.timeout_at
    changes: _Changes = {
        "state": RunState.WAITING,
        "timer_at": timeout,
        "due_at": wait_due(now, timeout, run.deadline_at, poll),
        "kind": "waiting",
        "event": {
            "result": wait_step.result,
            "key": transition.key,
            "timeoutAt": format_instant(timeout) if timeout else None,
        },
    }
    wait: Wait = {
        "id": run.id,
        "step": run.step,
        "connection": wait_step.connection,
        "result": transition.result.name,
        "key": transition.key,
        "now": now,
        "timeout_at": timeout,
    }
    return changes, wait


def wait_due(
    now: datetime,
    timeout: datetime | None,
    deadline: datetime,
    poll: timedelta | None,
    jitter: Callable[[], float] = random.random,
) -> datetime:
    """When a waiting wait-for next falls due: its poll, its timeout or the deadline. The
    poll is spread by ±10% (``jitter`` gives a number in [0, 1]), so runs that began to
    wait in a burst do not all read their results in one burst every poll."""
    candidates = [deadline, *([timeout] if timeout else [])]
    if poll:
        candidates.append(now + poll * (0.9 + 0.2 * jitter()))
    return min(candidates)
