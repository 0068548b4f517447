"""PostgreSQL from Trio: psycopg's blocking API on a thread per connection, and the named
queries.

Every statement the service sends is a query named in ``sql/queries.sql``, looked up
strictly: a name that is not declared raises :class:`UnknownQuery` before anything is
sent (a misspelled name must never reach PostgreSQL as if it were SQL). The one
exception is a migration's file, run whole by :meth:`Connection.execute_script`.

Why threads: each connection of the pool is a :class:`_Session`, a blocking psycopg
connection that one thread alone uses, fed by a queue; a Trio task hands the thread a
statement and sleeps until the thread reschedules it with the outcome. Measured on this
machine (``bench/run.py client``), a statement costs about a third of the CPU it cost
through psycopg's asyncio API under trio-asyncio, and less than with ``trio.to_thread``
(a thread from its cache, and a round of Trio's machinery, for every call). LISTEN, which
waits for hours and must end the moment it is cancelled, keeps the asyncio API
(:func:`notifications`); nothing else crosses into asyncio.

Cancellation: a statement handed to its thread cannot be taken back. A task cancelled
while its statement runs is released at once, as a network client abandons a reply it no
longer waits for, and the session is abandoned with it: its thread lets the statement end,
closes the connection (PostgreSQL rolls back any transaction left open) and ends. So a
cancelled statement is applied whole or not at all, never half; and a connection that was
mid-statement or mid-transaction is never given to another task: the pool connects a new
one in its place.

The pool is ours rather than psycopg_pool's: a checkout is a Trio channel receive, and a
connection that broke or was left mid-transaction is closed and replaced, never reused.
"""

from __future__ import annotations

import asyncio
import difflib
import queue
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from importlib import resources
from typing import Any, ParamSpec, Protocol, TypeVar, cast

import outcome
import psycopg
import psycopg.waiting
import trio
import trio_asyncio
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from registry_coordinator.errors import CoordinatorError, ExitCode

# trio_asyncio replaces asyncio's running-loop lookup so asyncio code finds the loop
# it runs inside Trio; psycopg.waiting took its own reference to the original when it
# was imported, possibly before trio_asyncio was. Point it at the patched one.
psycopg.waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]

Row = dict[str, Any]
T = TypeVar("T")
P = ParamSpec("P")


def _aio(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """An asyncio coroutine function, callable from Trio (typed ``aio_as_trio``)."""
    return cast(Callable[P, Awaitable[T]], trio_asyncio.aio_as_trio(function))


MINIMUM_SERVER_VERSION = 170000


def _load_queries() -> dict[str, str]:
    text = resources.files(__package__).joinpath("sql", "queries.sql").read_text("utf-8")
    queries: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        queries[name.strip()] = body.strip()
    return queries


#: The named queries of sql/queries.sql.
QUERIES = _load_queries()


class UnknownQuery(LookupError):
    """A query name that sql/queries.sql does not declare: a defect in the caller, so
    not a :class:`CoordinatorError`; it keeps its traceback."""


def named(name: str) -> str:
    """The SQL of the query ``name``; :class:`UnknownQuery` if there is none."""
    try:
        return QUERIES[name]
    except KeyError:
        close = difflib.get_close_matches(name, QUERIES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UnknownQuery(f"no query named {name!r} in sql/queries.sql{hint}") from None


def sync_connection(dsn: str) -> psycopg.Connection[Row]:
    """A blocking autocommit connection, for work outside the event loop (the embedded
    server's setup, tests)."""
    return psycopg.connect(dsn, autocommit=True, row_factory=dict_row)


class Queries(Protocol):
    """What both a pooled :class:`Database` and a checked-out :class:`Connection` offer:
    named queries only."""

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]: ...

    async def row(self, query: str, params: Mapping[str, Any] | None = None) -> Row | None: ...

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int: ...


class Unavailable(CoordinatorError):
    """The database cannot be reached (exit code 3)."""

    exit_code = ExitCode.UNAVAILABLE
    summary = "database unavailable"


class StatementFailed(CoordinatorError):
    """The database refused a statement for what it holds, not for an outage (data it
    cannot store, a broken constraint): a defect, which repeating will not cure."""


def _translated(exc: psycopg.Error) -> Exception:
    """An outage (the connection, the server, a conflict that may pass) is Unavailable;
    anything else the database refuses is StatementFailed."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return Unavailable(_first_line(exc))
    return StatementFailed(_first_line(exc))


class _Session:
    """One PostgreSQL connection and the thread that alone uses it (see the module's
    docstring for why, and for what cancelling a task that waits on it does)."""

    def __init__(self) -> None:
        self.raw: psycopg.Connection[Row] | None = None  # set by the thread: see connect
        self.abandoned = False  # set, in Trio's thread, when a task gave up waiting on it
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        # A daemon only so that a process ending on a defect is not kept alive by it: the
        # pool that made a session closes it and joins its thread.
        self.thread = threading.Thread(target=self._serve, name="coordinator-database", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
        if self.raw is not None:
            self.raw.close()

    async def run(self, function: Callable[[], T]) -> T:
        """``function()`` on this session's thread: its value, or what it raised."""
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()

        def deliver(result: outcome.Outcome[T]) -> None:  # in Trio's thread, as abort is
            if not self.abandoned:
                trio.lowlevel.reschedule(task, result)

        def abort(_: object) -> trio.lowlevel.Abort:
            self.abandoned = True
            self._jobs.put(None)  # after the statement in hand: close the connection, end
            return trio.lowlevel.Abort.SUCCEEDED

        def job() -> None:  # in this session's thread
            result = outcome.capture(function)
            # Abandoned, and Trio has ended since: no one waits for the outcome.
            with suppress(trio.RunFinishedError):
                token.run_sync_soon(deliver, result)

        self._jobs.put(job)
        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    async def connect(self, dsn: str, application_name: str) -> None:
        def connect() -> None:
            self.raw = psycopg.connect(
                dsn,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=10,
                application_name=application_name,
            )

        await self.run(connect)

    @property
    def idle(self) -> bool:
        """Open, with no statement or transaction under way: fit to be given out again."""
        return (
            not self.abandoned
            and self.raw is not None
            and not self.raw.closed
            and self.raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        )

    def close(self) -> None:
        """Close the connection once its thread has done what it was given, and end it."""
        self._jobs.put(None)


class Connection:
    """One checked-out connection; every call runs a named query."""

    def __init__(self, session: _Session) -> None:
        self.session = session

    async def blocking(self, function: Callable[[psycopg.Connection[Row]], T]) -> T:
        """``function(connection)`` on the connection's own thread, psycopg's errors
        translated: for what is not a named query (a migration's file; tests' own SQL)."""

        def call() -> T:
            assert self.session.raw is not None
            return function(self.session.raw)

        try:
            return await self.session.run(call)
        except psycopg.Error as exc:
            raise _translated(exc) from None

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run a named query and return its rows, if it has any."""
        sql, adapted = named(query), _adapt(params)
        return await self.blocking(lambda raw: _fetch(raw, sql, adapted))

    async def row(self, query: str, params: Mapping[str, Any] | None = None) -> Row | None:
        found = await self.rows(query, params)
        return found[0] if found else None

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a named statement; returns the number of rows it touched."""
        sql, adapted = named(query), _adapt(params)
        return await self.blocking(lambda raw: raw.execute(sql, adapted).rowcount)

    async def execute_script(self, script: str) -> None:
        """Run SQL text that is not a named query: a migration's whole file (statements
        without parameters). Only :mod:`migrations` sends such text."""
        await self.blocking(lambda raw: raw.execute(script))

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A transaction around the block: committed if the block ends normally, rolled
        back if it raises. Cancelled, the session is abandoned (its thread closes the
        connection, so PostgreSQL rolls back) unless the block was between statements,
        when it is rolled back here."""
        await self.blocking(lambda raw: raw.execute("BEGIN"))
        try:
            yield self
        except BaseException:
            if not self.session.abandoned:
                # Broken meanwhile, the connection is closed by the pool: PostgreSQL rolls back.
                with trio.CancelScope(shield=True), suppress(CoordinatorError):
                    await self.blocking(lambda raw: raw.execute("ROLLBACK"))
            raise
        await self.blocking(lambda raw: raw.execute("COMMIT"))


def _fetch(raw: psycopg.Connection[Row], sql: str, params: dict[str, Any] | None) -> list[Row]:
    cursor = raw.execute(sql, params)
    return [] if cursor.description is None else cursor.fetchall()


def _adapt(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Dicts are sent as jsonb (lists stay arrays); everything else as psycopg adapts it."""
    if params is None:
        return None
    return {k: Jsonb(v) if isinstance(v, dict) else v for k, v in params.items()}


class Database:
    """A fixed-size pool of autocommit connections to one PostgreSQL database."""

    def __init__(self, dsn: str, size: int, application_name: str = "registry-coordinator") -> None:
        self.dsn = dsn
        self.size = size
        self.application_name = application_name  # on every session, in pg_stat_activity
        self._send, self._receive = trio.open_memory_channel[Connection | None](size)
        self._left: list[threading.Thread] = []  # threads of sessions closed, to join

    @classmethod
    async def open(
        cls, dsn: str, size: int, application_name: str = "registry-coordinator"
    ) -> Database:
        """Connect the whole pool now, so an unreachable database stops startup."""
        database = cls(dsn, size, application_name)
        connected: list[Connection] = []
        try:
            for _ in range(size):
                connected.append(await database._connect())
        except BaseException:
            for conn in connected:
                database._retire(conn.session)
            await database._join()
            raise
        for conn in connected:
            database._send.send_nowait(conn)
        return database

    async def _connect(self) -> Connection:
        session = _Session()
        try:
            await session.connect(self.dsn, self.application_name)
        except BaseException as exc:
            self._retire(session)
            if isinstance(exc, psycopg.OperationalError):
                raise Unavailable(_first_line(exc)) from None
            raise
        return Connection(session)

    def _retire(self, session: _Session) -> None:
        session.close()
        self._left = [thread for thread in self._left if thread.is_alive()]
        self._left.append(session.thread)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Check out a connection; it goes back only if it is idle and healthy."""
        conn = await self._receive.receive()
        try:
            if conn is None or not conn.session.idle:
                if conn is not None:
                    self._retire(conn.session)
                conn = None
                conn = await self._connect()
            yield conn
        finally:
            if conn is not None and not conn.session.idle:
                self._retire(conn.session)
                conn = None
            self._send.send_nowait(conn)

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        async with self.connection() as conn:
            return await conn.rows(query, params)

    async def row(self, query: str, params: Mapping[str, Any] | None = None) -> Row | None:
        async with self.connection() as conn:
            return await conn.row(query, params)

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        async with self.connection() as conn:
            return await conn.execute(query, params)

    async def close(self) -> None:
        """Close every connection once it is given back, and wait for their threads (a
        session abandoned mid-statement ends when its statement does)."""
        with trio.CancelScope(shield=True):
            for _ in range(self.size):
                conn = await self._receive.receive()
                if conn is not None:
                    self._retire(conn.session)
            await self._join()

    async def _join(self) -> None:
        """Wait for the threads of the sessions closed (shielded: they end on their own)."""
        with trio.CancelScope(shield=True):
            for thread in self._left:
                await trio.to_thread.run_sync(thread.join)
        self._left = []


@asynccontextmanager
async def notifications(db: Database, channel: str) -> AsyncIterator[AsyncIterator[str]]:
    """A dedicated connection to ``db``'s database LISTENing on ``channel``, yielding
    notification payloads.

    A lost connection surfaces as :class:`Unavailable`, from here or from iterating.
    """
    try:
        raw = await _aio(psycopg.AsyncConnection.connect)(
            db.dsn, autocommit=True, connect_timeout=10, application_name=db.application_name
        )
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    try:
        await _aio(raw.execute)(f"LISTEN {channel}")
        yield _payloads(raw)
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    finally:
        with trio.CancelScope(shield=True):
            await _aio(raw.close)()


async def _payloads(raw: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
    async for note in trio_asyncio.aio_as_trio(raw.notifies()):
        yield note.payload


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
