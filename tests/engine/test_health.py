"""What the probes read from the database (``observability.health``): answers, or none in time."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from registry_coordinator.observability import health
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import Database
from tests.support import admit, database


@pytest.mark.trio
async def test_a_database_that_answers_is_ready_and_counts_its_active_runs(dsn: str) -> None:
    async with database(dsn) as db:
        assert await health.database(db) == {"ok": True, "pooler": "none"}
        assert await health.runs_now(db) == health.Runs(dict.fromkeys(health.ACTIVE, 0), 0)
        await admit(db, "timed-choice", {"answer": "no"})
        now = await health.runs_now(db)
    assert now is not None and now.held_longest == 0
    counts = now.counts
    assert list(counts) == [
        RunState.RUNNING,
        RunState.WAITING,
        RunState.HELD,
    ]
    assert counts[RunState.RUNNING] == 1


@pytest.mark.trio
async def test_a_database_that_does_not_answer_in_time_is_not_ready(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A pool with no connection to give: each probe gives up after PATIENCE seconds."""
    never = Database("postgresql://unused.invalid/none", 1)  # never opened: nothing to check out
    started = trio.current_time()
    assert await health.database(never) == {
        "ok": False,
        "detail": f"no answer within {health.PATIENCE} s",
        "pooler": "none",
    }
    assert await health.runs_now(never) is None
    assert trio.current_time() - started == pytest.approx(2 * health.PATIENCE)
