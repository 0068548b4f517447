"""A wait-for's polls in its history, against the store on a real PostgreSQL: each change
of answer is one ``result-polled`` event, written by the statement that gives the run
back (``release_wait``), so a wait of weeks polling every minute keeps a short history."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest
from psycopg import Connection

from registry_coordinator import store
from registry_coordinator.audit import histories
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.semantics.steps import Await, ReplyKind, on_due
from registry_coordinator.store import statements
from registry_coordinator.store.database import Database, Row, sync_connection
from tests.support import admit, database, events, reply

LEASE = timedelta(seconds=30)
POLL = timedelta(minutes=10)
URL = "http://127.0.0.1:9/v1/review-requests/rev-9/result"


async def waiting_run(db: Database) -> tuple[Definition, uuid.UUID]:
    """A run of await-review that began to wait, its next poll ten minutes away."""
    definition, run_id = await admit(db, "await-review", {"requestId": "rev-9"})
    run = await store.claim(db, "holder:1", LEASE)
    assert run is not None
    awaiting = on_due(definition, run.record(), run.step, False, None, run.now())
    assert isinstance(awaiting, Await)
    await store.commit(db, definition, run, awaiting, LEASE, poll=POLL)
    return definition, run_id


async def poll_once(
    db: Database, test: Connection[Row], answer: int | ReplyKind
) -> tuple[datetime, datetime]:
    """Claim the waiting run as its poll came (``test`` is the test's own connection, to
    make it due), and give it back with what the read found; when it was claimed and
    when it is due next."""
    test.execute("UPDATE runs SET due_at = now()")
    run = await store.claim(db, "holder:1", LEASE)
    assert run is not None
    found = reply(answer) if isinstance(answer, int) else reply(kind=answer)
    due = await store.release_wait(db, run, POLL, statements.result_polled(URL, found))
    return run.now(), due


@pytest.mark.trio
async def test_two_hundred_polls_with_three_answers_in_turn_leave_three_events(
    dsn: str,
) -> None:
    answers: list[int | ReplyKind] = [*[404] * 100, 503, *[404] * 99]
    async with database(dsn) as db:
        _, run_id = await waiting_run(db)
        with sync_connection(dsn) as test:
            instants = [await poll_once(db, test, answer) for answer in answers]
        verified = await histories.verify(db, run=run_id)
    history = events(dsn, str(run_id))
    assert [e["kind"] for e in history] == [
        "admitted",
        "waiting",
        "result-polled",
        "result-polled",
        "result-polled",
    ]
    assert [e["detail"] for e in history[2:]] == [
        {"url": URL, "status": status, "outcome": "response"} for status in (404, 503, 404)
    ]
    assert [e["seq"] for e in history] == [1, 2, 3, 4, 5]
    ats = [e["at"] for e in history]
    assert ats == sorted(ats)
    # A recorded poll moves the run's seq, and is not taken for a delivery that came
    # meanwhile: the run is due at its next poll, not at once.
    assert all(due >= claimed + POLL * 0.8 for claimed, due in instants)
    assert verified.breaks == [] and verified.events == 5


@pytest.mark.trio
async def test_an_answer_without_a_response_is_recorded_with_why_and_once(dsn: str) -> None:
    async with database(dsn) as db:
        _, run_id = await waiting_run(db)
        with sync_connection(dsn) as test:
            for answer in (ReplyKind.NOT_SENT, ReplyKind.NOT_SENT, ReplyKind.LOST, 404):
                await poll_once(db, test, answer)
    polled = [e["detail"] for e in events(dsn, str(run_id)) if e["kind"] == "result-polled"]
    assert polled == [
        {"url": URL, "status": None, "outcome": "not-sent", "detail": "test"},
        {"url": URL, "status": None, "outcome": "lost", "detail": "test"},
        {"url": URL, "status": 404, "outcome": "response"},
    ]


@pytest.mark.trio
async def test_a_delivery_while_the_poll_was_out_still_makes_the_run_due_at_once(
    dsn: str,
) -> None:
    async with database(dsn) as db:
        _, run_id = await waiting_run(db)
        with sync_connection(dsn) as conn:
            conn.execute("UPDATE runs SET due_at = now()")
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        delivery = store.Delivery("reviews", "evt-1", "review-decision", "rev-9", None)
        assert await store.record_delivery(db, delivery) == (True, 1)
        due = await store.release_wait(db, run, POLL, statements.result_polled(URL, reply(404)))
        verified = await histories.verify(db, run=run_id)
    assert due < run.now() + POLL * 0.5  # due at once, to read what was delivered
    history = events(dsn, str(run_id))
    assert [(e["seq"], e["kind"]) for e in history[2:]] == [
        (3, "result-delivered"),
        (4, "result-polled"),
    ]
    assert verified.breaks == []
