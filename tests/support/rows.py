"""The database from the tests' side: the store's own pool for in-process tests, runs
admitted or put to sleep straight into it, and a run's row and history read back."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.custody import DataKey, Sealer, unwrap
from registry_coordinator.store.database import Database, open_row, sync_connection
from registry_coordinator.store.migrations import migrate as migrate_schema
from tests.support.config import services_kek
from tests.support.paths import TEST_WORKFLOWS


@asynccontextmanager
async def database(dsn: str, size: int = 2) -> AsyncIterator[Database]:
    """The store's own pool on a migrated database, for tests that drive it in-process."""
    db = await Database(dsn, size).open()
    try:
        await migrate_schema(db)
        yield db
    finally:
        await db.close()


async def admit(db: Database, workflow: str, run_input: Any) -> tuple[Definition, uuid.UUID]:
    """Store tests/workflows/<workflow>.yaml's definition and admit one run of it."""
    checked = check_source(TEST_WORKFLOWS / f"{workflow}.yaml")
    definition = checked.definition
    assert definition is not None and checked.artifact and checked.digest
    await store.store_definition(db, definition, checked.digest, checked.artifact)
    admitted = await store.admit(
        db, definition, checked.digest, "test", uuid.uuid4().hex, run_input
    )
    return definition, admitted.run_id


def run_state(dsn: str, run_id: str) -> dict[str, Any]:
    """A run's row, its sealed columns opened with the tests' key-encryption key."""
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return dict(open_row("run_state", row, sealer_of(dsn)))


def runs_opened(dsn: str, columns: str) -> list[dict[str, Any]]:
    """Every run's ``columns`` (with ``id`` and ``data_key``), its sealed ones opened."""
    sealer = sealer_of(dsn)
    with sync_connection(dsn) as conn:
        rows = conn.execute(f"SELECT id, data_key, {columns} FROM runs").fetchall()
    return [dict(open_row("runs_opened", row, sealer)) for row in rows]


def sealer_of(dsn: str) -> Sealer | None:
    """What the tests' services seal runs' data with on ``dsn``'s database, as they made
    it (None before one made its data key)."""
    with sync_connection(dsn) as conn:
        timeline = conn.execute("SELECT installation FROM timeline").fetchone()
        held = conn.execute("SELECT id, subject, kek, wrapped FROM data_keys").fetchall()
    assert timeline is not None
    kek = services_kek(dsn)
    keys: dict[int, DataKey | None] = {
        row["id"]: None
        if row["wrapped"] is None  # erased
        else unwrap({1: kek}, timeline["installation"], row["id"], 1, bytes(row["wrapped"]))
        for row in held
    }
    shared = next((keys[row["id"]] for row in held if row["subject"] is None), None)
    return None if shared is None else Sealer(timeline["installation"], shared, keys)


def events(dsn: str, run_id: str) -> list[dict[str, Any]]:
    """A run's history, its events' sealed fields opened with the tests' key-encryption key."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT e.seq, e.at, e.kind, e.step, e.actor, e.detail, "
            "to_jsonb(r) -> 'data_key' AS data_key "  # NULL before schema 16 too
            "FROM run_events e JOIN runs r ON r.id = e.run_id WHERE e.run_id = %s "
            "ORDER BY e.seq",
            (run_id,),
        ).fetchall()
    sealer = sealer_of(dsn) if rows and rows[0]["data_key"] is not None else None
    return [
        {k: v for k, v in row.items() if k != "data_key"}
        | ({"detail": sealer.open_detail(run_id, row["step"], row["detail"])} if sealer else {})
        for row in rows
    ]


def sendings(dsn: str, run_id: str, step: str | None = None) -> list[dict[str, Any]]:
    """A run's sendings (``executions``) of every call step or of ``step``, by attempt,
    their sealed columns opened with the tests' key-encryption key."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT e.*, e.run_id AS id, r.data_key FROM executions e "
            "JOIN runs r ON r.id = e.run_id WHERE e.run_id = %(run)s "
            "AND (%(step)s::text IS NULL OR e.step = %(step)s) ORDER BY e.step, e.attempt",
            {"run": run_id, "step": step},
        ).fetchall()
    sealer = sealer_of(dsn)
    return [dict(open_row("sendings", row, sealer)) for row in rows]


def put_to_sleep(
    dsn: str,
    count: int,
    ahead: timedelta,
    spread: timedelta = timedelta(0),
    *,
    unbatched_every: int = 0,
    prefix: str = "k",
) -> None:
    """``count`` timed-choice runs asleep at its wait-until ``pause``, written straight
    into the database (admitting them one by one would spread them out) with the history
    a run that fell asleep has (admitted, waiting): due ``ahead`` from now, spread evenly
    over ``spread`` in 1,000 slots. Every ``unbatched_every``th run fell asleep as under
    schema 4, without ``wakes_to``, for a worker to wake. Their start keys begin with
    ``prefix``, so that a test can put more to sleep."""
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, timer_at, wakes_to, due_at,
                                  admitted_at, deadline_at, updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'sleeper', %(prefix)s || n,
                       'x', '{"answer": "no"}', 'waiting', 'pause', 2, t.due,
                       CASE WHEN %(every)s = 0 OR n %% %(every)s <> 0 THEN 'route' END, t.due,
                       t.due - interval '2 s', t.due + interval '1 hour', now()
                FROM definitions d, generate_series(1, %(count)s) AS n,
                     LATERAL (SELECT now() + %(ahead)s + (n %% 1000) * %(spread)s / 1000 AS due) t
                WHERE d.workflow_id = 'timed-choice'
                RETURNING id, admitted_at, timer_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, e.seq, admitted_at, e.kind, 'pause', 'sleeper', e.detail
            FROM made, LATERAL (
                VALUES (1, 'admitted', '{}'::jsonb),
                       (2, 'waiting', jsonb_build_object('until', rfc3339(timer_at)))
            ) AS e (seq, kind, detail)
            """,
            {
                "count": count,
                "ahead": ahead,
                "spread": spread,
                "every": unbatched_every,
                "prefix": prefix,
            },
        )
        # As an admission does: a service running looks at what is due now, rather than at
        # its next sweep (so its timer knows when these fall due).
        conn.execute("SELECT pg_notify('coordinator_wake', 'put_to_sleep')")
