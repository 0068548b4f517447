"""The timer service's batches: the same transition a worker commits, and on time in a burst."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.engine import store
from registry_coordinator.engine.database import sync_connection
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import Advance, Sleep, on_due
from tests.harness import (
    TEST_WORKFLOWS,
    Services,
    database,
    put_to_sleep,
    wait_for,
)

LEASE = timedelta(seconds=30)


def run_row(dsn: str, run_id: object) -> dict[str, Any]:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
        event = conn.execute(
            "SELECT * FROM run_events WHERE run_id = %s ORDER BY seq DESC LIMIT 1", (run_id,)
        ).fetchone()
    assert row is not None and event is not None
    return {"run": row, "event": event}


@pytest.mark.trio
async def test_the_timer_wakes_a_wait_until_exactly_as_a_worker_would(dsn: str) -> None:
    """Two runs asleep at the same wait-until: one taken on by a worker's own transition
    (steps.on_due, store.commit), one by the timer's batch statement. Apart from ids and
    instants, the runs and their history events must be the same."""
    checked = check_source(TEST_WORKFLOWS / "timed-choice.yaml")
    assert checked.definition is not None and checked.artifact is not None
    definition, digest = checked.definition, checked.digest
    assert digest is not None
    async with database(dsn) as db:
        await store.store_definition(db, definition, digest, checked.artifact)
        runs = []
        for key in ("worker", "timer"):
            admitted = await store.admit(db, definition, digest, "test", key, {"answer": "no"})
            claimed = await store.claim(db, "sleeper", LEASE)
            assert claimed is not None and claimed.id == admitted.run_id
            transition = on_due(
                definition, claimed.record(), claimed.step, False, None, claimed.now()
            )
            assert isinstance(transition, Sleep)
            await store.commit(db, definition, claimed, transition, LEASE, keep_lease=False)
            runs.append(admitted.run_id)
        by_worker, by_timer = runs
        assert await store.wake_sleepers(db, "coordinator:timer", 10) == []  # not due yet
        with sync_connection(dsn) as conn:  # as if the two seconds had passed
            conn.execute(
                "UPDATE runs SET timer_at = timer_at - interval '2 s', "
                "due_at = due_at - interval '2 s'"
            )
        claimed = await store.claim(db, "sleeper", LEASE)
        assert claimed is not None and claimed.id == by_worker
        transition = on_due(
            definition, claimed.record(), claimed.step, True, claimed.timer_at, claimed.now()
        )
        assert transition == Advance("route", "next")  # what a worker commits: keep_lease
        # would hold it to go straight on; the timer leaves it due at once for any worker
        await store.commit(db, definition, claimed, transition, LEASE, keep_lease=False)
        lateness = await store.wake_sleepers(db, "coordinator:timer", 10)
    assert len(lateness) == 1 and lateness[0] >= 0

    worker, timer = run_row(dsn, by_worker), run_row(dsn, by_timer)
    instants = ("due_at", "updated_at", "admitted_at", "deadline_at")
    ids = ("id", "start_key", "start_digest", *instants)
    assert {k: v for k, v in worker["run"].items() if k not in (*ids, "completed")} == {
        k: v for k, v in timer["run"].items() if k not in (*ids, "completed")
    }
    assert timer["run"]["state"] == RunState.RUNNING and timer["run"]["step"] == "route"
    assert timer["run"]["wakes_to"] is None and timer["run"]["timer_at"] is None
    for row in (worker, timer):
        assert row["run"]["due_at"] == row["event"]["at"]  # due at once, for any worker
        assert row["run"]["completed"] == {"pause": format_instant(row["event"]["at"])}
    events = ("run_id", "at", "actor", "hash")  # the hash covers run, instant and actor
    assert {k: v for k, v in worker["event"].items() if k not in events} == {
        k: v for k, v in timer["event"].items() if k not in events
    }
    assert worker["event"]["actor"] == "coordinator:sleeper"
    assert timer["event"]["actor"] == "coordinator:timer"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.datetimes(
            min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
        ),
        min_size=1,
        max_size=40,
    )
)
def test_instants_written_in_sql_read_as_the_engine_writes_them(
    schema: str, instants: list[datetime]
) -> None:
    with sync_connection(schema) as conn:
        rows = conn.execute(
            "SELECT rfc3339(at) AS text FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS t(at, n) "
            "ORDER BY n",
            (instants,),
        ).fetchall()
    assert [row["text"] for row in rows] == [format_instant(at) for at in instants]


def test_a_burst_of_wait_untils_due_in_one_second_all_wake_once(
    dsn: str, services: Services
) -> None:
    """2,000 runs fall due within one second while the workers are busy with the runs
    before them: the timer's batches take every wait-until on, none before its instant,
    each once, and every run finishes. A tenth of the runs fell asleep before schema 5 (no
    ``wakes_to``): the workers wake those one at a time, as they used to. How late they
    are is printed; the bound is the timers benchmark's (``./run bench timers``)."""
    service = services(["timed-choice"], workers=2)
    count = 2000
    put_to_sleep(dsn, count, timedelta(seconds=2), timedelta(seconds=1), unbatched_every=10)
    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'finished'", count, timeout=120)
    assert service.stop() == 0
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            """
            SELECT r.start_key !~ '0$' AS batched,
                   EXTRACT(EPOCH FROM e.at - (r.admitted_at + interval '2 s'))::float8 AS late,
                   (SELECT array_agg(seq ORDER BY seq) FROM run_events WHERE run_id = r.id) AS seqs
            FROM runs r JOIN run_events e ON e.run_id = r.id
            WHERE e.kind = 'step-completed' AND e.step = 'pause'
            """
        ).fetchall()
    assert len(rows) == count
    assert all(row["seqs"] == [1, 2, 3, 4, 5] for row in rows)
    batched = sorted(row["late"] for row in rows if row["batched"])
    assert len(batched) == count * 9 // 10
    p99 = batched[int(len(batched) * 0.99)]
    print(
        f"burst of {len(batched)} batched wait-untils in one second: lateness "
        f"median {1000 * statistics.median(batched):.1f} ms, p99 {1000 * p99:.1f} ms"
    )
    assert min(batched) >= 0
