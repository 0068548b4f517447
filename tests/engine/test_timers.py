"""The timer service's batches on time in a burst, and instants written in SQL as the
engine writes them (test_batch_wake.py: a batch is a worker's transition)."""

from __future__ import annotations

import statistics
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.store.database import sync_connection
from tests.support import (
    Services,
    put_to_sleep,
    wait_for,
)


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
