"""A call task whose request is being sealed when the database goes away: it waits the
outage out with its lease, and sends the request once, rather than leaving the run to
its lease (half a minute) and, if the sealing had committed unseen, held as interrupted
— a mutation that was never sent, which an operator would have had to clear."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import (
    STANDIN_TOKEN,
    Failing,
    breg,
    breg_config,
    call_pool,
    claimed_call,
    events,
    invocations,
)


def run_row(dsn: str) -> dict[str, object]:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT state, outcome, hold_code FROM runs").fetchone()
    assert row is not None
    return dict(row)


@pytest.mark.trio
@pytest.mark.parametrize("lost", ["the statement", "its reply"])
async def test_an_outage_while_a_mutation_is_sealed_is_waited_out_and_it_is_sent_once(
    lost: str, dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database fails the sealing three times before it runs, or once after it
    committed (the outage hid the reply). Either way the task keeps its claim, learns
    once the database is back whether the sealing committed, and sends the mutation
    once: the run finishes, its history has one sealing and one answer."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with breg(dsn) as (db, product, port):
        config = breg_config(tmp_path, dsn, "act", port)
        definition, run, send = await claimed_call(db, "act")
        failing = Failing(db, "dispatch_call")
        if lost == "the statement":
            failing.failing_before = 3
        else:
            failing.failing_after = 1
        ended = trio.Event()
        async with call_pool(config, failing, ended=ended.set) as calls:
            calls.submit(definition, run, send.request)
            await ended.wait()  # the pool's hang guard fails a run left to its lease
        row = run_row(dsn)
    assert failing.refused.is_set()
    assert row == {"state": RunState.FINISHED, "outcome": "acted", "hold_code": None}
    assert len(invocations(product)) == 1
    assert list(product.ledger.applied.values()) == [1]
    assert [e["kind"] for e in events(dsn, str(run.id))] == [
        "admitted",
        "call-dispatched",
        "call-answered",
        "step-completed",
        "finished",
    ]
