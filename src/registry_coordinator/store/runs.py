"""Runs in PostgreSQL: admission, claiming, committing transitions, reading status.

The store is the engine's and the HTTP layer's one way to the runs: every function
here runs named queries from ``sql/queries.sql``, each one short transaction. What
the statements say is built elsewhere, purely: the held run and what a commit gives
back in :mod:`claims`, the ``transition`` statement's parameters in
:mod:`statements`, lease bookkeeping in :mod:`leases`; the names callers use from
those are re-exported here, so ``store.Claimed`` and ``store.commit`` are one face.
What the reads here give the HTTP layer are typed records (:mod:`records`:
``store.RunStatus``, ``store.ArchivedRun``, ``store.HistoryEvent``, ``store.LateAnswer``),
re-exported with the functions that read them.

A transition and its history event are one statement, and it commits only while
the worker's claim still holds the run at the step it decided the transition for.
Every transition moves the run to another step or gives up the claim, so none is
ever applied twice — not even when an outage hid whether the first sending of its
statement committed — and none is half-applied. Within a run, events are numbered
by ``seq`` and never dated before the one before them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from psycopg.types.json import Jsonb

from registry_coordinator.authoring.canonical import JSON, canonical_bytes, digest_of
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.custody import NO_RUN, Purpose, Sealer, Unopenable, sealer_for
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.semantics.steps import Request, Transition
from registry_coordinator.store import keys, statements
from registry_coordinator.store.claims import (
    Ahead,
    CancelledInFlight,
    Claimed,
    Committed,
    LeaseLost,
    Settlement,
    actor,
)
from registry_coordinator.store.database import (
    Connection,
    Database,
    Queries,
    Row,
    RowsUnopenable,
)
from registry_coordinator.store.faults import crash_point
from registry_coordinator.store.leases import Holder, Holdings, extend_leases, take_over
from registry_coordinator.store.operator_actions import admission_reason, held_workflow_starts
from registry_coordinator.store.records import ArchivedRun, HistoryEvent, LateAnswer, RunStatus
from registry_coordinator.store.statements import wait_due

_log = logging.getLogger(__name__)

__all__ = [
    "DEFECTS_BEFORE_HOLD",
    "DEFECT_BACKOFF",
    "UNLEASED",
    "AdmissionHeld",
    "Admitted",
    "Ahead",
    "ArchivedRun",
    "CancelledInFlight",
    "ChangedBinding",
    "Claimed",
    "Committed",
    "Delivery",
    "HistoryEvent",
    "Holder",
    "Holdings",
    "KeyReused",
    "LateAnswer",
    "LeaseLost",
    "NextDue",
    "NothingSealed",
    "RunConcurrent",
    "RunFilter",
    "RunStatus",
    "Sealed",
    "Settlement",
    "Start",
    "StartArchived",
    "StartDigest",
    "StartOutcome",
    "actor",
    "admit",
    "admit_many",
    "advance_sleepers",
    "archived",
    "archived_page",
    "changed_bindings",
    "claim",
    "commit",
    "dispatch",
    "due_sleepers",
    "extend_leases",
    "feed_cursor",
    "held_longest",
    "history",
    "keep_late_answer",
    "late_answer",
    "leave_to_workers",
    "move_feed",
    "next_due",
    "record_defect",
    "record_delivery",
    "release",
    "release_wait",
    "runs_page",
    "sealed_at",
    "sealed_meanwhile",
    "sealed_request",
    "status",
    "store_definition",
    "take_over",
    "wait_due",
]


@dataclass(frozen=True)
class Admitted:
    run_id: uuid.UUID
    created: bool  # False: the caller's key named an existing run of the same start
    run: RunStatus  # as it stood when admitted or found


class KeyReused(CoordinatorError):
    """The caller's Idempotency-Key already started a run of another workflow, version or
    input."""

    def __init__(self, run_id: uuid.UUID) -> None:
        super().__init__(str(run_id))
        self.run_id = run_id


class RunConcurrent(CoordinatorError):
    """A run of the workflow's concurrency key is live (``run_id``; None: it ended as the
    start was refused, and a start again is admitted)."""

    def __init__(self, run_id: uuid.UUID | None) -> None:
        super().__init__(str(run_id))
        self.run_id = run_id


class StartArchived(CoordinatorError):
    """The caller's Idempotency-Key started a run, of the same start, that ended and was
    archived: it is not started again."""

    def __init__(self, run: ArchivedRun) -> None:
        super().__init__(str(run.id))
        self.run = run


class AdmissionHeld(CoordinatorError):
    """An operator holds admission: no new run is admitted (of ``workflow``, if it names
    the one workflow whose starts are held)."""

    def __init__(self, reason: str, actor: str, workflow: str | None = None) -> None:
        super().__init__(reason)
        self.reason, self.actor, self.workflow = reason, actor, workflow


@dataclass(frozen=True)
class StartDigest:
    """What a caller's Idempotency-Key stands for: the start as asked (the version as
    given, None when it named none, so a retry finds its run even after a new version
    is pinned), as a new run keeps it — keyed, with custody (:meth:`Sealer.digest`) —
    and as a run admitted before custody kept it (plain SHA-256), which a retry of its
    start still matches: worked out only for a key used before, off the admission path."""

    kept: str
    asked: bytes = field(repr=False)

    @classmethod
    def of(
        cls, sealer: Sealer | None, workflow: str, version: str | None, run_input: JSON
    ) -> StartDigest:
        asked = canonical_bytes({"workflow": workflow, "version": version, "input": run_input})
        return cls(digest_of(asked) if sealer is None else sealer.digest(asked), asked)

    def matches(self, stored: str) -> bool:
        return stored == self.kept or stored == digest_of(self.asked)


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


@dataclass(frozen=True)
class Start:
    """One start as admission takes it, checked: a pinned definition (and its digest),
    the caller's key, the run's input, the version as the caller asked for it (None: it
    named none), and the run's data subject (None: the workflow names none)."""

    definition: Definition
    digest: str
    start_key: str
    run_input: JSON
    asked_version: str | None = None
    subject: str | None = None
    concurrency: str | None = None  # its concurrency key (:meth:`Definition.concurrency_of`)
    search: dict[str, str] = field(default_factory=dict)  # :meth:`Definition.search_of`


#: What became of one start: its run, or why a single start would be refused.
StartOutcome = Admitted | KeyReused | StartArchived | AdmissionHeld | RunConcurrent


def _kept(sealer: Sealer | None, given: JSON) -> str:
    """A value a run is found by as the database keeps it: keyed, with custody, as a start
    digest is (:meth:`Sealer.digest`), so a dump cannot confirm a guessed id."""
    text = canonical_bytes(given)
    return digest_of(text) if sealer is None else sealer.digest(text)


def _concurrency_key(sealer: Sealer | None, workflow: str, key: str | None) -> str | None:
    """A concurrency key as ``runs.concurrency_key`` keeps it."""
    return None if key is None else _kept(sealer, {"workflow": workflow, "concurrency": key})


def _search_terms(sealer: Sealer | None, fields: Iterable[tuple[str, str]]) -> list[str]:
    """Search fields (name and value) as ``run_search`` keeps them, one term per field,
    distinct: the same name and value give the same term whichever workflow declares it."""
    return sorted({_kept(sealer, {"search": name, "value": value}) for name, value in fields})


async def admit(
    db: Database,
    definition: Definition,
    digest: str,
    caller: str,
    start_key: str,
    run_input: JSON,
    asked_version: str | None = None,
    *,
    run_id: uuid.UUID | None = None,
    traceparent: str | None = None,
    subject: str | None = None,
    concurrency: str | None = None,
    search: dict[str, str] | None = None,
) -> Admitted:
    """Create a run due at once (its id ``run_id``, else a new one), or find the one this
    caller's key already started (even while admission is held: that start was admitted
    before the hold); or raise why not, as :func:`admit_many` says. ``traceparent`` is the
    W3C trace context the run's spans continue (its request's span); ``subject`` its data
    subject, whose key seals its data (:meth:`Definition.subject_of`); ``concurrency`` its
    concurrency key, refused (:class:`RunConcurrent`) while a run of it is live; ``search``
    the fields it is found by (:meth:`Definition.search_of`). One statement when
    the run is created (one statement of a single row costs half what the batch's does for
    one), one more when not.
    """
    sealer = db.sealer
    started = StartDigest.of(sealer, definition.id, asked_version, run_input)
    run_id = run_id or uuid.uuid4()
    kept = _concurrency_key(sealer, definition.id, concurrency)
    terms = _search_terms(sealer, (search or {}).items())
    subjects = _Subjects(db, [subject])
    while True:
        [subject_key] = await subjects.resolve()
        data_key = subject_key or (sealer.key.id if sealer is not None else None)
        params = {
            "id": run_id,
            "digest": digest,
            "workflow_id": definition.id,
            "caller": caller,
            "start_key": start_key,
            "start_digest": started.kept,
            "input": Jsonb(_sealed_input(sealer, data_key, run_id, run_input)),
            "data_key": data_key,
            "subject_key": subject_key,
            "step": definition.workflow.start,
            "deadline": definition.workflow.deadline,
            "detail": {"workflow": definition.id, "version": definition.version, "digest": digest},
            "traceparent": traceparent,
            "concurrency_key": kept,
            "search_terms": terms,
        }
        gate = await db.row("admit_run", params)
        assert gate is not None, "schema 7 gives admission its row"
        if not subjects.stale(gate):
            break
    if gate["id"] is not None:
        return Admitted(gate["id"], True, RunStatus.from_row(gate))
    concurrent = {start_key: (definition.id, kept)}
    outcome = (await _not_admitted(db, caller, {start_key: started}, gate, concurrent))[start_key]
    if not isinstance(outcome, Admitted):
        raise outcome
    return outcome


class _Subjects:
    """The data keys starts are sealed under, one per start: its subject's (None: the
    shared key). A key erased while a start was admitted under it (``stale_keys``) is
    forgotten, and the next :meth:`resolve` finds the subject a new one."""

    def __init__(self, db: Database, subjects: Sequence[str | None]) -> None:
        self.db, self.subjects = db, subjects
        self.found: dict[str, int] = {}

    async def resolve(self) -> list[int | None]:
        for subject in self.subjects:
            if subject is not None and subject not in self.found:
                self.found[subject] = await keys.subject_key(self.db, subject)
        return [None if s is None else self.found[s] for s in self.subjects]

    def stale(self, gate: Row) -> bool:
        """Whether some start's key was erased meanwhile (it was then not admitted)."""
        stale = set(gate["stale_keys"])
        if stale:
            sealer = self.db.sealer
            assert sealer is not None, "only a subject's key is erased"
            for key in stale:
                sealer.forget(key)
        self.found = {s: k for s, k in self.found.items() if k not in stale}
        return bool(stale)


async def admit_many(
    db: Database,
    caller: str,
    starts: Sequence[Start],
    ids: Sequence[uuid.UUID] | None = None,
    traceparents: Sequence[str | None] | None = None,
) -> list[StartOutcome]:
    """Admit each start (their keys distinct) as :func:`admit` does one, in one statement
    that creates every run it can, and one read more only if some key was used before or
    admission is held: what became of each, in the order of ``starts``. A start this
    caller's key already started is that run (not created) if it is the same start, else
    :class:`KeyReused`; its archived run is :class:`StartArchived`; any other start, while
    admission is held, is :class:`AdmissionHeld`. The run each start creates has the id
    (else a new one) and keeps the trace context given for it in ``ids`` and
    ``traceparents``, in the order of ``starts``."""
    sealer = db.sealer
    asked = {
        start.start_key: StartDigest.of(
            sealer, start.definition.id, start.asked_version, start.run_input
        )
        for start in starts
    }
    assert len(asked) == len(starts), "each start of a batch has its own key"
    concurrent = {
        start.start_key: (
            start.definition.id,
            _concurrency_key(sealer, start.definition.id, start.concurrency),
        )
        for start in starts
    }
    run_ids = list(ids) if ids is not None else [uuid.uuid4() for _ in starts]
    terms = [_search_terms(sealer, start.search.items()) for start in starts]
    contexts = list(traceparents) if traceparents is not None else [None] * len(starts)
    subjects = _Subjects(db, [start.subject for start in starts])
    shared = sealer.key.id if sealer is not None else None
    outcomes: dict[str, StartOutcome] = {}
    pending = list(range(len(starts)))
    while True:
        subject_keys = await subjects.resolve()
        some = [starts[n] for n in pending]
        params = {
            "caller": caller,
            "ids": [run_ids[n] for n in pending],
            "traceparents": [contexts[n] for n in pending],
            "digests": [start.digest for start in some],
            "workflow_ids": [start.definition.id for start in some],
            "start_keys": [start.start_key for start in some],
            "start_digests": [asked[start.start_key].kept for start in some],
            "inputs": [
                Jsonb(_sealed_input(sealer, subject_keys[n] or shared, run_ids[n], start.run_input))
                for n, start in zip(pending, some, strict=True)
            ],
            "data_key": shared,
            "subject_keys": [subject_keys[n] for n in pending],
            "concurrency_keys": [concurrent[start.start_key][1] for start in some],
            "search_ids": [run_ids[n] for n in pending for _ in terms[n]],
            "search_terms": [term for n in pending for term in terms[n]],
            "steps": [start.definition.workflow.start for start in some],
            "deadlines": [start.definition.workflow.deadline for start in some],
        }
        rows = await db.rows("admit_runs", params)
        assert rows, "schema 7 gives admission its row"
        outcomes |= {
            row["start_key"]: Admitted(row["id"], True, RunStatus.from_row(row))
            for row in rows
            if row["id"] is not None
        }
        stale = set(rows[0]["stale_keys"])
        if not subjects.stale(rows[0]):
            break
        pending = [n for n in pending if subject_keys[n] in stale]  # they were not admitted
    left = {key: started for key, started in asked.items() if key not in outcomes}
    if left:
        outcomes |= await _not_admitted(db, caller, left, rows[0], concurrent)
    return [outcomes[key] for key in asked]


def _sealed_input(
    sealer: Sealer | None, data_key: int | None, run: uuid.UUID, run_input: JSON
) -> JSON:
    """A new run's input as its row holds it: sealed under ``data_key``, with custody."""
    if sealer is None or data_key is None:
        return run_input
    return sealer.under(data_key).seal(run, Purpose.INPUT, "", run_input)


async def _not_admitted(
    db: Database,
    caller: str,
    left: dict[str, StartDigest],
    gate: Row,
    concurrent: dict[str, tuple[str, str | None]],
) -> dict[str, StartOutcome]:
    """What became of the starts admission did not create, by key (``left`` gives each
    one's start digest, ``concurrent`` its workflow and kept concurrency key), with
    admission as it stood when they were refused (``gate``, with the workflows whose starts
    were held): one read of the runs, live or archived, that their keys started, one of
    those holds if some was, and one of the live runs of their concurrency keys if a start
    was refused for one."""
    keys = {"caller": caller, "start_keys": list(left)}
    found = {row["start_key"]: row for row in await db.rows("runs_by_start_keys", keys)}
    held = gate["held_workflows"]
    held_workflows = {
        hold.workflow: AdmissionHeld(hold.reason, hold.actor, hold.workflow)
        for hold in (await held_workflow_starts(db, held) if held else [])
    }
    outcomes: dict[str, StartOutcome] = {}
    for key, started in left.items():
        row = found.get(key)
        workflow = concurrent[key][0]
        if row is None and not gate["held"] and workflow in held_workflows:
            outcomes[key] = held_workflows[workflow]
            continue
        if row is None and not gate["held"]:
            continue  # refused for its concurrency key: a run of it is live
        if row is None:
            outcomes[key] = AdmissionHeld(admission_reason(db.sealer, gate), gate["actor"])
        elif not started.matches(row["start_digest"]):
            outcomes[key] = KeyReused(row["id"])
        elif row["archived_at"] is not None:
            outcomes[key] = StartArchived(ArchivedRun.from_row(row))
        else:
            outcomes[key] = Admitted(row["id"], False, RunStatus.from_row(row))
    refused = [key for key in left if key not in outcomes]
    if refused:
        asked = [concurrent[key] for key in refused]
        assert all(kept is not None for _, kept in asked), "a start is refused for a reason"
        params = {
            "workflow_ids": [workflow for workflow, _ in asked],
            "concurrency_keys": [kept for _, kept in asked],
        }
        live = {
            (row["workflow_id"], row["concurrency_key"]): row["id"]
            for row in await db.rows("live_runs_of_keys", params)
        }
        for key in refused:
            outcomes[key] = RunConcurrent(live.get(concurrent[key]))
    return outcomes


async def claim(db: Database, owner: str, lease: timedelta) -> Claimed | None:
    """The earliest due run, claimed for ``owner``. A run whose sealed data does not open
    is held at once (``data-unopenable``: it would not open at the next claim either) and
    the next one claimed instead."""
    while True:
        try:
            row = await db.row("claim_run", {"owner": owner, "lease": lease})
        except RowsUnopenable as exc:
            [(claimed, why)] = exc.refused
            await _hold_unopenable(db, claimed, why)
            continue
        return Claimed.from_row(row) if row else None


async def _hold_unopenable(db: Database, row: Row, why: Unopenable) -> None:
    """Hold the run claimed as ``row`` (its sealed columns as stored) for what does not
    open, its detail naming where and the custody code (never a value)."""
    code, token, owner = HoldCode.DATA_UNOPENABLE, row["lease_token"], row["lease_owner"]
    if await _defect(db, row["id"], token, actor(owner), code, str(why)):
        _log.error("run held (%s): %s", code, why, extra={"run": row["id"]})


@dataclass(frozen=True)
class NextDue:
    """Seconds until work falls due (zero or less: due now; ``None``: nothing is)."""

    work: float | None  # the earliest due run of any kind, for a worker
    sleeper: float | None  # the earliest wait-until the timer wakes itself


async def next_due(db: Database) -> NextDue:
    row = await db.row("next_due")
    assert row is not None
    return NextDue(row["seconds"], row["sleeper_seconds"])


#: The lease token of a run the timer's transaction holds by its row lock, not a lease:
#: never written (the timer keeps no lease), so no other claim can ever match it.
UNLEASED = uuid.UUID(int=0)


async def due_sleepers(conn: Connection, owner: str, limit: int) -> list[Claimed]:
    """Lock due wait-untils (up to ``limit``, oldest first) for the transaction ``conn``
    is in, as ``owner`` would claim them but leased to nobody: the lock holds them until
    it ends, and a crash before then leaves them asleep and due."""
    try:
        rows = await conn.rows("due_sleepers", {"owner": owner, "limit": limit})
    except RowsUnopenable as exc:  # a worker's claim holds each (see claim)
        await leave_to_workers(conn, [row["id"] for row, _ in exc.refused])
        rows = exc.opened
    return [replace(Claimed.from_row(row), token=UNLEASED) for row in rows]


async def advance_sleepers(
    conn: Connection, plans: list[statements.Plan], now: datetime, actor: str
) -> set[uuid.UUID]:
    """Commit many locked runs' plans (``statements.batch``) in one statement of the
    transaction ``conn`` is in; returns the runs it moved."""
    if not plans:
        return set()
    rows = await conn.rows("advance_sleepers", statements.batch(plans, now, actor, conn.sealer))
    return {row["run_id"] for row in rows}


async def leave_to_workers(conn: Connection, runs: Sequence[uuid.UUID]) -> None:
    """Locked wait-untils the timer could not take on: each is a worker's to wake."""
    if runs:
        await conn.execute("leave_to_workers", {"ids": list(runs)})


async def release(db: Database, run: Claimed, due_at: datetime | None) -> None:
    await db.execute("release_run", {"id": run.id, "token": run.token, "due_at": due_at})


class NothingSealed(CoordinatorError):
    """A run was to resend or ask about a call it never sealed: a defect of Coordinator's."""


@dataclass(frozen=True)
class Sealed:
    """A call's request as its step sealed it on its first sending: every later sending
    is these bytes again."""

    request: Request
    url: str
    #: The authority a prepared command was frozen under (a BReg action's), if it was one.
    prepared: dict[str, JSON] | None = None
    #: Whether a sending so far may have reached the product with no answer saying what
    #: became of it (a refusal of the next is then no evidence it never took effect).
    uncertain: bool = False
    #: The connection's binding it was last sent over (``ConnectionConfig.binding``), if
    #: known, and whether an operator said to send it next over the binding as it is now.
    binding: dict[str, JSON] | None = None
    rebind: bool = False


async def sealed_request(db: Database, run: Claimed) -> Sealed | None:
    """The request this run's call step sealed on its first sending, if it was sent."""
    return await sealed_at(db, run.id, run.step)


async def sealed_at(db: Database, run_id: uuid.UUID, step: str) -> Sealed | None:
    """The request a run's call ``step`` sealed on its first sending, if it did."""
    row = await db.row("sealed_request", {"id": run_id, "step": step})
    if row is None:
        return None
    body = bytes(row["body"]) if row["body"] is not None else None
    headers = tuple((str(k), str(v)) for k, v in row["headers"] or ())
    request = Request(row["method"], str(row["url"]), body, row["idempotency_key"], headers)
    return Sealed(
        request,
        str(row["url"]),
        row["prepared"],
        bool(row["uncertain"]),
        row["binding"],
        bool(row["rebind"]),
    )


@dataclass(frozen=True)
class ChangedBinding:
    """An unfinished run whose current step's latest sending went over a binding that its
    connection no longer has (``changed_bindings``)."""

    id: uuid.UUID
    state: RunState
    step: str
    binding: dict[str, JSON]  # what it was bound to (its base URL among it)

    @classmethod
    def from_row(cls, row: Row) -> ChangedBinding:
        return cls(row["id"], RunState(row["state"]), row["step"], row["binding"])


async def changed_bindings(
    db: Queries, current: dict[str, dict[str, JSON]], limit: int = 100
) -> list[ChangedBinding]:
    """The oldest ``limit`` unfinished runs whose request was sealed under a binding unlike
    ``current``'s (each configured connection's binding by name)."""
    rows = await db.rows("changed_bindings", {"current": Jsonb(current), "limit": limit})
    return [ChangedBinding.from_row(row) for row in rows]


async def dispatch(
    db: Database,
    run: Claimed,
    request: Request,
    url: str,
    prepared: dict[str, JSON] | None = None,
    binding: dict[str, JSON] | None = None,
) -> Claimed:
    """Seal the request (with the authority it was ``prepared`` under, if it was, and the
    connection's ``binding`` it goes over) and mark it dispatched, before it is sent
    (fenced like a transition)."""
    headers: JSON = [list(h) for h in request.headers] if request.headers else None
    body: JSON | bytes | None = request.body
    event_url = url  # the call-dispatched event's
    if run.data_key is not None:
        sealer = sealer_for(db.sealer, run.id).under(run.data_key)
        event_url = sealer.seal_field(run.id, run.step, "url", url)
        url = str(sealer.seal_sending(run.id, run.step, "url", url))
        if headers is not None:
            headers = sealer.seal_sending(run.id, run.step, "headers", headers)
        if body is not None:
            body = sealer.seal_sending(run.id, run.step, "body", body)
    params = {
        "id": run.id,
        "token": run.token,
        "attempt": run.attempt,
        "now": run.now(),
        "step": run.step,
        "method": request.method,
        "url": url,
        "event_url": event_url,
        "body": body,
        "key": request.idempotency_key,
        "headers": Jsonb(headers) if headers is not None else None,
        "prepared": Jsonb(prepared) if prepared is not None else None,
        "binding": Jsonb(binding) if binding is not None else None,
        "actor": run.actor,
    }
    if not await db.row("dispatch_call", params):
        raise LeaseLost(str(run.id))
    return _dispatched(run)


def _dispatched(run: Claimed) -> Claimed:
    return replace(run, seq=run.seq + 1, attempt=run.attempt + 1, dispatched=True)


async def sealed_meanwhile(db: Database, run: Claimed) -> Claimed | None:
    """After an outage hid whether ``dispatch`` committed: the run as dispatched if it
    did, None if it did not (``dispatch`` may be sent again: it cannot seal twice).
    Raises LeaseLost if the claim is gone, or was cancelled before the sealing."""
    row = await db.row("sealing", {"id": run.id, "token": run.token})
    if row is None or not row["holding"]:
        raise LeaseLost(str(run.id))
    if row["dispatched"] and row["attempt"] == run.attempt + 1:
        return _dispatched(run)
    return None


async def commit(
    db: Database,
    definition: Definition | None,
    run: Claimed,
    transition: Transition,
    lease: timedelta,
    *,
    keep_lease: bool = True,
    settlement: Settlement | None = None,
    no_answer: str = "",
    read: statements.Outcome | None = None,
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
    a call's outcome in the same statement, with the history event that says what became
    of the request, before the transition's (``statements.CALL_OUTCOMES``; ``no_answer``
    says why none came, for a call without one); if an operator asked to cancel while the
    call was in flight, the run is cancelled instead of going on. A settlement that an
    earlier sending of the same statement already recorded (an outage hid that it
    committed) is success, not a second transition. ``read`` is the read of a wait-for's
    result that completes its step (``statements.result_read``), its ``result-read``
    event written first in the same way. ``poll`` is how often a run entering a wait-for
    reads its result if no delivery wakes it. ``now`` is the instant the transition was
    decided at, which its history events record. ``definition`` may be None only to
    expire a run whose definition cannot be used.
    One statement does it all, but where a wait-for begins: then the wait is
    registered in the same transaction, which first takes the result key's lock
    (``lock_result_key``) so that a delivery committing meanwhile is not missed.
    """
    now = now or run.now()
    if settlement is None and run.dispatched:
        settlement = Settlement("interrupted")  # the holder stopped during the call
    outcome = (
        read if settlement is None else statements.call_outcome(settlement, run.attempt, no_answer)
    )
    planned = statements.plan(
        definition,
        run,
        transition,
        lease,
        keep_lease=keep_lease,
        poll=poll,
        now=now,
        settlement=settlement,
        go_on=go_on,
        outcome=outcome,
    )
    async with db.connection() as conn:
        if planned.wait is not None:
            return await _begin_waiting(conn, run, planned, planned.wait)
        if await conn.row("transition", statements.sealed(planned, conn.sealer)):
            return planned.committed()
        return await _unmoved(
            conn,
            definition,
            run,
            transition,
            lease,
            planned,
            keep_lease=keep_lease,
            poll=poll,
            now=now,
            settlement=settlement,
            outcome=outcome,
        )


async def _unmoved(
    conn: Connection,
    definition: Definition | None,
    run: Claimed,
    transition: Transition,
    lease: timedelta,
    planned: statements.Plan,
    *,
    keep_lease: bool,
    poll: timedelta | None,
    now: datetime,
    settlement: Settlement | None,
    outcome: statements.Outcome | None,
) -> Committed:
    """What became of a :func:`commit` whose ``transition`` statement (``planned``) moved
    nothing, on the same connection: its settlement committed already, by an earlier
    sending of the same statement (success); or an operator asked to cancel while the
    call was in flight, and the run is cancelled instead, with the same settlement;
    or the claim is gone (LeaseLost)."""
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
        return planned.committed()  # this very settlement committed before: already applied
    if not (why["holding"] and why["cancel_requested"]):
        raise LeaseLost(str(run.id))
    cancelled = CancelledInFlight("cancelled by an operator while a call was in flight", transition)
    instead = statements.plan(
        definition,
        run,
        cancelled,
        lease,
        keep_lease=keep_lease,
        poll=poll,
        now=now,
        settlement=settlement,
        go_on=False,
        outcome=outcome,
    )
    if not await conn.row("transition", statements.sealed(instead, conn.sealer)):
        raise LeaseLost(str(run.id))
    return instead.committed()


async def _begin_waiting(
    conn: Connection, run: Claimed, planned: statements.Plan, wait: dict[str, object]
) -> Committed:
    """Commit a transition that begins a wait-for and register its wait, in one
    transaction that first takes the result key's lock, as a delivery does."""
    async with conn.transaction():
        await conn.execute("lock_result_key", wait)
        if not await conn.row("transition", statements.sealed(planned, conn.sealer)):
            raise LeaseLost(str(run.id))
        crash_point("mid-transition")
        woken = await conn.row("register_wait", wait)
    # due at once, not as planned, if its result was delivered already
    return planned.committed(woken["due_at"] if woken is not None else None)


async def release_wait(
    db: Database, run: Claimed, poll: timedelta | None, polled: JSON = None
) -> datetime:
    """Give back a waiting run whose result was not final; returns when it is due next:
    at its poll, timeout or deadline — or at once if a delivery was recorded since the
    run was claimed (so each delivery is followed by one read, and no more). ``polled``
    is what the read found (``statements.result_polled``; None: it was not read), kept
    as a ``result-polled`` event in the same statement only if the wait's last recorded
    poll found otherwise: a wait polling every minute for weeks records each change of
    answer, not each poll (its ``url`` aside: the same for every poll, sealed afresh in
    a sealed run)."""
    now = run.now()
    due = wait_due(now, run.timer_at, run.deadline_at, poll)
    if polled is not None and run.data_key is not None:
        sealer = sealer_for(db.sealer, run.id).under(run.data_key)
        polled = sealer.seal_detail(run.id, run.step, polled)
    params = {
        "id": run.id,
        "token": run.token,
        "seq": run.seq,
        "due_at": due,
        "now": now,
        "polled": None if polled is None else Jsonb(polled),
        "actor": run.actor,
    }
    row = await db.row("release_wait", params)
    return row["due_at"] if row else due


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
        "payload": Jsonb(_sealed_payload(db.sealer, delivery)),
    }
    row = await db.row("record_delivery", params)
    assert row is not None
    return row["recorded"], row["woke"]


def _sealed_payload(sealer: Sealer | None, delivery: Delivery) -> JSON:
    """A delivery's payload as ``deliveries`` keeps it: sealed, with custody, under the
    shared key for its connection and event id (it names no run: it may come before its
    run waits, or for none)."""
    if sealer is None or delivery.payload is None:
        return delivery.payload
    return sealer.seal(
        NO_RUN, Purpose.PAYLOAD, delivery.connection, delivery.payload, delivery.event_id
    )


async def feed_cursor(db: Database, connection: str) -> str | None:
    """Where ``connection``'s result feed has been read up to (None: from its start)."""
    row = await db.row("feed_cursor", {"connection": connection})
    return row["cursor"] if row else None


async def move_feed(db: Database, connection: str, was: str | None, cursor: str | None) -> bool:
    """Move ``connection``'s feed cursor from ``was`` to ``cursor``; False, changing
    nothing, when another follower moved it from ``was`` meanwhile."""
    params = {"connection": connection, "was": was, "cursor": cursor}
    return await db.row("move_feed", params) is not None


#: Defects in a row at one step before the run is held rather than tried again.
DEFECTS_BEFORE_HOLD = 3
#: How long after its first defect a run is tried again; doubled after each.
DEFECT_BACKOFF = timedelta(seconds=1)


async def record_defect(db: Database, run: Claimed, code: HoldCode, detail: str) -> bool:
    """Let go of a run after an unexpected error of Coordinator's own: tried again later,
    or held with ``code`` (True) at the :data:`DEFECTS_BEFORE_HOLD`-th in a row, or at
    once if a call of it may have left or its sealed data does not open (``code``
    ``data-unopenable``: no retry mends it). Nothing is written if the claim is gone."""
    return await _defect(db, run.id, run.token, run.actor, code, detail)


async def _defect(
    db: Database, run: uuid.UUID, token: uuid.UUID, by: str, code: HoldCode, detail: str
) -> bool:
    limit = 1 if code is HoldCode.DATA_UNOPENABLE else DEFECTS_BEFORE_HOLD
    row = await db.row(
        "record_defect",
        {
            "id": run,
            "token": token,
            "limit": limit,
            "backoff": DEFECT_BACKOFF,
            "code": code.value,
            "detail": detail,
            "actor": by,
        },
    )
    return row is not None and row["state"] == RunState.HELD


async def keep_late_answer(db: Database, run: Claimed, status: int, body: bytes) -> bool:
    """Keep an answer that came back after this claim on the run was lost, on the
    sending's execution, noted in the history; False if there was nothing to keep it on."""
    if run.data_key is not None:
        sealer = sealer_for(db.sealer, run.id).under(run.data_key)
        body = bytes(sealer.seal_sending(run.id, run.step, "late_response", body))
    params = {
        "id": run.id,
        "step": run.step,
        "attempt": run.attempt,
        "status": status,
        "response": body,
        "actor": run.actor,
    }
    return await db.row("keep_late_answer", params) is not None


async def late_answer(db: Database, run_id: uuid.UUID, step: str) -> LateAnswer | None:
    """The latest 2xx answer to a call step that came back after its claim was lost."""
    row = await db.row("late_answer", {"id": run_id, "step": step})
    return None if row is None else LateAnswer.from_row(row)


async def held_longest(db: Database) -> float:
    """Seconds since the run held longest was held (0 when none is)."""
    row = await db.row("held_longest")
    assert row is not None
    return float(row["seconds"])


async def status(db: Database, run_id: uuid.UUID) -> RunStatus | None:
    row = await db.row("run_status", {"id": run_id})
    return None if row is None else RunStatus.from_row(row)


async def archived(db: Database, run_id: uuid.UUID) -> ArchivedRun | None:
    """Where run ``run_id`` went if it was archived."""
    row = await db.row("archived_run", {"run": run_id})
    return None if row is None else ArchivedRun.from_row(row)


async def archived_page(
    db: Database, which: RunFilter, after: tuple[datetime, uuid.UUID], limit: int
) -> list[ArchivedRun]:
    """Up to ``limit`` archived runs, newest first, admitted before the cursor ``after``
    (of ``which``, only the caller, readable workflows, state and workflow apply)."""
    rows = await db.rows("list_archived", {**_visible(which, after), "limit": limit})
    return [ArchivedRun.from_row(row) for row in rows]


def _visible(which: RunFilter, after: tuple[datetime, uuid.UUID]) -> dict[str, object]:
    """The parameters both listings share: whose runs, of which workflows, which state and
    workflow, after which cursor."""
    return {
        "caller": which.caller,
        "readable": None if which.readable is None else sorted(which.readable),
        "state": which.state,
        "workflow": which.workflow,
        "after_at": after[0],
        "after_id": after[1],
    }


async def history(db: Database, run_id: uuid.UUID) -> list[HistoryEvent]:
    """A run's history, its events' personal fields opened if they are sealed (null once
    their subject was erased)."""
    events = await db.rows("run_history", {"id": run_id})
    data_key = events[0]["data_key"] if events else None
    if data_key is not None:
        sealer = sealer_for(db.sealer, run_id)
        since = events[0]["sealed_from"] or 1  # a run sealed later: its events as written
        events = [
            {**row, "detail": sealer.open_detail(run_id, row["step"], row["detail"], data_key)}
            if row["seq"] >= since
            else row
            for row in events
        ]
    return [HistoryEvent.from_row(row) for row in events]


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing may show (a caller's own and the workflows its policies
    cover; None: no limit) and which it asks for (None: any).

    ``started_by`` asks for the runs one caller started, within what ``caller`` lets the
    listing show; ``since`` and ``until`` bound ``admitted_at`` as [since, until);
    ``text`` is found, ignoring case, in a run's start key or its input's JSON text,
    taken literally (``%`` and ``_`` are not wildcards); ``fields`` are search fields
    (name and value) a run's workflow declared and its input gave, every one exactly.
    """

    caller: str | None
    readable: frozenset[str] | None
    state: str | None = None
    workflow: str | None = None
    version: str | None = None
    started_by: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None
    fields: tuple[tuple[str, str], ...] = ()
    hold_code: str | None = None
    #: Runs at a call step over this connection: ``at_steps``, the (digest, step) pairs of
    #: the pinned definitions' calls over it, or where the step's sending went.
    connection: str | None = None
    at_steps: tuple[tuple[str, str], ...] = ()


def _containing(text: str | None) -> str | None:
    """A LIKE pattern matching ``text`` anywhere, its own wildcards and escape (the
    default, a backslash) taken literally."""
    if text is None:
        return None
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


async def runs_page(
    db: Database, which: RunFilter, after: tuple[datetime, uuid.UUID], limit: int
) -> list[RunStatus]:
    """Up to ``limit`` runs, newest first, admitted before the cursor ``after``."""
    rows = await db.rows(
        "list_runs",
        {
            **_visible(which, after),
            "version": which.version,
            "hold_code": which.hold_code,
            "connection": which.connection,
            "at_digests": [digest for digest, _ in which.at_steps],
            "at_steps": [step for _, step in which.at_steps],
            "started_by": which.started_by,
            "since": which.since,
            "until": which.until,
            "contains": _containing(which.text),
            "terms": _search_terms(db.sealer, which.fields) if which.fields else None,
            "limit": limit,
        },
    )
    return [RunStatus.from_row(row) for row in rows]
