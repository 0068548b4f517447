"""A call task in-process, against a stand-in product: what a shutdown leaves behind."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import trio

from registry_coordinator import store
from registry_coordinator.artifact import check_source
from registry_coordinator.calls import Calls, Product, with_products
from registry_coordinator.config import load_config
from registry_coordinator.database import sync_connection
from registry_coordinator.definition import Definition
from registry_coordinator.metrics import Metrics
from registry_coordinator.standins import StandIn, Tokens
from registry_coordinator.steps import Send, on_due
from registry_coordinator.timers import Timer

from .harness import (
    STANDIN_TOKEN,
    TEST_WORKFLOWS,
    connection,
    database,
    events,
    free_port,
    write_config,
)

LEASE = timedelta(seconds=30)


@pytest.mark.trio
async def test_a_shutdown_while_a_run_goes_on_after_its_call_keeps_the_answer(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The read's answer is recorded and the run goes on, still held, in the call's task;
    the service stops right then. The run stays where the answer took it: the call is
    not recorded a second time as interrupted (it used to be, sending the run back)."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    port = free_port()
    config = load_config(
        write_config(
            tmp_path, dsn, ["bench-four"], connections={"registry": connection("breg", port)}
        )
    )
    checked = check_source(TEST_WORKFLOWS / "bench-four.yaml")
    definition = checked.definition
    assert definition is not None and checked.artifact and checked.digest
    going_on = trio.Event()

    async def proceed(_: Definition, run: store.Claimed, ahead: store.Ahead | None) -> None:
        assert run.step == "act" and ahead is not None and isinstance(ahead.transition, Send)
        going_on.set()
        await trio.sleep_forever()  # the engine's step loop, when the shutdown comes

    async with database(dsn) as db, trio.open_nursery() as nursery:
        await nursery.start(StandIn("breg", Tokens(STANDIN_TOKEN)).serve, "127.0.0.1", port)
        await store.store_definition(db, definition, checked.digest, checked.artifact)
        await store.admit(db, definition, checked.digest, "test", "k", {"recordId": "app-1"})
        run = await store.claim(db, "holder:1", LEASE)
        assert run is not None
        read = on_due(definition, run.record(), run.step, False, None, run.now())
        assert isinstance(read, Send)

        async def body(products: dict[str, Product], _: httpx.AsyncClient) -> None:
            metrics = Metrics()
            timer = Timer(db, timedelta(seconds=60), "coordinator:holder:1", metrics)
            calls = Calls(db, products, timer, LEASE, metrics, store.Holdings())
            calls.proceed = proceed
            async with trio.open_nursery() as pools:
                await pools.start(calls.run)
                calls.submit(definition, run, read.request)
                await going_on.wait()
                await calls.drain(timedelta(0))  # the shutdown: calls in flight are cancelled
                pools.cancel_scope.cancel()

        await with_products(config.connections, body)
        nursery.cancel_scope.cancel()
    kinds = [(e["kind"], e["step"]) for e in events(dsn, str(run.id))]
    assert kinds == [
        ("admitted", "read"),
        ("call-dispatched", "read"),
        ("step-completed", "read"),
        ("step-completed", "decide"),
    ]
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT state, step FROM runs").fetchone()
    assert row == {"state": "running", "step": "act"}
