"""Forcing an interleaving of two connections, for tests of races against real PostgreSQL.

The code under test runs unchanged; only the database handle it is given differs
(each overrides ``Database.connection``, which every statement goes through):

* :class:`Paused` runs every statement on the real pool, but stops right after a
  named statement — inside its transaction, its locks held — until the test says go;
* :class:`Uncommitted` runs every statement on one connection inside a transaction the
  test opened and commits when it chooses (:func:`rival_while_uncommitted`);
* :class:`Failing` makes named statements fail as an outage or a defect would: before
  they run, or after they committed (the answer lost on the way back).

Meanwhile the test runs the rival statement on another connection and waits, with
:func:`blocked_or_done`, until PostgreSQL shows it waiting for a lock (or finished).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Generic, TypeVar

import trio

from registry_coordinator.store.database import Connection, Database, Row, Unavailable

T = TypeVar("T")


class _Gate:
    """Stops the first time a named statement has run, until :attr:`go` is set."""

    def __init__(self, after: str) -> None:
        self.after = after
        self.reached = trio.Event()
        self.go = trio.Event()

    async def passed(self, query: str) -> None:
        if query == self.after and not self.reached.is_set():
            self.reached.set()
            await self.go.wait()


class _GatedConnection(Connection):
    def __init__(self, inner: Connection, gate: _Gate) -> None:
        super().__init__(inner.raw)
        self.gate = gate

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        found = await super().rows(query, params)
        await self.gate.passed(query)
        return found

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        touched = await super().execute(query, params)
        await self.gate.passed(query)
        return touched


class Paused(Database):
    """``db``'s pool, pausing after the statement named ``after`` (its first run)."""

    def __init__(self, db: Database, after: str) -> None:
        super().__init__(db.dsn, 1)
        self.db = db
        self.gate = _Gate(after)

    @property
    def reached(self) -> trio.Event:
        return self.gate.reached

    def go(self) -> None:
        self.gate.go.set()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.db.connection() as conn:
            yield _GatedConnection(conn, self.gate)


class Uncommitted(Database):
    """One connection, inside a transaction the test began (``BEGIN``) and ends."""

    def __init__(self, conn: Connection, dsn: str) -> None:
        super().__init__(dsn, 1)
        self.conn = conn

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        yield self.conn


class _FailingConnection(Connection):
    def __init__(self, inner: Connection, owner: Failing) -> None:
        super().__init__(inner.raw)
        self.owner = owner

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        self.owner.before(query)
        found = await super().rows(query, params)
        self.owner.after(query)
        return found

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        self.owner.before(query)
        touched = await super().execute(query, params)
        self.owner.after(query)
        return touched


class Failing(Database):
    """``db``'s pool, where the statement named ``query`` fails with ``error``: the next
    :attr:`before` times before it runs (an outage: set it high, then to 0 to end it),
    and the next :attr:`after` times once it has committed (the reply lost on the way)."""

    def __init__(self, db: Database, query: str, error: type[Exception] = Unavailable) -> None:
        super().__init__(db.dsn, 1)
        self.db = db
        self.query = query
        self.error = error
        self.failing_before = 0
        self.failing_after = 0
        self.refused = trio.Event()  # set the first time it fails

    def before(self, query: str) -> None:
        if query == self.query and self.failing_before > 0:
            self.failing_before -= 1
            self.refused.set()
            raise self.error("the test's outage")

    def after(self, query: str) -> None:
        if query == self.query and self.failing_after > 0:
            self.failing_after -= 1
            self.refused.set()
            raise self.error("the test's outage, after the statement committed")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        async with self.db.connection() as conn:
            yield _FailingConnection(conn, self)


async def blocked_or_done(observer: Database, done: trio.Event) -> bool:
    """Wait until another session waits for a lock (True), or ``done`` is set (False)."""
    while not done.is_set():
        async with observer.connection() as conn:  # a test's own SQL: not a named query
            cursor = await conn.raw.execute("SELECT count(*) AS n FROM pg_locks WHERE NOT granted")
            row = await cursor.fetchone()
        if row is not None and row["n"] > 0:
            return True
        await trio.sleep(0.01)
    return False


class _Rival(Generic[T]):
    """The rival statement, run in its own task; :attr:`done` once it has returned."""

    def __init__(self, rival: Callable[[], Awaitable[T]]) -> None:
        self.rival = rival
        self.done = trio.Event()
        self.result: list[T] = []

    async def run(self) -> None:
        self.result.append(await self.rival())
        self.done.set()


async def rival_while_paused(
    paused: Paused,
    first: Callable[[], Awaitable[object]],
    rival: Callable[[], Awaitable[T]],
    observer: Database,
) -> tuple[bool, T]:
    """Run ``first`` until it pauses, then ``rival`` until it waits for a lock (or ends),
    then let ``first`` go; whether the rival waited for it, and what the rival returned."""
    contender = _Rival(rival)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await paused.reached.wait()
        nursery.start_soon(contender.run)
        blocked = await blocked_or_done(observer, contender.done)
        paused.go()
    return blocked, contender.result[0]


async def rival_while_uncommitted(
    db: Database,
    first: Callable[[Database], Awaitable[object]],
    rival: Callable[[], Awaitable[T]],
) -> tuple[bool, T]:
    """Run ``first`` on one of ``db``'s connections inside a transaction left open (its
    locks held), then ``rival`` until it waits for a lock (or ends), then commit; whether
    the rival waited for the commit, and what the rival returned."""
    contender = _Rival(rival)
    async with db.connection() as conn:
        await conn.raw.execute("BEGIN")
        await first(Uncommitted(conn, db.dsn))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(contender.run)
            blocked = await blocked_or_done(db, contender.done)
            await conn.raw.execute("COMMIT")
    return blocked, contender.result[0]
