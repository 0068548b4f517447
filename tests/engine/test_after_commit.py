"""What follows a commit, path by path (engine/after_commit.py): a worker's step loop, a
call task recording an answer, a call task recording a result read, and the timer's
batches. Each path is driven in-process with the parts the service uses, at the default
sweep (30 s), against real PostgreSQL and a stand-in product on loopback. What each must
do: a run that ends is counted, its listener (the checkpointer, in the service) hears of
it once, and a run that failed says so in a log line with its id; a run due again later
is told to the timer, except in the timer's own batches, whose timer looks at the
database after each burst.

The timer here is a recorder of what it was told: whether it was told is the fact under
test, and a timer that runs would only turn that into a race against its sweep.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.config import EngineConfig, load_config
from registry_coordinator.devtools.standins import Tokens
from registry_coordinator.devtools.standins.messaging import Messaging
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.calls import open_products
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.worker import Engine
from registry_coordinator.engine.workflows import Pinned, Workflows
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import Database, sync_connection
from tests.support import STANDIN_TOKEN, TEST_WORKFLOWS, connection, database, free_port
from tests.support import write_config as write_service_config

LEASE = timedelta(seconds=30)
#: The engine's default sweep: a run due sooner is found only if the timer was told.
SWEEP = timedelta(seconds=30)
#: Seconds after which a test that waits for something is failed as hung, not timed.
HANG = 60


@dataclass
class Told:
    """The timer, as far as a commit tells it anything: the delays it was told of."""

    delays: list[float] = field(default_factory=list)
    event: trio.Event = field(default_factory=trio.Event)  # set once it is told of one

    def scheduled(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.event.set()


@dataclass
class Ends:
    """The listener for runs' ends (the checkpointer's nudge in the service)."""

    count: int = 0
    event: trio.Event = field(default_factory=trio.Event)

    def __call__(self) -> None:
        self.count += 1
        self.event.set()


def ended(metrics: Metrics, workflow: str, state: RunState, outcome: str = "") -> float:
    labels = {"workflow": workflow, "state": state, "outcome": outcome}
    return metrics.registry.get_sample_value("coordinator_runs_ended_total", labels) or 0.0


def failed_lines(caplog: pytest.LogCaptureFixture, run_id: uuid.UUID) -> list[str]:
    """The run log's lines about ``run_id`` failing."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "registry_coordinator.runs"
        and getattr(r, "run", None) == run_id
        and r.getMessage().startswith("run failed")
    ]


async def pinned(db: Database, name: str) -> tuple[Pinned, Workflows]:
    """tests/workflows/<name>.yaml, pinned and stored as the service does."""
    checked = check_source(TEST_WORKFLOWS / f"{name}.yaml")
    assert checked.definition is not None and checked.digest and checked.artifact
    pin = Pinned(checked.definition, checked.digest, checked.artifact)
    workflows = Workflows([pin])
    await workflows.store(db)
    return pin, workflows


async def start(db: Database, pin: Pinned, run_input: JSON) -> uuid.UUID:
    admitted = await store.admit(
        db, pin.definition, pin.digest, "test", uuid.uuid4().hex, run_input
    )
    return admitted.run_id


def make_due(dsn: str, run_id: uuid.UUID) -> None:
    """As if the run's instant had come (its wait-until's, its next read's)."""
    with sync_connection(dsn) as conn:
        conn.execute(
            "UPDATE runs SET due_at = now() - interval '1 s', "
            "timer_at = CASE WHEN timer_at IS NULL THEN NULL ELSE now() - interval '1 s' END "
            "WHERE id = %s",
            (run_id,),
        )


def state(dsn: str, run_id: uuid.UUID) -> str:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT state FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return str(row["state"])


@asynccontextmanager
async def engine(
    db: Database,
    workflows: Workflows,
    after: AfterCommit,
    products: dict[str, object] | None = None,
) -> AsyncIterator[Engine]:
    """The engine's workers' step loop and call pools, as the service builds them, with
    no worker of its own running: the test hands it the runs it claims."""
    sleepers = Sleepers(db, workflows, "holder:1", LEASE, AfterCommit(after.metrics))
    config = EngineConfig(1, LEASE, SWEEP, timedelta(seconds=5))
    built = Engine(
        db,
        workflows,
        Timer(db, SWEEP, sleepers),
        products or {},  # type: ignore[arg-type]
        config,
        after,
        store.Holdings(),
        "holder:1",
        HighWater(db, None),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(built.calls.run)
        with trio.fail_after(HANG):
            yield built
        nursery.cancel_scope.cancel()


async def claim(db: Database, workflows: Workflows) -> tuple[Definition, store.Claimed]:
    run = await store.claim(db, "holder:1", LEASE)
    assert run is not None
    return await workflows.by_digest(db, run.digest), run


@pytest.mark.trio
async def test_a_worker_tells_the_timer_of_a_wait_and_the_listener_of_a_failure(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker takes woken.yaml to its wait-until a second away: the timer is told; then
    through a choose whose expression fails: counted, heard of once, logged."""
    caplog.set_level(logging.WARNING, "registry_coordinator.runs")
    told, ends, metrics = Told(), Ends(), Metrics()
    async with database(dsn) as db:
        pin, workflows = await pinned(db, "woken")
        run_id = await start(db, pin, {"path": "fail"})
        async with engine(db, workflows, AfterCommit(metrics, ends, told)) as worker:
            await worker.advance(*await claim(db, workflows))
            assert state(dsn, run_id) == RunState.WAITING
            assert len(told.delays) == 1 and 0 < told.delays[0] <= 1
            assert ends.count == 0
            make_due(dsn, run_id)
            await worker.advance(*await claim(db, workflows))
    assert state(dsn, run_id) == RunState.FAILED
    assert ends.count == 1
    assert ended(metrics, "woken", RunState.FAILED) == 1
    assert len(failed_lines(caplog, run_id)) == 1
    assert len(told.delays) == 1  # an ended run is due never again


@pytest.mark.trio
async def test_the_timers_batch_counts_logs_and_tells_of_a_failure(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """woken.yaml's run fails inside the timer's batch, in the statement that wakes it:
    counted, heard of once, and logged as a worker's failure is; the run that sleeps on
    for an hour is not an end."""
    caplog.set_level(logging.WARNING, "registry_coordinator.runs")
    ends, metrics = Ends(), Metrics()
    async with database(dsn) as db:
        pin, workflows = await pinned(db, "woken")
        failing = await start(db, pin, {"path": "fail"})
        sleeping = await start(db, pin, {"path": "sleep"})
        async with engine(db, workflows, AfterCommit(metrics, ends, Told())) as worker:
            for _ in range(2):  # each worker's first step: to sleep at ``pause``
                await worker.advance(*await claim(db, workflows))
        for run_id in (failing, sleeping):
            make_due(dsn, run_id)
        batch = Sleepers(db, workflows, "timer", LEASE, AfterCommit(metrics, ends))
        woken = await batch.wake(10)
    assert woken.taken == 2
    assert state(dsn, failing) == RunState.FAILED
    assert state(dsn, sleeping) == RunState.WAITING
    assert ends.count == 1
    assert ended(metrics, "woken", RunState.FAILED) == 1
    assert len(failed_lines(caplog, failing)) == 1


@asynccontextmanager
async def messaging(
    dsn: str, tmp_path: Path
) -> AsyncIterator[tuple[Database, Pinned, Workflows, dict[str, object], Messaging]]:
    """A migrated database with notice-delivery.yaml pinned, and its Messaging stand-in
    serving on a free port (messages handed to the provider at once)."""
    port = free_port()
    path = write_service_config(
        tmp_path, dsn, ["notice-delivery"], connections={"notices": connection("messaging", port)}
    )
    config = load_config(path)
    async with (
        database(dsn) as db,
        open_products(config.connections) as (products, _),
        trio.open_nursery() as nursery,
    ):
        standin = Messaging(Tokens(STANDIN_TOKEN), delivery_delay=0)
        await nursery.start(standin.serve, "127.0.0.1", port)
        pin, workflows = await pinned(db, "notice-delivery")
        yield db, pin, workflows, products, standin  # type: ignore[misc]
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_call_task_and_a_result_read_tell_the_timer_and_the_listener(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """notice-delivery.yaml: the call task records Messaging's answer and the run goes on
    to wait for the message's delivery, its first read told to the timer; then the read
    finds it handed to the provider, which reports nothing for this sender, and the run
    finishes ``not-reported``: counted and heard of once."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    told, ends, metrics = Told(), Ends(), Metrics()
    async with messaging(dsn, tmp_path) as (db, pin, workflows, products, standin):
        run_id = await start(db, pin, {"email": "a@example.org"})
        async with engine(db, workflows, AfterCommit(metrics, ends, told), products) as worker:
            await worker.advance(*await claim(db, workflows))  # hands the call to its pool
            # The call task's commit is in the database before what follows it has run,
            # so the test waits for the telling itself, not for the run's state.
            await told.event.wait()
            assert state(dsn, run_id) == RunState.WAITING
            assert len(told.delays) == 1 and told.delays[0] > 0  # its first read
            assert ends.count == 0
            while [m["dispatch"] for m in standin.messages.values()] != ["submitted"]:
                await trio.sleep(0.01)  # the provider took it (its sender gets no report)
            make_due(dsn, run_id)
            await worker.advance(*await claim(db, workflows))  # hands the read to its pool
            await ends.event.wait()
    assert state(dsn, run_id) == RunState.FINISHED
    assert ends.count == 1
    assert len(told.delays) == 1  # an ended run is due at no time: nothing more to tell
    assert ended(metrics, "notice-delivery", RunState.FINISHED, "not-reported") == 1
