"""The database client under cancellation, against real PostgreSQL: a task cancelled while
its statement runs is released at once; the statement is applied whole or not at all;
a connection left mid-statement or mid-transaction is never given to another task, and
is closed (so PostgreSQL rolls its transaction back); the pool stays full, and closing it
leaves no thread behind.

A statement is kept running, deterministically, by a row lock the test holds: it waits
until the test commits, so no test here depends on how long anything takes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
import pytest
import trio

from registry_coordinator.engine.database import Connection, Database, Row, StatementFailed
from tests.harness import database
from tests.interleave import blocked_or_done

LOCKED_UPDATE = "UPDATE probe SET n = n + 1 WHERE id = 1"
MARK = "INSERT INTO marks VALUES ('mark')"


def backends(dsn: str) -> set[int]:
    """The pids of the coordinator's sessions on the test's database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'registry-coordinator'"
        ).fetchall()
    return {pid for (pid,) in rows}


def probe(dsn: str) -> tuple[int, int]:
    """The probe row's counter and the number of marks written."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT (SELECT n FROM probe WHERE id = 1), (SELECT count(*) FROM marks)"
        ).fetchone()
    assert row is not None
    return row[0], row[1]


@contextmanager
def row_locked(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The probe table, its row locked by an open transaction until the block ends."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE probe (id int PRIMARY KEY, n int NOT NULL)")
        setup.execute("CREATE TABLE marks (note text)")
        setup.execute("INSERT INTO probe VALUES (1, 0)")
    holder = psycopg.connect(dsn)
    holder.execute("SELECT n FROM probe WHERE id = 1 FOR UPDATE")
    try:
        yield holder
    finally:
        holder.close()


def send(sql: str, raw: psycopg.Connection[Row]) -> None:
    raw.execute(sql.encode())


async def pid_of(conn: Connection) -> int:
    row = await conn.blocking(lambda raw: raw.execute("SELECT pg_backend_pid() AS pid").fetchone())
    assert row is not None
    return int(row["pid"])


@asynccontextmanager
async def cancelled_while_blocked(
    db: Database, statements: list[str]
) -> AsyncIterator[tuple[trio.CancelScope, int]]:
    """Run ``statements`` on one connection (the last waits for the test's lock), cancel
    the task once PostgreSQL shows it waiting; the scope and the connection's pid."""
    scope = trio.CancelScope()
    pids: list[int] = []
    waiting = trio.Event()

    async def run() -> None:
        with scope:
            async with db.connection() as conn:
                pids.append(await pid_of(conn))
                async with conn.transaction():
                    for sql in statements:
                        await conn.blocking(functools.partial(send, sql))
        waiting.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        assert await blocked_or_done(db, trio.Event())
        scope.cancel()
        await waiting.wait()
        yield scope, pids[0]


@pytest.mark.trio
async def test_a_task_cancelled_mid_statement_is_released_and_its_statement_applies_whole(
    dsn: str,
) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            before = backends(dsn)
            async with cancelled_while_blocked(db, [LOCKED_UPDATE]) as (scope, pid):
                # Released while PostgreSQL still waits for the lock the test holds.
                assert scope.cancelled_caught
                assert pid in backends(dsn)
                assert probe(dsn) == (0, 0)
                # The pool gives out another connection, never the abandoned one.
                async with db.connection() as conn:
                    assert await pid_of(conn) != pid
            holder.commit()
            # The abandoned statement ran to its end and its session closed, rolling back
            # the transaction it was in: applied whole or not at all; here, not at all.
            await wait_gone(dsn, pid)
            assert probe(dsn) == (0, 0)
            # The pool is whole again: two connections, a new one in the abandoned's place.
            async with db.connection() as a, db.connection() as b:
                now = {await pid_of(a), await pid_of(b)}
        assert len(before) == len(now) == 2 and pid in before and pid not in now


@pytest.mark.trio
async def test_an_abandoned_transaction_leaves_none_of_its_statements(dsn: str) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            statements = [MARK, LOCKED_UPDATE]
            async with cancelled_while_blocked(db, statements) as (scope, pid):
                assert scope.cancelled_caught
            holder.commit()
            await wait_gone(dsn, pid)
            assert probe(dsn) == (0, 0)


@pytest.mark.trio
async def test_a_statement_outside_a_transaction_applies_whole_though_its_task_was_cancelled(
    dsn: str,
) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            scope = trio.CancelScope()
            done = trio.Event()

            async def update() -> None:
                with scope:
                    async with db.connection() as conn:
                        await conn.blocking(lambda raw: raw.execute(LOCKED_UPDATE))
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(update)
                assert await blocked_or_done(db, trio.Event())
                scope.cancel()
                await done.wait()
            assert scope.cancelled_caught and probe(dsn) == (0, 0)
            holder.commit()
            # An autocommit statement, once sent, commits on its own: whole, once.
            await wait_until_count(dsn, 1)
            assert probe(dsn) == (1, 0)


@pytest.mark.trio
async def test_a_transaction_cancelled_between_statements_is_rolled_back_and_its_connection_reused(
    dsn: str,
) -> None:
    with row_locked(dsn):
        async with database(dsn, size=1) as db:
            with trio.CancelScope() as scope:
                async with db.connection() as conn:
                    pid = await pid_of(conn)
                    async with conn.transaction():
                        await conn.blocking(lambda raw: raw.execute(MARK))
                        scope.cancel()
                        await trio.sleep_forever()  # cancelled here, between statements
            assert scope.cancelled_caught
            async with db.connection() as conn:
                assert await pid_of(conn) == pid
            assert probe(dsn) == (0, 0)


@pytest.mark.trio
async def test_a_refused_statement_rolls_its_transaction_back_and_the_connection_is_reused(
    dsn: str,
) -> None:
    with row_locked(dsn):
        async with database(dsn, size=1) as db:
            async with db.connection() as conn:
                pid = await pid_of(conn)
                with pytest.raises(StatementFailed, match="division by zero"):
                    await mark_then_divide(conn)
            async with db.connection() as conn:
                assert await pid_of(conn) == pid
            assert probe(dsn) == (0, 0)


@pytest.mark.trio
async def test_closing_the_pool_waits_for_an_abandoned_session_and_leaves_no_thread(
    dsn: str,
) -> None:
    def session_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "coordinator-database"}

    others = session_threads()  # none, unless another test left some: not this test's
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            assert len(session_threads() - others) == 2
            async with cancelled_while_blocked(db, [LOCKED_UPDATE]) as (scope, _):
                assert scope.cancelled_caught
            # The abandoned session's thread still waits on the lock; a new one replaces it.
            async with db.connection() as a, db.connection() as b:
                assert {await pid_of(a), await pid_of(b)}
                assert len(session_threads() - others) == 3
            holder.commit()
    assert session_threads() - others == set()


async def mark_then_divide(conn: Connection) -> None:
    async with conn.transaction():
        await conn.blocking(lambda raw: raw.execute(MARK))
        await conn.blocking(lambda raw: raw.execute("SELECT 1 / 0"))


async def wait_gone(dsn: str, pid: int) -> None:
    """Until the backend ``pid`` has ended (bounded by the test's hang guard)."""
    while pid in backends(dsn):
        await trio.sleep(0.01)


async def wait_until_count(dsn: str, n: int) -> None:
    while probe(dsn)[0] != n:
        await trio.sleep(0.01)
