"""Each run's history is a hash chain: PostgreSQL writes it as events are inserted, Python
checks it (semantics/chain), and a history changed in SQL is found, naming run and seq."""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from registry_coordinator.audit import histories
from registry_coordinator.audit.checkpointer import checkpoint
from registry_coordinator.semantics.chain import Event, canonical, event_hash, parse
from registry_coordinator.store.database import Database, sync_connection
from tests.support import admit, database

#: Any JSON an event's detail may hold: text with every kind of character PostgreSQL stores,
#: integers, finite floats, and nesting.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))
DETAILS = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(DETAILS)
def test_postgresql_and_python_write_the_same_canonical_json(schema: str, value: Any) -> None:
    text = json.dumps(value, ensure_ascii=False)
    with sync_connection(schema) as conn:
        row = conn.execute("SELECT canonical_json(%s::jsonb) AS c", (text,)).fetchone()
    assert row is not None
    assert row["c"] == canonical(parse(text))


@settings(max_examples=50, deadline=None)
@given(DETAILS, st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s))
def test_postgresql_and_python_chain_an_event_the_same(
    schema: str, detail: Any, actor: str
) -> None:
    run, previous = uuid.uuid4(), bytes(range(32))
    text = json.dumps(detail, ensure_ascii=False)
    with sync_connection(schema) as conn:
        row = conn.execute(
            "SELECT event_hash(%s, %s, 7, now(), 'k', 's', %s, %s::jsonb) AS h,"
            " rfc3339(now()) AS at",
            (previous, run, actor, text),
        ).fetchone()
    assert row is not None
    event = Event(str(run), 7, row["at"], "k", "s", actor, parse(text), bytes(row["h"]))
    assert event_hash(previous, event) == event.hash


async def _histories(dsn: str) -> list[str]:
    """Three runs of four events each in a migrated database, written as the engine writes
    events (the trigger chains them)."""
    async with database(dsn) as db:
        made = [str((await admit(db, "act", {"recordId": f"r-{n}"}))[1]) for n in range(3)]
    with sync_connection(dsn) as conn:
        for run in made:
            for seq in (2, 3, 4):
                conn.execute(
                    "INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)"
                    " VALUES (%s, %s, now(), 'note', 'invoke', 'someone', %s::jsonb)",
                    (run, seq, json.dumps({"n": seq, "text": "ünïcödé"})),
                )
            conn.execute("UPDATE runs SET seq = 4 WHERE id = %s", (run,))
    return made


async def _verify(dsn: str, run: uuid.UUID | None = None) -> histories.Verified:
    async with database(dsn) as db:
        return await histories.verify(db, run)


def _tamper(dsn: str, statement: str, *params: object) -> None:
    """What a database administrator can do: with triggers off, change rows at will."""
    with sync_connection(dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(statement, params)


@pytest.mark.trio
async def test_an_untouched_history_verifies(dsn: str) -> None:
    made = await _histories(dsn)
    found = await _verify(dsn)
    assert (found.runs, found.events, found.breaks) == (3, 12, [])
    one = await _verify(dsn, uuid.UUID(made[1]))
    assert (one.runs, one.events) == (1, 4)


@pytest.mark.trio
@pytest.mark.parametrize(
    ("statement", "seq", "why"),
    [
        ("UPDATE run_events SET detail = '{\"n\": 9}' WHERE run_id = %s AND seq = 3", 3, "hash"),
        ("UPDATE run_events SET actor = 'nobody' WHERE run_id = %s AND seq = 1", 1, "hash"),
        ("DELETE FROM run_events WHERE run_id = %s AND seq = 2", 2, "missing"),
        ("DELETE FROM run_events WHERE run_id = %s AND seq = 4", 4, "ends at event 3"),
        (
            "INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail, hash)"
            " SELECT run_id, 5, at, kind, step, actor, detail, hash FROM run_events"
            " WHERE run_id = %s AND seq = 4",
            5,
            "hash",
        ),
        (
            "UPDATE run_events a SET (at, kind, step, actor, detail, hash) ="
            " (b.at, b.kind, b.step, b.actor, b.detail, b.hash) FROM run_events b"
            " WHERE a.run_id = %s AND b.run_id = a.run_id AND a.seq IN (2, 3)"
            " AND b.seq = 5 - a.seq",  # events 2 and 3 swapped, each with its own hash
            2,
            "hash",
        ),
    ],
    ids=["update-detail", "update-actor", "delete", "delete-last", "insert", "reorder"],
)
async def test_a_history_changed_in_sql_is_found_naming_run_and_seq(
    dsn: str, statement: str, seq: int, why: str
) -> None:
    made = await _histories(dsn)
    _tamper(dsn, statement, made[1])
    found = await _verify(dsn)
    assert found.runs == 3
    assert [(b.run, b.seq) for b in found.breaks] == [(made[1], seq)]
    assert why in found.breaks[0].why


@pytest.mark.trio
async def test_a_history_leaves_only_once_its_run_is_archived(dsn: str) -> None:
    """The append-only rule has one way out, and only that one: a run recorded in
    ``archived_runs`` (in the archiver's transaction) may have its events deleted."""
    [kept, archived, *_] = await _histories(dsn)
    refused = pytest.raises(psycopg.errors.RaiseException, match="append-only: DELETE")
    with sync_connection(dsn) as conn, refused:
        conn.execute("DELETE FROM run_events WHERE run_id = %s", (kept,))
    refused = pytest.raises(psycopg.errors.RaiseException, match="append-only: UPDATE")
    with sync_connection(dsn) as conn, refused:
        conn.execute("UPDATE run_events SET actor = 'x' WHERE run_id = %s", (archived,))
    with sync_connection(dsn) as conn:
        conn.execute(
            "INSERT INTO archived_runs SELECT r.id, r.digest, r.workflow_id, r.caller,"
            " r.start_key, r.start_digest, r.state, r.outcome, r.seq, e.hash, r.admitted_at,"
            " now(), now(),"
            " 'b.json', repeat('0', 64) FROM runs r JOIN run_events e"
            " ON e.run_id = r.id AND e.seq = r.seq WHERE r.id = %s",
            (archived,),
        )
        gone = conn.execute("DELETE FROM run_events WHERE run_id = %s", (archived,)).rowcount
        assert gone == 4
        with pytest.raises(psycopg.errors.RaiseException, match="append-only: UPDATE"):
            conn.execute("UPDATE archived_runs SET bundle = 'elsewhere' WHERE id = %s", (archived,))
    kept_events = await _verify(dsn, uuid.UUID(kept))
    assert (kept_events.events, kept_events.breaks) == (4, [])


@pytest.mark.trio
async def test_a_checkpoint_that_loses_the_race_for_its_number_signs_in_the_next(
    dsn: str,
) -> None:
    """Two processes sign different runs' heads at once, twenty times: each time both
    runs' heads end up signed, though only one of two inserts gets each number."""
    made = [uuid.UUID(run) for run in await _histories(dsn)]
    key = Ed25519PrivateKey.generate()
    first, second = await Database(dsn, 2).open(), await Database(dsn, 2).open()
    try:
        for seq in range(5, 25):
            with sync_connection(dsn) as conn:
                for run in made[:2]:
                    conn.execute(
                        "INSERT INTO run_events (run_id, seq, at, kind, step, actor)"
                        " VALUES (%s, %s, now(), 'note', 'invoke', 'someone')",
                        (run, seq),
                    )
                    conn.execute("UPDATE runs SET seq = %s WHERE id = %s", (seq, run))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(checkpoint, first, key, None, [made[0]])
                nursery.start_soon(checkpoint, second, key, None, [made[1]])
            for run in made[:2]:
                proof = await first.row("audit_run_proof", {"run": run})
                assert proof is not None and proof["seq"] == seq, (run, seq, proof)
    finally:
        await first.close()
        await second.close()
    found = await _verify(dsn)
    assert (found.breaks, found.checkpoint_breaks) == ([], [])
