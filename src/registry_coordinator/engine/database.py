"""PostgreSQL from Trio: psycopg's async API through trio-asyncio, and the named queries.

Every statement the service sends is a query named in ``sql/queries.sql``, looked up
strictly: a name that is not declared raises :class:`UnknownQuery` before anything is
sent (a misspelled name must never reach PostgreSQL as if it were SQL). The one
exception is a migration's file, run whole by :meth:`Connection.execute_script`.

psycopg speaks asyncio; the service is Trio. trio-asyncio runs an asyncio loop
inside Trio, and every psycopg await here crosses over with ``aio_as_trio``, so
the rest of the code sees plain Trio functions and Trio cancellation.

The pool is ours rather than psycopg_pool's: that pool runs asyncio workers and
its checkout costs an asyncio round trip (measured 0.69 ms against 0.27 ms for a
bare query); here a checkout is a Trio channel receive. Connections that break or
are left mid-transaction by a cancellation are closed and replaced, never reused.
"""

from __future__ import annotations

import asyncio
import difflib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from typing import Any, ParamSpec, Protocol, TypeVar, cast

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
P = ParamSpec("P")
T = TypeVar("T")


def aio(function: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """An asyncio coroutine function, callable from Trio (typed ``aio_as_trio``)."""
    return cast(Callable[P, Awaitable[T]], trio_asyncio.aio_as_trio(function))


def aio_context(manager: AbstractAsyncContextManager[T]) -> AbstractAsyncContextManager[T]:
    """An asyncio async context manager, usable from Trio."""
    return cast(AbstractAsyncContextManager[T], trio_asyncio.aio_as_trio(manager))


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


class Connection:
    """One checked-out connection; every call runs a named query."""

    def __init__(self, raw: psycopg.AsyncConnection[Row]) -> None:
        self.raw = raw

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run a named query and return its rows, if it has any."""
        sql = named(query)
        try:
            return await aio(_fetch)(self.raw, sql, _adapt(params))
        except psycopg.Error as exc:
            raise _translated(exc) from None

    async def row(self, query: str, params: Mapping[str, Any] | None = None) -> Row | None:
        found = await self.rows(query, params)
        return found[0] if found else None

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> int:
        """Run a named statement; returns the number of rows it touched."""
        sql = named(query)
        try:
            cursor = await aio(self.raw.execute)(sql, _adapt(params))
        except psycopg.Error as exc:
            raise _translated(exc) from None
        return cursor.rowcount

    async def execute_script(self, script: str) -> None:
        """Run SQL text that is not a named query: a migration's whole file (statements
        without parameters). Only :mod:`migrations` sends such text."""
        try:
            await aio(self.raw.execute)(script)
        except psycopg.Error as exc:
            raise _translated(exc) from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        try:
            async with aio_context(self.raw.transaction()):
                yield self
        except psycopg.Error as exc:
            raise _translated(exc) from None


async def _fetch(
    raw: psycopg.AsyncConnection[Row], sql: str, params: dict[str, Any] | None
) -> list[Row]:
    """Execute and fetch on the asyncio side, so a query crosses from Trio once, not twice
    (each crossing is a round of both event loops: a fifth of a query's cost here)."""
    cursor = await raw.execute(sql, params)
    if cursor.description is None:
        return []
    return await cursor.fetchall()


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

    @classmethod
    async def open(
        cls, dsn: str, size: int, application_name: str = "registry-coordinator"
    ) -> Database:
        """Connect the whole pool now, so an unreachable database stops startup."""
        database = cls(dsn, size, application_name)
        for _ in range(size):
            database._send.send_nowait(await database._connect())
        return database

    async def _connect(self) -> Connection:
        try:
            raw = await aio(psycopg.AsyncConnection.connect)(
                self.dsn,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=10,
                application_name=self.application_name,
            )
        except psycopg.OperationalError as exc:
            raise Unavailable(_first_line(exc)) from None
        return Connection(raw)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Check out a connection; it goes back only if it is idle and healthy."""
        conn = await self._receive.receive()
        healthy = False
        try:
            if conn is None or conn.raw.closed:
                conn = await self._connect()
            yield conn
            healthy = conn.raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        finally:
            if conn is not None and not healthy:
                with trio.CancelScope(shield=True):
                    await aio(conn.raw.close)()
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
        with trio.CancelScope(shield=True):
            for _ in range(self.size):
                conn = await self._receive.receive()
                if conn is not None:
                    await aio(conn.raw.close)()


@asynccontextmanager
async def notifications(db: Database, channel: str) -> AsyncIterator[AsyncIterator[str]]:
    """A dedicated connection to ``db``'s database LISTENing on ``channel``, yielding
    notification payloads.

    A lost connection surfaces as :class:`Unavailable`, from here or from iterating.
    """
    try:
        raw = await aio(psycopg.AsyncConnection.connect)(
            db.dsn, autocommit=True, connect_timeout=10, application_name=db.application_name
        )
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    try:
        await aio(raw.execute)(f"LISTEN {channel}")
        yield _payloads(raw)
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    finally:
        with trio.CancelScope(shield=True):
            await aio(raw.close)()


async def _payloads(raw: psycopg.AsyncConnection[Any]) -> AsyncIterator[str]:
    async for note in trio_asyncio.aio_as_trio(raw.notifies()):
        yield note.payload


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
