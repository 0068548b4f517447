"""Runs in PostgreSQL: admission, claiming, committing transitions, reading status.

Each function is one short transaction built from the named queries in
``sql/queries.sql``. A transition and its history event are one statement, and
it commits only while the worker's claim still holds the run at the step it
decided the transition for. Every transition moves the run to another step or
gives up the claim, so none is ever applied twice — not even when an outage hid
whether the first sending of its statement committed — and none is half-applied.
Within a run, events are numbered by ``seq`` and never dated before the one
before them.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import trio
from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON, canonical_bytes, digest_of
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import format_instant, parse_instant
from registry_coordinator.authoring.workflow import WaitFor
from registry_coordinator.engine.database import Database, Row
from registry_coordinator.engine.faults import crash_point
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics.codes import HoldCode
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Expire,
    Failed,
    Finished,
    Held,
    Request,
    Retry,
    RunRecord,
    Sleep,
    Transition,
    on_due,
    woke,
)


@dataclass(frozen=True)
class Admitted:
    run_id: uuid.UUID
    created: bool  # False: the caller's key named an existing run of the same start


class KeyReused(CoordinatorError):
    """The caller's Idempotency-Key already started a run of another workflow, version or
    input."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(str(run_id))
        self.run_id = run_id


class AdmissionHeld(CoordinatorError):
    """An operator holds admission: no new run is admitted."""

    def __init__(self, reason: str, actor: str) -> None:
        super().__init__(reason)
        self.reason, self.actor = reason, actor


def start_digest(workflow: str, version: str | None, run_input: JSON) -> str:
    """What a caller's Idempotency-Key stands for: the start as asked (the version as
    given, None when it named none, so a retry finds its run even after a new version
    is pinned)."""
    asked = {"workflow": workflow, "version": version, "input": run_input}
    return digest_of(canonical_bytes(asked))


async def store_definition(
    db: Database, definition: Definition, digest: str, artifact: bytes
) -> None:
    await db.execute(
        "store_definition",
        {
            "digest": digest,
            "workflow_id": definition.id,
            "version": definition.version,
            "artifact": artifact,
        },
    )


async def admit(
    db: Database,
    definition: Definition,
    digest: str,
    caller: str,
    start_key: str,
    run_input: JSON,
    asked_version: str | None = None,
) -> Admitted:
    """Create a run due at once, or find the one this caller's key already started (even
    while admission is held: that start was admitted before the hold)."""
    started = start_digest(definition.id, asked_version, run_input)
    run_id = uuid.uuid4()
    params = {
        "id": run_id,
        "digest": digest,
        "workflow_id": definition.id,
        "caller": caller,
        "start_key": start_key,
        "start_digest": started,
        "input": Jsonb(run_input),
        "step": definition.workflow.start,
        "deadline": definition.workflow.deadline,
        "detail": {"workflow": definition.id, "version": definition.version, "digest": digest},
    }
    gate = await db.row("admit_run", params)
    assert gate is not None, "schema 7 gives admission its row"
    if gate["run_id"] is not None:
        return Admitted(run_id, True)
    existing = await db.row("run_by_start_key", {"caller": caller, "start_key": start_key})
    if existing is None:
        assert gate["held"], "a start is refused only when held, or for a key in use"
        raise AdmissionHeld(gate["reason"], gate["actor"])
    if existing["start_digest"] != started:
        raise KeyReused(existing["id"])
    return Admitted(existing["id"], False)


@dataclass
class Claimed:
    """A run this process holds, as it stands after the last committed transition."""

    id: uuid.UUID
    workflow_id: str
    digest: str
    input: JSON
    state: str
    step: str
    seq: int
    attempt: int
    timer_at: datetime | None
    outputs: dict[str, JSON]
    completed: dict[str, datetime]
    admitted_at: datetime
    deadline_at: datetime
    owner: str
    token: uuid.UUID  # this claim's lease token: every write is fenced on it
    dispatched: bool  # a call's request was sealed and may have left, with no outcome recorded
    clock: tuple[datetime, float] = field(repr=False)  # database time at claim, trio time then

    @classmethod
    def from_row(cls, row: Row) -> Claimed:
        return cls(
            id=row["id"],
            workflow_id=row["workflow_id"],
            digest=row["digest"],
            input=row["input"],
            state=row["state"],
            step=row["step"],
            seq=row["seq"],
            attempt=row["attempt"],
            timer_at=row["timer_at"],
            outputs=row["outputs"],
            completed={k: parse_instant(v) for k, v in row["completed"].items()},
            admitted_at=row["admitted_at"],
            deadline_at=row["deadline_at"],
            owner=row["lease_owner"],
            token=row["lease_token"],
            dispatched=row["dispatched_at"] is not None,
            clock=(row["now"], trio.current_time()),
        )

    def now(self) -> datetime:
        """The database's clock, read at claim and carried forward by Trio's monotonic one."""
        at, since = self.clock
        return (at + timedelta(seconds=trio.current_time() - since)).astimezone(UTC)

    def record(self) -> RunRecord:
        return RunRecord(
            str(self.id),
            self.input,
            self.admitted_at,
            self.deadline_at,
            self.outputs,
            self.completed,
        )

    @property
    def actor(self) -> str:
        return actor(self.owner)


@dataclass(frozen=True)
class Holder:
    """This process as the holder of claims (the runs it is advancing).

    ``name`` is the host and port the service listens on: a process restarted on the
    same host and port is the same holder, and takes over at once the claims its
    predecessor left when it died (:func:`take_over`). Every database session of the
    process carries ``session`` as its application_name; ``family`` starts the
    session name of every process of this holder (a digest: names are cut at 63 bytes).
    """

    name: str
    nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    @property
    def family(self) -> str:
        return "coordinator/" + hashlib.sha256(self.name.encode()).hexdigest()[:16] + "/"

    @property
    def session(self) -> str:
        return self.family + self.nonce


async def take_over(db: Database, holder: Holder) -> int:
    """Make the claims of this holder's dead predecessor due now; how many there were."""
    params = {"owner": holder.name, "family": holder.family, "session": holder.session}
    return await db.execute("take_over_claims", params)


def actor(owner: str) -> str:
    """How a process's transitions are recorded in the history: ``coordinator:<owner>``."""
    return "coordinator:" + owner


async def claim(db: Database, owner: str, lease: timedelta) -> Claimed | None:
    row = await db.row("claim_run", {"owner": owner, "lease": lease})
    return Claimed.from_row(row) if row else None


@dataclass(frozen=True)
class NextDue:
    """Seconds until work falls due (zero or less: due now; ``None``: nothing is)."""

    work: float | None  # the earliest due run of any kind, for a worker
    sleeper: float | None  # the earliest wait-until the timer wakes itself


async def next_due(db: Database) -> NextDue:
    row = await db.row("next_due")
    assert row is not None
    return NextDue(row["seconds"], row["sleeper_seconds"])


async def wake_sleepers(db: Database, actor: str, limit: int) -> list[float]:
    """Take every due wait-until (up to ``limit``) on to its next step in one statement;
    returns how late each was, in seconds."""
    rows = await db.rows("wake_sleepers", {"actor": actor, "limit": limit})
    return [row["lateness"] for row in rows]


async def release(db: Database, run: Claimed, due_at: datetime | None) -> None:
    await db.execute("release_run", {"id": run.id, "token": run.token, "due_at": due_at})


async def extend_leases(db: Database, tokens: list[uuid.UUID], lease: timedelta) -> int:
    return await db.execute("extend_leases", {"tokens": tokens, "lease": lease})


class Holdings:
    """The claims this process is working on, counted: a worker and the call task it
    hands a run to may hold one claim at once. The lease keeper extends these only."""

    def __init__(self) -> None:
        self._counts: Counter[uuid.UUID] = Counter()

    def take(self, token: uuid.UUID) -> None:
        self._counts[token] += 1

    def let_go(self, token: uuid.UUID) -> None:
        self._counts[token] -= 1
        if self._counts[token] <= 0:
            del self._counts[token]

    @contextmanager
    def holding(self, token: uuid.UUID) -> Iterator[None]:
        self.take(token)
        try:
            yield
        finally:
            self.let_go(token)

    def tokens(self) -> list[uuid.UUID]:
        return list(self._counts)


class LeaseLost(CoordinatorError):
    """Another worker took the run over (this one's lease ran out); nothing was written."""


async def sealed_request(db: Database, run: Claimed) -> tuple[Request, str] | None:
    """The request and URL this run's call step sealed on its first sending, if it was sent."""
    row = await db.row("sealed_request", {"id": run.id, "step": run.step})
    if row is None:
        return None
    body = bytes(row["body"]) if row["body"] is not None else None
    url = str(row["url"])
    return Request(row["method"], url, body, row["idempotency_key"]), url


async def dispatch(db: Database, run: Claimed, request: Request, url: str) -> Claimed:
    """Seal the request and mark it dispatched, before it is sent (fenced like a transition)."""
    params = {
        "id": run.id,
        "token": run.token,
        "now": run.now(),
        "step": run.step,
        "method": request.method,
        "url": url,
        "body": request.body,
        "key": request.idempotency_key,
        "actor": run.actor,
    }
    if not await db.row("dispatch_call", params):
        raise LeaseLost(str(run.id))
    return replace(run, seq=run.seq + 1, attempt=run.attempt + 1, dispatched=True)


@dataclass(frozen=True)
class Settlement:
    """What became of one sending of a call, recorded on its execution row."""

    outcome: str  # response, not-sent, lost, interrupted, cancelled
    status: int | None = None
    response: bytes | None = None


#: What a holder may commit in the same statement as the Advance before it: entering these
#: steps needs neither a product nor a wait registered, so nothing lies between them.
TAKEN_AT_ONCE = (Advance, Finished, Failed, Expire, Sleep)


@dataclass(frozen=True)
class Ahead:
    """What the run's next step does, decided while committing the steps before it (a
    call to send, a wait to register): the holder takes it from here, not decided twice."""

    transition: Transition | None
    at: datetime  # the instant it was decided at, which its commit records


@dataclass(frozen=True)
class Committed:
    run: Claimed  # the run as it stands now
    due_at: datetime | None  # when it next falls due, for the timer
    taken: tuple[tuple[str, Transition | Cancelled], ...]  # (step, transition), in order
    outcome: str | None = None  # the outcome, when the run finished
    held: bool = False  # the holder still holds the run and should take its next step
    ahead: Ahead | None = None  # the next step, when it was decided (``go_on``)


async def commit(
    db: Database,
    definition: Definition | None,
    run: Claimed,
    transition: Transition,
    lease: timedelta,
    *,
    keep_lease: bool = True,
    settlement: Settlement | None = None,
    poll: timedelta | None = None,
    now: datetime | None = None,
    go_on: bool = False,
) -> Committed:
    """Apply one transition with its history event, atomically, as the run's holder.

    An Advance keeps the lease (the holder goes straight on) unless ``keep_lease`` is
    false, when the run is left due at once for any worker. With ``go_on``, the steps
    that follow an Advance are taken in the same statement for as long as they need
    nothing from outside (a choose, a finish, a wait-until): each still gets its own
    history event, and a crash commits all of them or none. A ``settlement`` records
    a call's outcome in the same statement; if an operator asked to cancel while the
    call was in flight, the run is cancelled instead of going on. A settlement that an
    earlier sending of the same statement already recorded (an outage hid that it
    committed) is success, not a second transition. ``poll`` is how often a run
    entering a wait-for reads its result if no delivery wakes it. ``now`` is the
    instant the transition was decided at, which its history events record.
    ``definition`` may be None only to expire a run whose definition cannot be used.
    One statement does it all, but where a wait-for begins: then the wait is
    registered in the same transaction, which first takes the result key's lock
    (``lock_result_key``) so that a delivery committing meanwhile is not missed.
    """
    now = now or run.now()
    if settlement is None and run.dispatched:
        settlement = Settlement("interrupted")  # the holder stopped during the call
    params, wait = _columns(definition, run, transition, lease, keep_lease, poll, now, settlement)
    taken: list[tuple[str, Transition | Cancelled]] = [(run.step, transition)]
    events = [params]
    after = _after(run, params, now)
    ahead = None
    while go_on and isinstance(taken[-1][1], Advance) and params["lease_token"] is not None:
        assert definition is not None
        following = on_due(definition, after.record(), after.step, False, None, now)
        if not isinstance(following, TAKEN_AT_ONCE):
            ahead = Ahead(following, now)
            break
        params, _ = _columns(definition, after, following, lease, keep_lease, poll, now)
        taken.append((after.step, following))
        events.append(params)
        after = _after(after, params, now)
    statement = _statement(events, leaves_wait=run.state == "waiting")
    due_at = params["due_at"]
    async with db.connection() as conn:
        if wait is not None:
            async with conn.transaction():
                await conn.execute("lock_result_key", wait)
                if not await conn.row("transition", statement):
                    raise LeaseLost(str(run.id))
                crash_point("mid-transition")
                woken = await conn.row("register_wait", wait)
                if woken is not None:
                    due_at = woken["due_at"]  # delivered already: read it at once
        elif not await conn.row("transition", statement):
            why = await conn.row(
                "unmoved",
                {"id": run.id, "token": run.token, "step": run.step, "attempt": run.attempt},
            )
            if why is None or settlement is None:
                raise LeaseLost(str(run.id))
            if settlement.outcome != "interrupted" and (why["outcome"], why["status"]) == (
                settlement.outcome,
                settlement.status,
            ):
                pass  # this very settlement committed before: already applied
            elif why["holding"] and why["cancel_requested"]:
                cancelled = Cancelled(
                    "cancelled by an operator while a call was in flight", transition
                )
                params, _ = _columns(
                    definition, run, cancelled, lease, keep_lease, poll, now, settlement
                )
                if not await conn.row("transition", _statement([params], leaves_wait=False)):
                    raise LeaseLost(str(run.id))
                taken, after, ahead = [(run.step, cancelled)], _after(run, params, now), None
                due_at = params["due_at"]
            else:
                raise LeaseLost(str(run.id))
    return Committed(
        after,
        due_at,
        tuple(taken),
        params["outcome"],
        params["lease_token"] is not None,
        ahead,
    )


def _after(run: Claimed, params: dict[str, Any], now: datetime) -> Claimed:
    """The run as a transition's columns leave it."""
    return replace(
        run,
        seq=run.seq + 1,
        state=params["state"],
        step=params["step"],
        attempt=params["attempt"],
        timer_at=params["timer_at"],
        dispatched=False,
        outputs={**run.outputs, **params["outputs"]},
        completed={**run.completed, **dict.fromkeys(params["completed"], now)},
    )


#: The parameters of a ``transition`` statement that belong to its first transition.
_AS_THE_FIRST_HAS_THEM = (
    "token",
    "event_step",
    "honour_cancel",
    "call_status",
    "call_response",
    "call_outcome",
)


def _statement(transitions: list[dict[str, Any]], *, leaves_wait: bool) -> dict[str, Any]:
    """One ``transition`` statement for transitions taken one after another: the run's
    columns as the last leaves them, what each step recorded, an event for each, and the
    settled call (if any) and the cancellation check as the first has them. With
    ``leaves_wait`` the run was waiting, and any wait it had registered is dropped."""
    first, last = transitions[0], transitions[-1]
    merged = {name: value for name, value in last.items() if name not in ("kind", "event")}
    merged["leaves_wait"] = leaves_wait
    merged.update({name: first[name] for name in _AS_THE_FIRST_HAS_THEM})
    merged.update(
        outputs={k: v for t in transitions for k, v in t["outputs"].items()},
        completed={k: v for t in transitions for k, v in t["completed"].items()},
        kinds=[t["kind"] for t in transitions],
        event_steps=[t["event_step"] for t in transitions],
        events=[Jsonb(t["event"]) for t in transitions],
    )
    return merged


def _columns(
    definition: Definition | None,
    run: Claimed,
    transition: Transition | Cancelled,
    lease: timedelta,
    keep_lease: bool,
    poll: timedelta | None,
    now: datetime,
    settlement: Settlement | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's new columns and history event for a transition; and a wait to register."""
    step = run.step
    params: dict[str, Any] = {
        "id": run.id,
        "token": run.token,
        "now": now,
        "step": step,
        "event_step": step,
        "actor": run.actor,
        "state": "running",
        "attempt": 0,
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
        "honour_cancel": not isinstance(transition, Cancelled),
        "call_status": settlement.status if settlement else None,
        "call_response": settlement.response if settlement else None,
        "call_outcome": settlement.outcome if settlement else None,
    }
    wait: dict[str, Any] | None = None
    if isinstance(transition, Cancelled):
        advanced = transition.instead
        if isinstance(advanced, Advance) and advanced.has_output:
            params.update(outputs={step: advanced.output}, completed={step: format_instant(now)})
        params.update(
            state="cancelled",
            detail=transition.reason,
            ends=True,
            kind="cancelled",
            event={"reason": transition.reason},
        )
    elif isinstance(transition, Advance):
        params.update(
            step=transition.next,
            due_at=now + lease if keep_lease else now,
            lease_owner=run.owner if keep_lease else None,
            lease_token=run.token if keep_lease else None,
            completed={step: format_instant(now)},
            kind="step-completed",
            event={"via": transition.via, "next": transition.next},
        )
        if transition.has_output:
            params["outputs"] = {step: transition.output}
    elif isinstance(transition, Finished):
        params.update(
            state="finished",
            completed={step: format_instant(now)},
            outcome=transition.outcome,
            output=Jsonb(transition.output),
            ends=True,
            kind="finished",
            event={"outcome": transition.outcome},
        )
    elif isinstance(transition, Failed | Held):
        failed = isinstance(transition, Failed)
        params.update(
            state="failed" if failed else "held",
            failure_code=transition.code.value if failed else None,
            hold_code=None if failed else transition.code.value,
            detail=transition.detail,
            ends=failed,
            attempt=run.attempt,
            kind="failed" if failed else "held",
            event={"code": transition.code.value, "detail": transition.detail},
        )
    elif isinstance(transition, Expire):
        params.update(
            state="expired",
            failure_code="deadline-reached",
            detail=f"the deadline {format_instant(run.deadline_at)} passed at step {step}",
            ends=True,
            kind="expired",
            event={"deadline": format_instant(run.deadline_at)},
        )
    elif isinstance(transition, Sleep):
        assert definition is not None
        params.update(
            state="waiting",
            timer_at=transition.until,
            wakes_to=woke(definition, step).next,  # for the timer's batches (wake_sleepers)
            due_at=min(transition.until, run.deadline_at),
            kind="waiting",
            event={"until": format_instant(transition.until)},
        )
    elif isinstance(transition, Await):
        assert definition is not None
        wait_step = definition.step(step)
        assert isinstance(wait_step, WaitFor)
        timeout = transition.timeout_at
        params.update(
            state="waiting",
            timer_at=timeout,
            due_at=wait_due(now, timeout, run.deadline_at, poll),
            kind="waiting",
            event={
                "result": wait_step.result,
                "key": transition.key,
                "timeoutAt": format_instant(timeout) if timeout else None,
            },
        )
        wait = {
            "id": run.id,
            "step": step,
            "connection": wait_step.connection,
            "result": transition.result.name,
            "key": transition.key,
            "now": now,
            "timeout_at": timeout,
        }
    elif isinstance(transition, Retry):
        params.update(
            attempt=run.attempt,
            timer_at=transition.at,
            due_at=min(transition.at, run.deadline_at),
            kind="retry-scheduled",
            event={"at": format_instant(transition.at), "detail": transition.detail},
        )
    else:
        raise TypeError(f"{type(transition).__name__} is not committed by the store")
    return params, wait


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


async def release_wait(db: Database, run: Claimed, poll: timedelta | None) -> datetime:
    """Give back a waiting run whose result was not final; returns when it is due next:
    at its poll, timeout or deadline — or at once if a delivery was recorded since the
    run was claimed (so each delivery is followed by one read, and no more)."""
    due = wait_due(run.now(), run.timer_at, run.deadline_at, poll)
    row = await db.row(
        "release_wait", {"id": run.id, "token": run.token, "seq": run.seq, "due_at": due}
    )
    return row["due_at"] if row else due


@dataclass(frozen=True)
class Cancelled:
    """A cancellation an operator asked for while a call was in flight, taking effect as
    that call settles; ``instead`` is what the run would otherwise have done."""

    reason: str
    instead: Transition


@dataclass(frozen=True)
class Delivery:
    """A result webhook as the store records it."""

    connection: str
    event_id: str
    result: str
    key: str
    payload: JSON


async def record_delivery(db: Database, delivery: Delivery) -> tuple[bool, int]:
    """Keep a delivery once and wake the runs waiting for it; whether it was new, and how
    many runs it woke. One statement, which takes the result key's lock (see :func:`commit`)."""
    params = {
        "connection": delivery.connection,
        "event_id": delivery.event_id,
        "result": delivery.result,
        "key": delivery.key,
        "payload": Jsonb(delivery.payload),
    }
    row = await db.row("record_delivery", params)
    assert row is not None
    return row["recorded"], row["woke"]


#: Defects in a row at one step before the run is held rather than tried again.
DEFECTS_BEFORE_HOLD = 3
#: How long after its first defect a run is tried again; doubled after each.
DEFECT_BACKOFF = timedelta(seconds=1)


async def record_defect(db: Database, run: Claimed, code: HoldCode, detail: str) -> bool:
    """Let go of a run after an unexpected error of Coordinator's own: tried again later,
    or held with ``code`` (True) at the :data:`DEFECTS_BEFORE_HOLD`-th in a row, or at
    once if a call of it may have left. Nothing is written if the claim is gone."""
    row = await db.row(
        "record_defect",
        {
            "id": run.id,
            "token": run.token,
            "limit": DEFECTS_BEFORE_HOLD,
            "backoff": DEFECT_BACKOFF,
            "code": code.value,
            "detail": detail,
            "actor": run.actor,
        },
    )
    return row is not None and row["state"] == "held"


async def keep_late_answer(db: Database, run: Claimed, status: int, body: bytes) -> bool:
    """Keep an answer that came back after this claim on the run was lost, on the
    sending's execution, noted in the history; False if there was nothing to keep it on."""
    params = {
        "id": run.id,
        "step": run.step,
        "attempt": run.attempt,
        "status": status,
        "response": body,
        "actor": run.actor,
    }
    return await db.row("keep_late_answer", params) is not None


async def late_answer(db: Database, run_id: uuid.UUID, step: str) -> Row | None:
    """The latest 2xx answer to a call step that came back after its claim was lost."""
    return await db.row("late_answer", {"id": run_id, "step": step})


async def status(db: Database, run_id: uuid.UUID) -> Row | None:
    return await db.row("run_status", {"id": run_id})


async def history(db: Database, run_id: uuid.UUID) -> list[Row]:
    return await db.rows("run_history", {"id": run_id})


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing may show (a caller's own and the workflows its policies
    cover; None: no limit) and which it asks for."""

    caller: str | None
    readable: frozenset[str] | None
    state: str | None = None
    workflow: str | None = None


async def runs_page(
    db: Database, which: RunFilter, after: tuple[datetime, uuid.UUID], limit: int
) -> list[Row]:
    """Up to ``limit`` runs, newest first, admitted before the cursor ``after``."""
    return await db.rows(
        "list_runs",
        {
            "caller": which.caller,
            "readable": None if which.readable is None else sorted(which.readable),
            "state": which.state,
            "workflow": which.workflow,
            "after_at": after[0],
            "after_id": after[1],
            "limit": limit,
        },
    )
