"""The call pool in-process, as the service runs it, against a stand-in BReg served on
loopback in the same Trio run: a migrated database beside it, a run claimed at its call,
and the action invocations BReg was sent (the tests of call tasks hold the database handle,
see :mod:`tests.support.interleave`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import trio
from trio import fail_after

from registry_coordinator import store
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.config import Config, load_config
from registry_coordinator.devtools.standins import Tokens
from registry_coordinator.devtools.standins.breg import BReg
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.calls import Calls, Proceed, open_products
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.steps import Send, on_due
from registry_coordinator.store.database import Database
from tests.support.config import connection, write_config
from tests.support.network import free_port
from tests.support.rows import admit, database
from tests.support.tokens import STANDIN_TOKEN

#: The lease the call tasks' runs are claimed with.
LEASE = timedelta(seconds=30)
#: The record the runs act on (BReg's record ids are UUIDs).
RECORD = "8d0f4a52-5b7e-4c1a-9e36-2f1c7b5d9a10"
#: Seconds after which a test that waits for something is failed as hung, not timed.
HANG = 60


def breg_config(tmp_path: Path, dsn: str, workflow: str, port: int) -> Config:
    return load_config(
        write_config(tmp_path, dsn, [workflow], connections={"registry": connection("breg", port)})
    )


@asynccontextmanager
async def breg(dsn: str, size: int = 2) -> AsyncIterator[tuple[Database, BReg, int]]:
    """A migrated database and a stand-in BReg serving on a free port."""
    port = free_port()
    product = BReg(Tokens(STANDIN_TOKEN))
    async with database(dsn, size) as db, trio.open_nursery() as nursery:
        await nursery.start(product.serve, "127.0.0.1", port)
        yield db, product, port
        nursery.cancel_scope.cancel()


async def stay(_: Definition, __: store.Claimed, ___: store.Ahead | None) -> None:
    """A run that goes on after its call is left where its call left it."""


@asynccontextmanager
async def call_pool(
    config: Config,
    db: Database,
    lease: timedelta = LEASE,
    proceed: Proceed = stay,
    ended: Callable[[], None] = lambda: None,
) -> AsyncIterator[Calls]:
    """The configured connections' call pool, running, its runs going on in ``proceed``
    (the engine's step loop in the service), ``ended`` told of each run that ends (as the
    service's checkpointer is). A test that waits in it for something that never comes
    fails as hung after :data:`HANG` seconds."""
    async with open_products(config.connections) as (products, _), trio.open_nursery() as pools:
        after = AfterCommit(Metrics(), ended)
        timer = Timer(
            db, timedelta(seconds=60), Sleepers(db, Workflows([]), "holder:1", lease, after)
        )
        told = after.telling(timer)
        calls = Calls(
            db, products, timer, lease, told, store.Holdings(), proceed, HighWater(db, None)
        )
        await pools.start(calls.run)
        with fail_after(HANG):
            yield calls
        pools.cancel_scope.cancel()


async def claimed_call(
    db: Database, workflow: str, lease: timedelta = LEASE
) -> tuple[Definition, store.Claimed, Send]:
    definition, _ = await admit(db, workflow, {"recordId": RECORD})
    run = await store.claim(db, "holder:1", lease)
    assert run is not None
    send = on_due(definition, run.record(), run.step, False, None, run.now())
    assert isinstance(send, Send)
    return definition, run, send


def invocations(product: BReg) -> list[dict[str, object]]:
    """The action invocations BReg was sent (not the reads that prepared them: its
    registry's metadata and its target's conditions, which cause no effect)."""
    return [r for r in product.ledger.requests if r["path"] == "/v1/actions/mark-reviewed"]
