"""The timer's batches (engine/sleepers.py): many wait-untils taken on in one transaction,
each exactly as a worker's own commit would take it on, all or none of a batch."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta
from typing import Any

import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.canonical import canonical_bytes, digest_of
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import BATCH, LANES, Timer
from registry_coordinator.engine.workflows import Pinned, Workflows
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.steps import Sleep, on_due
from registry_coordinator.store.database import Database, Unavailable, sync_connection
from tests.support import (
    TEST_WORKFLOWS,
    Failing,
    Paused,
    Services,
    database,
    events,
    put_to_sleep,
    run_state,
    wait_for,
)

LEASE = timedelta(seconds=30)

#: The paths a woken run of tests/workflows/woken.yaml can take, by its input.
PATHS = ("finish", "none", "sleep", "call", "fail")


async def woken_workflow(db: Database) -> tuple[Definition, str, Workflows]:
    checked = check_source(TEST_WORKFLOWS / "woken.yaml")
    assert checked.definition is not None and checked.digest and checked.artifact
    workflows = Workflows([Pinned(checked.definition, checked.digest, checked.artifact)])
    await workflows.store(db)
    return checked.definition, checked.digest, workflows


async def asleep(
    db: Database, definition: Definition, digest: str, key: str, path: str
) -> uuid.UUID:
    """A run admitted and committed asleep at ``pause``, by a worker's own transition."""
    admitted = await store.admit(db, definition, digest, "test", key, {"path": path})
    claimed = await store.claim(db, "sleeper", LEASE)
    assert claimed is not None and claimed.id == admitted.run_id
    transition = on_due(definition, claimed.record(), claimed.step, False, None, claimed.now())
    assert isinstance(transition, Sleep)
    await store.commit(db, definition, claimed, transition, LEASE, keep_lease=False)
    return admitted.run_id


def fall_due(dsn: str, runs: list[uuid.UUID]) -> None:
    """As if their wait-until's second had passed."""
    with sync_connection(dsn) as conn:
        conn.execute(
            "UPDATE runs SET timer_at = timer_at - interval '2 s', "
            "due_at = due_at - interval '2 s' WHERE id = ANY(%s)",
            (runs,),
        )


def without(row: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in names}


def told(dsn: str, run: uuid.UUID) -> list[dict[str, Any]]:
    """A run's history but for who wrote it and when (instants in details too)."""
    return [
        without(e, "at", "actor") | {"detail": without(e["detail"], "until")}
        for e in events(dsn, str(run))
    ]


#: What differs between two runs taken the same way: who they are and when it happened.
INSTANTS = ("due_at", "updated_at", "admitted_at", "deadline_at", "ended_at", "timer_at")
IDS = ("id", "start_key", "start_digest", "completed", *INSTANTS)


@pytest.mark.trio
async def test_the_timer_takes_each_run_on_exactly_as_a_worker_would(dsn: str) -> None:
    """For each path a woken run can take (to its end, to another wait-until, to a call,
    into a failing expression), one run is woken by a worker's own commit (claimed, its
    step decided by steps.on_due, store.commit going on through the steps after it, the
    lease given up) and one by the timer's batch, with all the others in the same
    statement. Apart from ids, instants and actor, the runs and their histories are the
    same: the batch is the worker's transition, written for many runs at once."""
    async with database(dsn) as db:
        definition, digest, workflows = await woken_workflow(db)
        by_worker = {p: await asleep(db, definition, digest, f"worker-{p}", p) for p in PATHS}
        by_timer = {p: await asleep(db, definition, digest, f"timer-{p}", p) for p in PATHS}
        sleepers = Sleepers(db, workflows, "timer", LEASE, AfterCommit(Metrics()))
        assert (await sleepers.wake(10)).taken == 0  # none due yet
        fall_due(dsn, list(by_worker.values()))
        for _ in PATHS:
            claimed = await store.claim(db, "sleeper", LEASE)
            assert claimed is not None and claimed.id in by_worker.values()
            now = claimed.now()
            transition = on_due(
                definition, claimed.record(), claimed.step, True, claimed.timer_at, now
            )
            assert transition is not None
            await store.commit(
                db, definition, claimed, transition, LEASE, keep_lease=False, now=now, go_on=True
            )
        fall_due(dsn, list(by_timer.values()))
        woken = await sleepers.wake(10)
    assert (woken.taken, woken.due, woken.left) == (len(PATHS), 1, 0)  # the call is a worker's
    assert len(woken.lateness) == len(PATHS)
    assert all(late >= 0 for late in woken.lateness)

    for path in PATHS:
        worker, timer = run_state(dsn, str(by_worker[path])), run_state(dsn, str(by_timer[path]))
        assert without(worker, *IDS) == without(timer, *IDS), path
        assert worker["completed"].keys() == timer["completed"].keys()
        assert (worker["due_at"] is None) == (timer["due_at"] is None)
        assert told(dsn, by_worker[path]) == told(dsn, by_timer[path]), path
        woke = [e for e in events(dsn, str(by_timer[path])) if e["seq"] > 2]
        assert {e["actor"] for e in woke} == {"coordinator:timer"}
        assert len({e["at"] for e in woke}) == 1  # decided at one instant
    outcomes = {p: run_state(dsn, str(by_timer[p])) for p in PATHS}
    assert [outcomes[p]["state"] for p in PATHS] == [
        "finished",
        "finished",
        "waiting",
        "running",
        "failed",
    ]
    with sync_connection(dsn) as conn:  # an output of none is JSON null, not SQL's NULL
        nulls = conn.execute(
            "SELECT jsonb_typeof(output) AS type FROM runs WHERE id = ANY(%s)",
            ([by_worker["none"], by_timer["none"]],),
        ).fetchall()
    assert [row["type"] for row in nulls] == ["null", "null"]
    assert outcomes["sleep"]["step"] == "again" and outcomes["sleep"]["wakes_to"] == "done"
    assert outcomes["call"]["step"] == "read" and outcomes["call"]["lease_token"] is None
    assert outcomes["call"]["due_at"] == outcomes["call"]["updated_at"]  # any worker's now
    assert outcomes["fail"]["failure_code"] == "expression-error"


def sleepers_due(dsn: str, digest: str, count: int, workflow: str = "woken") -> list[uuid.UUID]:
    """``count`` runs of ``digest`` asleep at ``pause`` since a second ago, by SQL."""
    with sync_connection(dsn) as conn:
        made = conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, timer_at, wakes_to, due_at,
                                  admitted_at, deadline_at, updated_at)
                SELECT gen_random_uuid(), %(digest)s, %(workflow)s, 'test',
                       gen_random_uuid()::text, 'x', '{"path": "finish"}', 'waiting', 'pause',
                       2, now() - interval '1 s', 'route', now() - interval '1 s',
                       now() - interval '2 s', now() + interval '1 hour',
                       now() - interval '2 s'
                FROM generate_series(1, %(count)s)
                RETURNING id, admitted_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, e.seq, admitted_at, e.kind, 'pause', 'test', '{}'
            FROM made, (VALUES (1, 'admitted'), (2, 'waiting')) AS e (seq, kind)
            ORDER BY id, e.seq
            RETURNING run_id
            """,
            {"digest": digest, "workflow": workflow, "count": count},
        ).fetchall()
    return sorted({row["run_id"] for row in made})


def histories(dsn: str, runs: list[uuid.UUID]) -> list[list[str]]:
    return [[e["kind"] for e in events(dsn, str(run))] for run in runs]


ASLEEP = ["admitted", "waiting"]
WOKEN_TO_THE_END = [*ASLEEP, "step-completed", "step-completed", "finished"]


@pytest.mark.trio
async def test_a_batch_cut_off_before_its_commit_leaves_every_run_asleep(dsn: str) -> None:
    """The batch's statement has run inside its transaction when the timer is cancelled
    (a shutdown), and when the database goes away (an outage hides the reply): either
    way nothing of it stays, and the next batch takes every run on once."""
    async with database(dsn) as db:
        _, digest, workflows = await woken_workflow(db)
        runs = sleepers_due(dsn, digest, 30)
        paused = Paused(db, after="advance_sleepers")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                Sleepers(paused, workflows, "timer", LEASE, AfterCommit(Metrics())).wake, 500
            )
            await paused.reached.wait()
            assert histories(dsn, runs[:1]) == [ASLEEP]  # not committed: not visible
            nursery.cancel_scope.cancel()
        assert histories(dsn, runs) == [ASLEEP] * 30
        failing = Failing(db, "advance_sleepers")
        failing.failing_after = 1  # it ran; its reply is lost
        with pytest.raises(Unavailable):
            await Sleepers(failing, workflows, "timer", LEASE, AfterCommit(Metrics())).wake(500)
        assert histories(dsn, runs) == [ASLEEP] * 30
        assert {run_state(dsn, str(r))["seq"] for r in runs} == {2}
        woken = await Sleepers(db, workflows, "timer", LEASE, AfterCommit(Metrics())).wake(500)
    assert (woken.taken, woken.left) == (30, 0)
    assert histories(dsn, runs) == [WOKEN_TO_THE_END] * 30


@pytest.mark.trio
async def test_the_timers_lanes_take_a_burst_once_and_an_outage_in_one_is_an_outage(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst of more batches than lanes: while one lane's statement fails (an outage),
    the timer logs an outage, not a defect (the lanes' error group is not what it
    catches), and nothing of the burst commits; once the database answers, each run is
    taken on once."""
    count = BATCH * LANES + 7  # every lane takes a batch, and one a further one
    async with database(dsn, size=LANES + 1) as db:
        _, digest, workflows = await woken_workflow(db)
        runs = sleepers_due(dsn, digest, count)
        failing = Failing(db, "advance_sleepers")
        failing.failing_before = 10**6
        timer = Timer(
            failing,
            timedelta(seconds=30),
            Sleepers(failing, workflows, "t", LEASE, AfterCommit(Metrics())),
        )
        caplog.set_level(logging.WARNING, "registry_coordinator.engine.timers")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            with trio.fail_after(30):
                await failing.refused.wait()
                while not caplog.records:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        said = [record.getMessage() for record in caplog.records]
        assert said[0].startswith("timer: database unavailable: the test's outage"), said
        assert not any("unexpected" in line for line in said), said
        assert histories(dsn, runs) == [ASLEEP] * count
        all_ended, left = trio.Event(), count

        def one_ended() -> None:  # as the service's checkpointer is told of each end
            nonlocal left
            left -= 1
            if not left:
                all_ended.set()

        after = AfterCommit(Metrics(), ended=one_ended)
        timer = Timer(db, timedelta(seconds=30), Sleepers(db, workflows, "t", LEASE, after))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            with trio.fail_after(60):  # a hang guard, not a bound on how fast
                await all_ended.wait()
            nursery.cancel_scope.cancel()
    assert histories(dsn, runs) == [WOKEN_TO_THE_END] * count


@pytest.mark.trio
async def test_a_locked_run_is_skipped_and_an_undecidable_one_is_left_to_the_workers(
    dsn: str,
) -> None:
    """Three due sleepers: one whose stored definition this build cannot load, one
    another transaction holds (an operator's, a delivery's) and one the batch can take.
    The batch takes the third, does not wait for the locked one, and makes the first a
    worker's to wake (no ``wakes_to``) without changing anything else about it; once the
    lock is gone, the next batch takes the second."""
    async with database(dsn) as db:
        _, digest, workflows = await woken_workflow(db)
        unusable = canonical_bytes({"format": "not-an-artifact"})
        with sync_connection(dsn) as conn:
            conn.execute(
                "INSERT INTO definitions (digest, workflow_id, version, artifact) "
                "VALUES (%s, 'woken', 'old', %s)",
                (digest_of(unusable), unusable),
            )
        (undecidable,) = sleepers_due(dsn, digest_of(unusable), 1)
        locked, free = sleepers_due(dsn, digest, 2)
        sleepers = Sleepers(db, workflows, "timer", LEASE, AfterCommit(Metrics()))
        with sync_connection(dsn) as holder:
            holder.execute("BEGIN")
            holder.execute("SELECT 1 FROM runs WHERE id = %s FOR UPDATE", (locked,))
            with trio.fail_after(30):
                woken = await sleepers.wake(500)
            holder.execute("ROLLBACK")
        assert (woken.taken, woken.left) == (1, 1)
        assert histories(dsn, [undecidable, locked, free]) == [ASLEEP, ASLEEP, WOKEN_TO_THE_END]
        left = run_state(dsn, str(undecidable))
        assert left["wakes_to"] is None
        assert (left["state"], left["step"], left["seq"], left["lease_token"]) == (
            "waiting",
            "pause",
            2,
            None,
        )
        assert (await sleepers.wake(500)).taken == 1  # the one that was locked
        claimed = await store.claim(db, "worker", LEASE)  # the workers' to wake now
        assert claimed is not None and claimed.id == undecidable
    assert histories(dsn, [locked]) == [WOKEN_TO_THE_END]


def test_killed_inside_a_batch_its_runs_wake_once_on_restart(dsn: str, services: Services) -> None:
    """The service kills itself inside its first batch (its statement run, not committed).
    Restarted, every run finishes once: the batch left nothing, and no step was taken
    twice or skipped."""
    config = services.configure(["timed-choice"], workers=1)
    doomed = services.start(config, crash_at="mid-wake:1")
    put_to_sleep(dsn, 300, timedelta(seconds=1))
    assert doomed.process.wait(60) == -9, "the crash point was never reached"
    with sync_connection(dsn) as conn:
        unfinished = conn.execute("SELECT count(*) AS n FROM runs WHERE ended_at IS NULL")
        assert (unfinished.fetchone() or {})["n"] > 0, "the kill left nothing to recover"
    services.start(config)
    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'finished'", 300, timeout=120)
    with sync_connection(dsn) as conn:
        told = conn.execute(
            "SELECT array_agg(kind ORDER BY seq) AS kinds, array_agg(seq ORDER BY seq) AS seqs "
            "FROM run_events GROUP BY run_id"
        ).fetchall()
    assert len(told) == 300
    assert {tuple(t["kinds"]) for t in told} == {tuple(WOKEN_TO_THE_END)}
    assert {tuple(t["seqs"]) for t in told} == {(1, 2, 3, 4, 5)}
