"""A connection's pause and its runs, forced against real PostgreSQL: a resume that comes
while a run is being parked under the pause (its statement done, its transaction not
committed) waits for it, then finds the run and makes it due at once — never leaving it
parked until its deadline; and a park after the resume parks nothing."""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from registry_coordinator import store
from registry_coordinator.store import pauses
from registry_coordinator.store.database import Database, sync_connection
from tests.support import admit, database, rival_while_uncommitted

LEASE = timedelta(seconds=30)


def _parked(dsn: str, run: object) -> dict[str, object]:
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT paused_for, due_at <= now() AS due_soon FROM runs WHERE id = %s",
            (run,),
        ).fetchone()
    assert row is not None
    return dict(row)


@pytest.mark.trio
async def test_a_resume_while_a_run_is_being_parked_waits_for_it_and_lets_it_go(
    dsn: str,
) -> None:
    async with database(dsn, size=4) as db:
        await admit(db, "deadline", {})
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        await pauses.pause(db, "records", "operator:ada", "maintenance")

        async def park(held: Database) -> None:
            assert await pauses.park(held, run.id, run.token, "records")

        blocked, resumed = await rival_while_uncommitted(
            db, park, partial(pauses.resume, db, "records", "operator:ada", "over")
        )
        assert blocked, "the resume did not wait for the park's transaction"
        assert resumed.was_paused and resumed.runs == 1
        assert _parked(dsn, run.id) == {"paused_for": None, "due_soon": True}

        again = await store.claim(db, "holder:1", LEASE)
        assert again is not None and again.id == run.id
        assert not await pauses.park(db, again.id, again.token, "records")  # resumed: no park
        assert _parked(dsn, run.id)["paused_for"] is None
