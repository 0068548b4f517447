"""Races between a run's holder, webhook deliveries and the timer, forced with two connections.

Each test stops one side at a chosen statement — inside its transaction, its locks held
(:mod:`tests.support.interleave`) — runs the rival on another connection until PostgreSQL shows
it waiting for a lock (or it finished), then lets the first side go. Real PostgreSQL,
the store's own statements; only the moment each runs is chosen by the test.
"""

from __future__ import annotations

import json
import math
import uuid
from datetime import datetime, timedelta
from functools import partial

import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.steps import Await, Send, on_due, result_arrived, settle
from registry_coordinator.store.claims import Claimed
from registry_coordinator.store.database import Database, Unavailable, sync_connection
from tests.support import (
    Failing,
    Paused,
    admit,
    breg_record,
    database,
    events,
    reply,
    rival_while_paused,
    rival_while_uncommitted,
)

LEASE = timedelta(seconds=30)
POLL = timedelta(minutes=10)


def at_once(due: datetime, run: Claimed) -> bool:
    """Due now, not at the poll ten minutes away. The database's now() and the run's
    clock (the database's time at the claim, carried on by this process's) differ by the
    claim's latency, which load stretches: compare with the poll, not with an instant."""
    return due < run.now() + POLL / 2


#: The review request the runs wait on (Casework's ids are UUIDs).
KEY = "3f6c1e2a-7b4d-4e8f-9a15-0c2d4b6e8f10"
#: Casework's result for it, decided: as ``GET /v1/review-requests/{KEY}/result`` answers.
DECIDED = {
    "resultId": "b1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f",
    "requestId": KEY,
    "subject": {"source": "applications-registry", "type": "application", "id": "a-1"},
    "policy": {"id": "application-review", "version": "1", "digest": "sha256:" + "0" * 64},
    "submissionDigest": "sha256:" + "1" * 64,
    "status": "approved",
    "completedAt": "2026-12-02T10:00:00Z",
    "availableUntil": "2027-01-01T10:00:00Z",
}


def delivery(event_id: str = "evt-1") -> store.Delivery:
    return store.Delivery("reviews", event_id, "review-decision", KEY, None)


async def claimed_wait(db: Database) -> tuple[Definition, store.Claimed, Await]:
    """A run of await-review, claimed at its wait-for, about to begin waiting."""
    definition, _ = await admit(db, "await-review", {"requestId": KEY})
    run = await store.claim(db, "holder:1", LEASE)
    assert run is not None
    waiting = on_due(definition, run.record(), run.step, False, None, run.now())
    assert isinstance(waiting, Await)
    return definition, run, waiting


async def waiting_and_claimed(db: Database) -> tuple[Definition, store.Claimed]:
    """A run waiting for its review, claimed again as if its poll had come: a holder is
    about to read its result."""
    definition, run, waiting = await claimed_wait(db)
    await store.commit(db, definition, run, waiting, LEASE, poll=POLL)
    with sync_connection(db.dsn) as conn:
        conn.execute("UPDATE runs SET due_at = now() WHERE id = %s", (run.id,))
    reading = await store.claim(db, "holder:2", LEASE)
    assert reading is not None and reading.state == "waiting"
    return definition, reading


async def due_now(db: Database, run_id: uuid.UUID) -> bool:
    with sync_connection(db.dsn) as conn:
        query = "SELECT due_at <= clock_timestamp() AS due FROM runs WHERE id = %s"
        row = conn.execute(query, (run_id,)).fetchone()
    return row is not None and row["due"] is True


@pytest.mark.trio
async def test_a_delivery_while_a_run_begins_to_wait_wakes_it(dsn: str) -> None:
    """The run's transaction has registered its wait and looked for deliveries (none yet),
    and not committed, when a delivery comes: the delivery waits for that transaction,
    then sees the wait and wakes the run. (Without the key's lock each missed the other,
    and the run slept until its poll, ten minutes by default.)"""
    async with database(dsn, size=4) as db:
        definition, run, waiting = await claimed_wait(db)
        paused = Paused(db, after="register_wait")
        blocked, recorded = await rival_while_paused(
            paused,
            partial(store.commit, paused, definition, run, waiting, LEASE, poll=POLL),
            partial(store.record_delivery, db, delivery()),
            db,
        )
        assert blocked, "the delivery did not wait for the wait's transaction"
        assert recorded == (True, 1)
        assert await due_now(db, run.id)
    assert [e["kind"] for e in events(dsn, str(run.id))][-1] == "result-delivered"


@pytest.mark.trio
async def test_a_run_beginning_to_wait_while_a_delivery_commits_sees_it(dsn: str) -> None:
    """The other order: a delivery is recorded but not committed when the run begins to
    wait. The run's transaction waits for it, finds the delivery, and the run is due at
    once — and the engine is told so (Committed.due_at), not the poll."""
    async with database(dsn, size=4) as db:
        definition, run, waiting = await claimed_wait(db)
        blocked, committed = await rival_while_uncommitted(
            db,
            lambda held: store.record_delivery(held, delivery()),
            partial(store.commit, db, definition, run, waiting, LEASE, poll=POLL),
        )
        assert blocked, "the wait did not wait for the delivery's transaction"
        assert committed.due_at is not None and at_once(committed.due_at, run)
        assert await due_now(db, run.id)


@pytest.mark.trio
async def test_a_result_delivered_before_the_wait_makes_it_due_at_once(dsn: str) -> None:
    """No race: delivered first, then the wait begins. The engine hears the run is due
    now (it used to be told the poll, so the timer slept until its sweep)."""
    async with database(dsn) as db:
        definition, run, waiting = await claimed_wait(db)
        assert await store.record_delivery(db, delivery()) == (True, 0)
        committed = await store.commit(db, definition, run, waiting, LEASE, poll=POLL)
        assert committed.due_at is not None and at_once(committed.due_at, run)
        assert await due_now(db, run.id)


@pytest.mark.trio
async def test_a_delivery_while_a_read_is_given_back_makes_the_run_due_at_once(dsn: str) -> None:
    """A holder read the result (still pending) and gives the run back while a delivery's
    transaction holds the run's row: the release waits, then sees that a delivery came
    since the run was claimed, and leaves it due at once — not at its poll."""
    async with database(dsn, size=4) as db:
        _, reading = await waiting_and_claimed(db)
        blocked, due = await rival_while_uncommitted(
            db,
            lambda held: store.record_delivery(held, delivery()),
            partial(store.release_wait, db, reading, POLL),
        )
        assert blocked, "the release did not wait for the delivery's transaction"
        assert at_once(due, reading)
        assert await due_now(db, reading.id)


@pytest.mark.trio
async def test_a_delivery_after_a_read_was_given_back_makes_the_run_due_at_once(
    dsn: str,
) -> None:
    async with database(dsn) as db:
        _, reading = await waiting_and_claimed(db)
        due = await store.release_wait(db, reading, POLL)
        assert due > reading.now() + POLL * 0.85  # the poll, spread by its jitter
        assert await store.record_delivery(db, delivery()) == (True, 1)
        assert await due_now(db, reading.id)


@pytest.mark.trio
async def test_a_read_given_back_without_a_delivery_waits_for_its_poll(dsn: str) -> None:
    """A delivery recorded before the run was claimed was what the read answered: giving
    the run back leaves it to its poll (it used to be due again at once, and was read
    again and again for a second: one read per delivery, no more)."""
    async with database(dsn) as db:
        definition, run, waiting = await claimed_wait(db)
        await store.commit(db, definition, run, waiting, LEASE, poll=POLL)
        assert await store.record_delivery(db, delivery()) == (True, 1)
        reading = await store.claim(db, "holder:2", LEASE)
        assert reading is not None
        due = await store.release_wait(db, reading, POLL)
        assert due > reading.now() + POLL * 0.85
        assert not await due_now(db, reading.id)


@pytest.mark.trio
async def test_a_delivery_racing_the_runs_finish_never_wakes_it_again(dsn: str) -> None:
    """The holder has committed the final result and the finish (not yet visible) when a
    delivery, which still sees the wait, reaches for the run's row. Once it has the row,
    the run is finished: the delivery leaves it alone. (It used to make the finished run
    due, and a worker finished it a second time.)"""
    async with database(dsn, size=4) as db:
        definition, reading = await waiting_and_claimed(db)
        final = result_arrived(definition, reading.step, DECIDED)
        assert final is not None
        finished: list[store.Committed] = []

        async def finish(held: Database) -> None:
            finished.append(await store.commit(held, definition, reading, final, LEASE, go_on=True))

        blocked, recorded = await rival_while_uncommitted(
            db, finish, partial(store.record_delivery, db, delivery())
        )
        assert finished[0].run.state == "finished"
        assert blocked, "the delivery did not reach for the run's row"
        assert recorded == (True, 0)
        assert await store.claim(db, "holder:3", LEASE) is None
    history = events(dsn, str(reading.id))
    assert [e["kind"] for e in history][-2:] == ["step-completed", "finished"]
    assert [e["kind"] for e in history].count("finished") == 1


@pytest.mark.trio
async def test_events_are_never_dated_before_the_one_before(dsn: str) -> None:
    """A delivery is recorded after the holder decided its transition and before it
    committed it: the transition's events are dated no earlier than the delivery's."""
    async with database(dsn) as db:
        definition, reading = await waiting_and_claimed(db)
        decided = reading.now() - timedelta(seconds=1)  # decided, then the delivery came
        assert await store.record_delivery(db, delivery()) == (True, 1)
        final = result_arrived(definition, reading.step, DECIDED)
        assert final is not None
        await store.commit(db, definition, reading, final, LEASE, now=decided, go_on=True)
    history = events(dsn, str(reading.id))
    assert [e["kind"] for e in history][-3:] == ["result-delivered", "step-completed", "finished"]
    instants = [e["at"] for e in history]
    assert instants == sorted(instants), history


@pytest.mark.trio
async def test_a_settlement_sent_again_after_an_outage_hid_its_commit_applies_once(
    dsn: str,
) -> None:
    """The call's answer was recorded, but the connection broke before PostgreSQL's reply
    came back; the holder sends the same statement again (as it does through an outage).
    It finds its own settlement and carries on: one step-completed, not two."""
    record = "8d0f4a52-5b7e-4c1a-9e36-2f1c7b5d9a10"
    body = json.dumps(breg_record(record)).encode()
    async with database(dsn) as db:
        definition, run_id = await admit(db, "bench-four", {"recordId": record})
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        read = on_due(definition, run.record(), run.step, False, None, run.now())
        assert isinstance(read, Send)
        run = await store.dispatch(db, run, read.request, "http://breg.test/v1/records/a")
        answer = reply(200, body)
        transition = settle(definition, run.step, answer, run.attempt, run.now())
        settlement = store.Settlement("response", 200, body)
        hidden = Failing(db, "transition")
        hidden.failing_after = 1
        with pytest.raises(Unavailable):
            await store.commit(
                hidden, definition, run, transition, LEASE, settlement=settlement, go_on=True
            )
        again = await store.commit(
            db, definition, run, transition, LEASE, settlement=settlement, go_on=True
        )
        # It still holds the run, at the mutation the read led to.
        assert again.held and again.run.step == "act"
        assert again.ahead is not None and isinstance(again.ahead.transition, Send)
    history = events(dsn, str(run_id))
    kinds = [(e["kind"], e["step"]) for e in history]
    assert kinds == [
        ("admitted", "read"),
        ("call-dispatched", "read"),
        ("call-answered", "read"),
        ("step-completed", "read"),
        ("step-completed", "decide"),
    ]
    assert history[2]["detail"] == {"attempt": 1, "status": 200}
    assert again.run.seq == history[-1]["seq"]  # the holder's snapshot counts every event


@pytest.mark.trio
async def test_a_wake_up_scheduled_while_the_timer_reads_the_database_is_kept(
    dsn: str,
) -> None:
    """While the timer's tick asks the database what is due, an engine schedules a run
    due in 5 s. The tick's answer (nothing for a minute) must not hide it: the timer
    looks again by then, not at its 60 s sweep."""
    async with database(dsn) as db:
        paused = Paused(db, after="next_due")
        timer = Timer(
            paused,
            timedelta(seconds=60),
            Sleepers(paused, Workflows([]), "test", LEASE, AfterCommit(Metrics())),
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            await paused.reached.wait()
            scheduled_at = trio.current_time()
            timer.scheduled(5.0)
            paused.go()
            while timer.next_look == math.inf:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        assert timer.next_look - scheduled_at < 6  # by the 5 s wake-up, not the 60 s sweep
