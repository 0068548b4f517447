"""What the store writes of a dispatched call that Coordinator itself stopped, and how long
the run held longest has waited: against a real PostgreSQL, without products."""

from __future__ import annotations

from datetime import timedelta

import pytest

from registry_coordinator import store
from registry_coordinator.audit import histories
from registry_coordinator.semantics.codes import HoldCode
from registry_coordinator.semantics.steps import Send, on_due
from registry_coordinator.store.database import sync_connection
from tests.support import admit, database, events

LEASE = timedelta(seconds=30)


@pytest.mark.trio
async def test_a_defect_while_a_call_was_out_reads_as_lost_then_held(dsn: str) -> None:
    async with database(dsn) as db:
        assert await store.held_longest(db) == 0  # none is held
        definition, run_id = await admit(db, "act", {"recordId": "app-1"})
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        send = on_due(definition, run.record(), run.step, False, None, run.now())
        assert isinstance(send, Send)
        run = await store.dispatch(db, run, send.request, "http://breg.test/v1/actions")
        assert await store.record_defect(db, run, HoldCode.ENGINE_DEFECT, "test: an error")
        longest = await store.held_longest(db)
        # A late answer (or a note) changes the held run; it was held no later for that.
        assert await store.keep_late_answer(db, run, 200, b"{}")
        with sync_connection(dsn) as conn:
            conn.execute("UPDATE runs SET updated_at = updated_at + interval '1 hour'")
        since_hold = await store.held_longest(db)
        verified = await histories.verify(db, run=run_id)
    history = events(dsn, str(run_id))
    kinds = [e["kind"] for e in history]
    assert kinds == ["admitted", "call-dispatched", "call-lost", "held", "late-answer"]
    assert history[2]["detail"] == {
        "attempt": 1,
        "detail": "Coordinator failed before recording what came back",
    }
    assert history[3]["detail"] == {"code": "engine-defect", "detail": "test: an error"}
    assert [e["seq"] for e in history] == [1, 2, 3, 4, 5]
    assert verified.breaks == []
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM clock_timestamp() - at)::float8 AS age "
            "FROM run_events WHERE kind = 'held'"
        ).fetchone()
    assert row is not None and 0 < longest <= since_hold <= row["age"]
