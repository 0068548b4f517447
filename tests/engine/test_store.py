"""The store's transitions, driven in-process: several steps in one statement, fenced."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import (
    Advance,
    Reply,
    ReplyKind,
    Send,
    Sleep,
    on_due,
    settle,
)
from registry_coordinator.store.database import Database, sync_connection
from tests.support import TEST_WORKFLOWS, admit, breg_record, database, events

LEASE = timedelta(seconds=30)


async def claimed_chain(db: Database, n: int) -> tuple[Definition, store.Claimed]:
    """A run of the chain workflow, admitted and claimed at its first step."""
    checked = check_source(TEST_WORKFLOWS / "chain.yaml")
    assert checked.definition is not None and checked.artifact and checked.digest
    await store.store_definition(db, checked.definition, checked.digest, checked.artifact)
    admitted = await store.admit(db, checked.definition, checked.digest, "test", "k", {"n": n})
    claimed = await store.claim(db, "holder:1", LEASE)
    assert claimed is not None and claimed.id == admitted.run_id
    return checked.definition, claimed


@pytest.mark.trio
async def test_the_steps_after_a_step_that_need_nothing_from_outside_commit_with_it(
    dsn: str,
) -> None:
    """A wait-until already due, a choose, and the wait-until after it: one statement, an
    event each, and the later steps see the earlier ones' completion in that statement."""
    async with database(dsn) as db:
        definition, run = await claimed_chain(db, 2)
        now = run.now()
        first = on_due(definition, run.record(), run.step, False, None, now)
        assert first == Advance("parity", "next")
        committed = await store.commit(db, definition, run, first, LEASE, now=now, go_on=True)
    until = now + timedelta(milliseconds=300)
    assert committed.taken == (
        ("now", first),
        ("parity", Advance("even_pause", "case 1")),
        ("even_pause", Sleep(until)),
    )
    assert not committed.held and committed.ahead is None
    assert committed.run.state is RunState.WAITING and committed.run.step == "even_pause"
    history = events(dsn, str(run.id))
    assert [(e["seq"], e["kind"], e["step"]) for e in history] == [
        (1, "admitted", "now"),
        (2, "step-completed", "now"),
        (3, "step-completed", "parity"),
        (4, "waiting", "even_pause"),
    ]
    assert {e["at"] for e in history[1:]} == {now}
    assert history[3]["detail"] == {"until": format_instant(until)}
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run.id,)).fetchone()
    assert row is not None
    assert (row["seq"], row["state"], row["step"], row["timer_at"]) == (
        4,
        RunState.WAITING,
        "even_pause",
        until,
    )
    assert row["completed"] == {"now": format_instant(now), "parity": format_instant(now)}
    assert row["lease_token"] is None and row["due_at"] == until


@pytest.mark.trio
async def test_a_holder_that_lost_its_lease_writes_none_of_the_steps(dsn: str) -> None:
    async with database(dsn) as db:
        definition, run = await claimed_chain(db, 2)
        with sync_connection(dsn) as conn:  # another worker took the run over
            conn.execute("UPDATE runs SET lease_token = gen_random_uuid()")
        first = on_due(definition, run.record(), run.step, False, None, run.now())
        assert first is not None
        with pytest.raises(store.LeaseLost):
            await store.commit(db, definition, run, first, LEASE, go_on=True)
    assert [e["kind"] for e in events(dsn, str(run.id))] == ["admitted"]


@pytest.mark.trio
async def test_the_step_after_the_chain_is_decided_once_at_the_instant_it_commits(
    dsn: str,
) -> None:
    """A read's answer, then a choose in the same statement; the call after them is
    decided there too, and handed on (with its instant) rather than decided again."""
    checked = check_source(TEST_WORKFLOWS / "bench-four.yaml")
    definition = checked.definition
    assert definition is not None and checked.artifact and checked.digest
    async with database(dsn) as db:
        await store.store_definition(db, definition, checked.digest, checked.artifact)
        record_id = "8d0f4a52-5b7e-4c1a-9e36-2f1c7b5d9a10"  # BReg's record ids are UUIDs
        await store.admit(db, definition, checked.digest, "test", "k", {"recordId": record_id})
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        reply = Reply(ReplyKind.RESPONSE, 200, json.dumps(breg_record(record_id)).encode())
        now = run.now()
        read = settle(definition, "read", reply, 0, now)
        assert isinstance(read, Advance) and read.next == "decide"
        committed = await store.commit(db, definition, run, read, LEASE, now=now, go_on=True)
    assert [step for step, _ in committed.taken] == ["read", "decide"]
    assert committed.held and committed.run.step == "act"
    assert committed.ahead is not None and committed.ahead.at == now
    assert isinstance(committed.ahead.transition, Send)
    assert committed.ahead.transition == on_due(
        definition, committed.run.record(), "act", False, None, now
    )


@pytest.mark.trio
async def test_a_run_state_is_sent_as_its_text(dsn: str) -> None:
    """The store passes RunState members as parameters: psycopg dumps a StrEnum as its
    text ("waiting"), by str coming before Enum in its MRO, not as its name ("WAITING")."""
    async with database(dsn) as db:
        definition, run = await claimed_chain(db, 2)
        first = on_due(definition, run.record(), run.step, False, None, run.now())
        assert first is not None
        committed = await store.commit(db, definition, run, first, LEASE, go_on=True)
        assert committed.run.state is RunState.WAITING
        latest = (datetime.max.replace(tzinfo=UTC), uuid.UUID(int=0))
        waiting = store.RunFilter(None, None, state=RunState.WAITING)
        listed = await store.runs_page(db, waiting, latest, 10)
    assert [listed_run.id for listed_run in listed] == [run.id]
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT %s AS sent, state FROM runs", (RunState.WAITING,)).fetchone()
    assert row == {"sent": "waiting", "state": "waiting"}


@pytest.mark.parametrize(
    ("earlier", "uncertain"),
    [
        ([("not-sent", None)], False),
        ([("response", 503), ("response", 429)], False),
        ([("response", 401)], False),  # the product refused Coordinator's identity: no effect
        ([("response", 403), ("not-sent", None)], False),
        ([("lost", None)], True),
        ([("interrupted", None)], True),
        ([("response", 500)], True),
        ([("response", 408)], True),
        ([(None, None)], True),  # dispatched, and its holder died before any outcome
        ([("response", 503), ("lost", None), ("response", 403)], True),
    ],
)
@pytest.mark.trio
async def test_a_call_is_uncertain_once_any_sending_of_it_may_have_acted(
    dsn: str, earlier: list[tuple[str | None, int | None]], uncertain: bool
) -> None:
    """What the sealed request says of its earlier sendings, on which a refusal of the next
    one fails the run (none may have acted) or holds it (one may stand)."""
    async with database(dsn) as db:
        _, run_id = await admit(db, "notify", {"email": "a@example.org"})
    with sync_connection(dsn) as conn:
        for attempt, (outcome, status) in enumerate(earlier, start=1):
            conn.execute(
                "INSERT INTO executions (run_id, step, attempt, method, url, body, "
                "idempotency_key, sealed_at, dispatched_at, status, outcome) "
                "VALUES (%s, 'send', %s, 'POST', 'http://m/v1/messages', '{}', 'k', now(), "
                "now(), %s, %s)",
                (run_id, attempt, status, outcome),
            )
    async with database(dsn) as db:
        sealed = await store.sealed_at(db, run_id, "send")
    assert sealed is not None and sealed.uncertain is uncertain
