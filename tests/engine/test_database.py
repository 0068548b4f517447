"""The database client under cancellation, against real PostgreSQL: a task cancelled while
its statement runs is released at once; the statement is applied whole or not at all;
a connection left mid-statement is never given to another task but closed (so PostgreSQL
rolls its transaction back); a transaction cancelled between statements is rolled back
and its connection reused; the pool stays at its size.

A statement is kept running, deterministically, by a row lock the test holds: it waits
until the test commits, so no test here depends on how long anything takes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import psycopg
import pytest
import trio

from registry_coordinator.store.database import Connection, Database, StatementFailed
from tests.support import blocked_or_done, database

#: Touches both rows of the probe; the second it meets (id 1) is the one the test locks,
#: so a statement applied by halves would show as the rows' counts differing.
UPDATE_BOTH = b"UPDATE probe SET n = n + 1"
MARK = b"INSERT INTO marks VALUES ('mark')"


def backends(dsn: str) -> set[int]:
    """The pids of the coordinator's sessions on the test's database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = 'registry-coordinator'"
        ).fetchall()
    return {pid for (pid,) in rows}


def probe(dsn: str) -> tuple[list[int], int]:
    """The probe rows' counters, by id, and the number of marks written."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        counts = [n for (n,) in conn.execute("SELECT n FROM probe ORDER BY id").fetchall()]
        marks = conn.execute("SELECT count(*) FROM marks").fetchone()
    assert marks is not None
    return counts, marks[0]


@contextmanager
def row_locked(dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The probe table, its row 1 locked by an open transaction until the block ends."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("CREATE TABLE probe (id int PRIMARY KEY, n int NOT NULL)")
        setup.execute("CREATE TABLE marks (note text)")
        setup.execute("INSERT INTO probe VALUES (2, 0)")  # first in the heap: updated first
        setup.execute("INSERT INTO probe VALUES (1, 0)")
    holder = psycopg.connect(dsn)
    holder.execute("SELECT n FROM probe WHERE id = 1 FOR UPDATE")
    try:
        yield holder
    finally:
        holder.close()


async def send(conn: Connection, sql: bytes) -> None:
    """The test's own SQL on a checked-out connection (not a named query)."""
    await conn.raw.execute(sql)


async def pid_of(conn: Connection) -> int:
    cursor = await conn.raw.execute(b"SELECT pg_backend_pid() AS pid")
    row = await cursor.fetchone()
    assert row is not None
    return int(row["pid"])


@asynccontextmanager
async def cancelled_while_blocked(
    db: Database, statements: list[bytes], transaction: bool = True
) -> AsyncIterator[tuple[trio.CancelScope, int]]:
    """Run ``statements`` on one connection (in a transaction, or not), the last waiting
    for the test's lock; cancel the task once PostgreSQL shows it waiting. The task's
    cancel scope and the connection's backend pid."""
    scope = trio.CancelScope()
    pids: list[int] = []
    ended = trio.Event()

    async def run(conn: Connection) -> None:
        for sql in statements:
            await send(conn, sql)

    async def task() -> None:
        with scope:
            async with db.connection() as conn:
                pids.append(await pid_of(conn))
                if transaction:
                    async with conn.transaction():
                        await run(conn)
                else:
                    await run(conn)
        ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(task)
        assert await blocked_or_done(db, trio.Event())
        scope.cancel()
        await ended.wait()
        yield scope, pids[0]


async def wait_gone(dsn: str, pid: int) -> None:
    """Until the backend ``pid`` has ended (bounded by the test's hang guard)."""
    while pid in backends(dsn):
        await trio.sleep(0.01)


@pytest.mark.trio
async def test_a_task_cancelled_mid_statement_is_released_and_its_connection_never_reused(
    dsn: str,
) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            before = backends(dsn)
            async with cancelled_while_blocked(db, [UPDATE_BOTH]) as (scope, pid):
                # Released while PostgreSQL still waits for the lock the test holds.
                assert scope.cancelled_caught
                assert probe(dsn) == ([0, 0], 0)
                # The pool gives out another connection, never the one left mid-statement.
                async with db.connection() as conn:
                    assert await pid_of(conn) != pid
            holder.commit()
            # Its session closed, PostgreSQL rolled back the transaction it was in.
            await wait_gone(dsn, pid)
            assert probe(dsn) == ([0, 0], 0)
            # The pool is whole again: two connections, a new one in the closed one's place.
            async with db.connection() as a, db.connection() as b:
                now = {await pid_of(a), await pid_of(b)}
        assert len(before) == len(now) == 2 and pid in before and pid not in now


@pytest.mark.trio
async def test_a_transaction_abandoned_mid_statement_leaves_none_of_its_statements(
    dsn: str,
) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            async with cancelled_while_blocked(db, [MARK, UPDATE_BOTH]) as (scope, pid):
                assert scope.cancelled_caught
            holder.commit()
            await wait_gone(dsn, pid)
            assert probe(dsn) == ([0, 0], 0)


@pytest.mark.trio
async def test_a_statement_outside_a_transaction_applies_whole_or_not_at_all_when_cancelled(
    dsn: str,
) -> None:
    with row_locked(dsn) as holder:
        async with database(dsn, size=2) as db:
            async with cancelled_while_blocked(db, [UPDATE_BOTH], transaction=False) as (
                scope,
                pid,
            ):
                assert scope.cancelled_caught
                assert probe(dsn) == ([0, 0], 0)  # the row it met first is not changed yet
            holder.commit()
            await wait_gone(dsn, pid)
            counts, _ = probe(dsn)
            # Whether PostgreSQL committed it before it saw the client gone is its affair;
            # both rows or neither, never one.
            assert counts in ([0, 0], [1, 1])


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
                        await send(conn, MARK)
                        scope.cancel()
                        await trio.sleep_forever()  # cancelled here, between statements
            assert scope.cancelled_caught
            async with db.connection() as conn:
                assert await pid_of(conn) == pid
            assert probe(dsn) == ([0, 0], 0)


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
            assert probe(dsn) == ([0, 0], 0)


async def mark_then_divide(conn: Connection) -> None:
    async with conn.transaction():
        await conn.execute_script(MARK.decode())
        await conn.execute_script("SELECT 1 / 0")
