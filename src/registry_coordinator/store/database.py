"""PostgreSQL from Trio: psycopg's connection with its waiting done by Trio, and the named
queries.

Every statement the service sends is a query named in ``sql/queries.sql``, looked up
strictly: a name that is not declared raises :class:`UnknownQuery` before anything is
sent (a misspelled name must never reach PostgreSQL as if it were SQL). The exceptions,
run whole by :meth:`Connection.execute_script`, are a migration's file and the GRANTs
``migrate`` gives the runtime role (``roles``).

How psycopg runs under Trio: psycopg does its protocol work in generators that say when
they must wait for the socket, and its connection classes differ only in the function
that waits (a blocking ``select`` for :class:`psycopg.Connection`, asyncio's loop for
:class:`psycopg.AsyncConnection`). :class:`_TrioConnection` is the asyncio class with that
one method, ``wait``, done by Trio (``trio.lowlevel.wait_readable``/``wait_writable``), as
psycopg's author suggested for Trio (psycopg/psycopg2#1057). Nothing crosses into asyncio
or to another thread: measured on this machine (``bench/run.py client``) a statement costs
about a quarter of the CPU it cost through trio-asyncio, and less than on a thread per
connection or through ``trio.to_thread``. What this leans on in psycopg, beyond its public
API, is named where it is used — ``AsyncConnection.wait``, the generators' ``Wait`` and
``Ready`` values, and the lock every connection takes, an ``asyncio.Lock`` that is only
ever free here (one task uses a connection at a time, so it never needs a loop) — and
pinned: ``psycopg>=3.2,<3.4``. The
whole suite runs through it, so a psycopg that changed any of it fails there first.

Cancellation is Trio's: a task cancelled while its statement runs stops waiting at once.
The connection is then mid-statement, and it is never given to another task: the pool
closes it (PostgreSQL rolls back any transaction it had open; a statement outside one
commits whole or not at all, never half) and connects a new one in its place. Cancelled
between the statements of a transaction, the transaction is rolled back and the
connection goes back to the pool.

The pool is ours rather than psycopg_pool's: a checkout is a Trio channel receive, and a
connection that broke or was left mid-transaction is closed and replaced, never reused.
One the server closed while it sat in the pool (a restart, a crash, a failover's proxy
cutting sessions) is found so at checkout, without a round trip, and replaced before a
statement is sent on it: after an outage, no statement fails on a connection from before.
"""

from __future__ import annotations

import difflib
import logging
import re
import select
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from importlib import resources
from typing import Any, Protocol, Self, TypeVar, cast

import psycopg
import trio
from psycopg import pq
from psycopg.abc import PQGen
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg.waiting import Ready, Wait

from registry_coordinator.custody import SENDING, Purpose, Sealer, Unopenable, sealer_for
from registry_coordinator.errors import CoordinatorError, ExitCode

log = logging.getLogger(__name__)

#: A row as psycopg reads it: column name -> value, typed by the query alone (the records
#: of :mod:`records` are the typed rows the HTTP layer reads).
Row = dict[str, Any]
#: A named query's parameters, by name; psycopg adapts each value (:func:`_adapt`).
Params = Mapping[str, object]
T = TypeVar("T")


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

    async def rows(self, query: str, params: Params | None = None) -> list[Row]: ...

    async def row(self, query: str, params: Params | None = None) -> Row | None: ...

    async def execute(self, query: str, params: Params | None = None) -> int: ...


class Unavailable(CoordinatorError):
    """The database cannot be reached (exit code 3)."""

    exit_code = ExitCode.UNAVAILABLE
    summary = "database unavailable"


class ConnectionRefused(CoordinatorError):
    """The database answered and refused the connection for what it was asked (exit code
    1): no such database or role, a wrong password, no ``pg_hba.conf`` entry, a server
    certificate that does not verify. Starting again cannot cure it, so it is not
    :class:`Unavailable`, which a supervisor such as systemd restarts."""

    summary = "database refused the connection"


#: What libpq says, in its connection error's text, of a connection refused for what it
#: asked (a connection error carries no SQLSTATE). A closed list: anything else is an
#: outage. The server's part is in its ``lc_messages``, which these assume is English.
REFUSALS: tuple[str, ...] = (
    "does not exist",  # FATAL: database "x" does not exist, role "x" does not exist
    "password authentication failed",
    "no pg_hba.conf entry",
    "is not permitted to log in",
    "permission denied for database",
    "invalid port number",
    "invalid integer value",
    "invalid connection option",
    "invalid sslmode value",
    "certificate verify failed",
    "does not match host name",
    "server does not support SSL",
    "root certificate file",  # sslmode verify-* without the CA file
)


def _connect_error(exc: psycopg.OperationalError) -> CoordinatorError:
    """A connection error as the command reports it: refused, or unavailable now."""
    text = str(exc)
    if any(refusal in text for refusal in REFUSALS):
        return ConnectionRefused(_first_line(exc))
    return Unavailable(_first_line(exc))


class StatementFailed(CoordinatorError):
    """The database refused a statement for what it holds, not for an outage (data it
    cannot store, a broken constraint): a defect, which repeating will not cure."""


def _translated(exc: psycopg.Error) -> Exception:
    """An outage (the connection, the server, a conflict that may pass) is Unavailable;
    anything else the database refuses is StatementFailed."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return Unavailable(_first_line(exc))
    return StatementFailed(_first_line(exc))


async def _waited(gen: PQGen[T], fileno: int) -> T:
    """Run one of psycopg's generators to its end, waiting with Trio as it asks.

    ``Wait.RW`` (a send that could not flush at once) waits for the socket to be writable:
    the server reads a whole statement before it answers, so it is never waiting on us to
    read while we wait to write.
    """
    try:
        state = next(gen)
        while True:
            if state == Wait.R:
                await trio.lowlevel.wait_readable(fileno)
                state = gen.send(Ready.R)
            else:
                await trio.lowlevel.wait_writable(fileno)
                state = gen.send(Ready.W)
    except StopIteration as ended:
        return cast(T, ended.value)


class _TrioConnection(psycopg.AsyncConnection[Row]):
    """psycopg's asyncio connection, its waiting done by Trio (see the module's docstring)."""

    async def wait(self, gen: PQGen[T], interval: float = 0.1, timeout: float | None = None) -> T:
        # psycopg asks for a timeout only of notifies(timeout=...) and of connecting, and
        # neither is used here: a timeout is Trio's, by cancellation.
        if timeout is not None:
            raise TypeError("a psycopg timeout is not supported under Trio: cancel instead")
        return await _waited(gen, self.pgconn.socket)

    @classmethod
    async def open(
        cls, dsn: str, application_name: str, *, prepare: bool = True
    ) -> _TrioConnection:
        """Connect: libpq's blocking connect, on a thread (it resolves host names, which
        would stop Trio's loop), then a connection in nonblocking mode, as psycopg makes
        every connection. Without ``prepare``, psycopg never prepares a statement on the
        server (it does after a query's fifth run): a pooler in transaction mode hands the
        next transaction another session, where the name is unknown or already taken."""
        conninfo = make_conninfo(dsn, connect_timeout=10, application_name=application_name)
        pgconn = await trio.to_thread.run_sync(
            pq.PGconn.connect, conninfo.encode(), abandon_on_cancel=True
        )
        if pgconn.status != pq.ConnStatus.OK:
            why = pgconn.error_message.decode(errors="replace")
            pgconn.finish()
            raise psycopg.OperationalError(f"connection failed: {why}")
        pgconn.nonblocking = 1
        conn = cls(pgconn, row_factory=dict_row)
        if not prepare:
            conn.prepare_threshold = None
        await conn.set_autocommit(True)
        return conn

    def close_now(self) -> None:
        """Close the socket, telling Trio first (no task waits on it: none may use it)."""
        if not self.closed:
            with suppress(psycopg.OperationalError):  # its socket is already gone
                trio.lowlevel.notify_closing(self.pgconn.socket)
        self.pgconn.finish()

    @property
    def idle(self) -> bool:
        """Open, with no statement or transaction under way: fit to be given out again."""
        return not self.closed and self.info.transaction_status == pq.TransactionStatus.IDLE

    @property
    def hung_up(self) -> bool:
        """Whether the server spoke while the connection sat idle. A pooled connection
        listens for nothing, so that is the server ending the session (its last message
        and the end of the stream are what there is to read): its next statement would
        fail. Rarely it is a notice, and a sound connection is replaced for nothing."""
        poller = select.poll()
        poller.register(self.pgconn.socket, select.POLLIN)
        return bool(poller.poll(0))


class Connection:
    """One checked-out connection; every call runs a named query.

    With a :class:`~registry_coordinator.custody.Sealer` (its database's, given at each
    checkout), a run's sealed columns come back opened: a row with ``input``,
    ``outputs`` or ``output`` must say by ``data_key`` whether its run's are sealed, so
    that no query can hand a sealed value on as if it were the value."""

    def __init__(self, raw: _TrioConnection) -> None:
        self.raw = raw
        self.sealer: Sealer | None = None

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        """Run a named query and return its rows, if it has any."""
        sql = named(query)
        try:
            cursor = await self.raw.execute(sql, _adapt(params))
            rows = [] if cursor.description is None else await cursor.fetchall()
        except psycopg.Error as exc:
            raise _translated(exc) from None
        if rows and self.sealer is not None and "data_key" in rows[0]:
            await self._learn({row["data_key"] for row in rows} - self.sealer.keys.keys())
        if rows and not SEALED_COLUMNS.isdisjoint(rows[0]):
            return open_rows(query, rows, self.sealer)
        return rows

    async def _learn(self, ids: set[int | None]) -> None:
        """The data keys rows name that the sealer does not hold yet, unwrapped and held:
        a subject's key is first met in the row of one of its runs. One that does not
        unwrap is left out, and what it sealed is refused as under a key not held."""
        wanted = sorted(key for key in ids if key is not None)
        if not wanted:
            return
        assert self.sealer is not None
        for row in await self.rows("data_keys_by_id", {"ids": wanted}):
            try:
                self.sealer.learn(row["id"], row["kek"], row["wrapped"])
            except Unopenable as exc:
                log.warning("data key %s does not unwrap: %s", row["id"], exc)

    async def row(self, query: str, params: Params | None = None) -> Row | None:
        found = await self.rows(query, params)
        return found[0] if found else None

    async def execute(self, query: str, params: Params | None = None) -> int:
        """Run a named statement; returns the number of rows it touched."""
        sql = named(query)
        try:
            return (await self.raw.execute(sql, _adapt(params))).rowcount
        except psycopg.Error as exc:
            raise _translated(exc) from None

    async def execute_script(self, script: str) -> None:
        """Run SQL text that is not a named query: a migration's whole file (statements
        without parameters), or the GRANTs to a role, whose name is an identifier no
        parameter can carry. Only :mod:`migrations` and :mod:`roles` send such text."""
        await self._statement(script.encode())

    async def _statement(self, sql: bytes) -> None:
        try:
            await self.raw.execute(sql)
        except psycopg.Error as exc:
            raise _translated(exc) from None

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        """A transaction around the block: committed if the block ends normally, rolled
        back if it raises — cancelled too, if between statements; cancelled mid-statement,
        the connection is left to the pool to close, and PostgreSQL rolls back."""
        await self._statement(b"BEGIN")
        try:
            yield self
        except BaseException:
            if self.raw.info.transaction_status != pq.TransactionStatus.ACTIVE:
                # Broken meanwhile, the connection is closed by the pool: PostgreSQL rolls back.
                with trio.CancelScope(shield=True), suppress(CoordinatorError):
                    await self._statement(b"ROLLBACK")
            raise
        await self._statement(b"COMMIT")


#: A run's columns that hold its personal data, sealed when its ``data_key`` is set: its
#: own, and its sendings' (:data:`~registry_coordinator.custody.SENDING`).
SEALED_COLUMNS = frozenset({"input", "outputs", "output", *SENDING})


class RowsUnopenable(Unopenable):
    """Rows of a query of which some do not open: the first refusal, as any reader of one
    run sees it, and for a caller that can set the others aside (a claim, the timer's
    batch), each row that did not open, as stored, with its refusal, and the rows that
    did, opened."""

    def __init__(self, opened: list[Row], refused: list[tuple[Row, Unopenable]]) -> None:
        first = refused[0][1]
        super().__init__(first.code, first.message)
        self.opened = opened
        self.refused = refused


def open_rows(query: str, rows: list[Row], sealer: Sealer | None) -> list[Row]:
    """Every row of ``query`` opened (:func:`open_row`); :class:`RowsUnopenable` if some
    do not, only once every row was tried."""
    opened: list[Row] = []
    refused: list[tuple[Row, Unopenable]] = []
    for row in rows:
        try:
            opened.append(open_row(query, row, sealer))
        except Unopenable as exc:
            refused.append((row, exc))
    if refused:
        raise RowsUnopenable(opened, refused)
    return opened


def open_row(query: str, row: Row, sealer: Sealer | None) -> Row:
    """``row`` (of the named ``query``) with its run's sealed columns opened (as it is,
    for a run not sealed; null, for a run whose subject was erased). A row with a
    sending's columns names its call's ``step``."""
    assert "data_key" in row, f"{query} reads a run's sealed columns without runs.data_key"
    if row["data_key"] is None:
        return row
    run, opened = row["id"], dict(row)
    sealer = sealer_for(sealer, run)
    if sealer.erased(row["data_key"]):
        return _erased(opened)
    if opened.get("input") is not None:
        opened["input"] = sealer.open(run, Purpose.INPUT, "", opened["input"])
    if opened.get("outputs") is not None:
        outputs = opened["outputs"].items()
        opened["outputs"] = {k: sealer.open(run, Purpose.OUTPUT, k, v) for k, v in outputs}
    if opened.get("output") is not None:
        opened["output"] = sealer.open(run, Purpose.OUTPUT, "", opened["output"])
    for column in SENDING.keys() & opened.keys():
        if opened[column] is not None:
            opened[column] = sealer.open_sending(run, row["step"], column, opened[column])
    return opened


def _erased(row: Row) -> Row:
    """A run's row whose subject was erased: its sealed columns null (its steps' outputs
    by step), which is all that is left of them."""
    for column in SEALED_COLUMNS & row.keys():
        if column == "outputs" and row[column] is not None:
            row[column] = dict.fromkeys(row[column])
        else:
            row[column] = None
    return row


def _adapt(params: Params | None) -> dict[str, object] | None:
    """Dicts are sent as jsonb (lists stay arrays); everything else as psycopg adapts it."""
    if params is None:
        return None
    return {k: Jsonb(v) if isinstance(v, dict) else v for k, v in params.items()}


class Database:
    """A fixed-size pool of autocommit connections to one PostgreSQL database.

    Behind a pooler in transaction mode (``pooler="transaction"``) nothing is prepared on
    the server, and LISTEN connects to ``listen_dsn``, a session of its own."""

    def __init__(
        self,
        dsn: str,
        size: int,
        application_name: str = "registry-coordinator",
        *,
        pooler: str = "none",
        listen_dsn: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.size = size
        self.application_name = application_name  # on every session, in pg_stat_activity
        self.pooler = pooler
        self.listen_dsn = listen_dsn or dsn
        #: What seals and opens runs' personal data here (None: nothing is sealed).
        self.sealer: Sealer | None = None
        self._send, self._receive = trio.open_memory_channel[Connection | None](size)

    async def open(self) -> Self:
        """Connect the whole pool now, so an unreachable database stops startup, and one
        that refuses the connection stops it as refused (:class:`ConnectionRefused`)."""
        connected: list[Connection] = []
        try:
            for _ in range(self.size):
                connected.append(await self._connect(starting=True))
        except BaseException:
            for conn in connected:
                conn.raw.close_now()
            raise
        for conn in connected:
            self._send.send_nowait(conn)
        return self

    async def _connect(self, *, starting: bool = False) -> Connection:
        """A new connection. Replacing one of a running pool, every failure is an outage
        (:class:`Unavailable`), which the engine waits out: a role's password rotated, or
        a database restored under its name, must not stop the service."""
        try:
            return Connection(await self.session(self.dsn))
        except psycopg.OperationalError as exc:
            raise (_connect_error(exc) if starting else Unavailable(_first_line(exc))) from None

    async def session(self, dsn: str) -> _TrioConnection:
        """A connection of this database's kind to ``dsn``, outside the pool."""
        prepare = self.pooler != "transaction"
        return await _TrioConnection.open(dsn, self.application_name, prepare=prepare)

    async def outside(self, dsn: str) -> Connection:
        """A connection of this database's kind to ``dsn``, outside the pool, for a probe:
        refused (:class:`ConnectionRefused`) or unavailable as a start's connections are."""
        try:
            return Connection(await self.session(dsn))
        except psycopg.OperationalError as exc:
            raise _connect_error(exc) from None

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """Check out a connection, replaced first if it broke or the server closed it; it
        goes back only if it is idle and healthy."""
        conn = await self._receive.receive()
        try:
            if conn is None or not conn.raw.idle or conn.raw.hung_up:
                if conn is not None:
                    conn.raw.close_now()
                conn = None
                conn = await self._connect()
            conn.sealer = self.sealer
            yield conn
        finally:
            if conn is not None and not conn.raw.idle:
                conn.raw.close_now()
                conn = None
            self._send.send_nowait(conn)

    async def rows(self, query: str, params: Params | None = None) -> list[Row]:
        async with self.connection() as conn:
            return await conn.rows(query, params)

    async def row(self, query: str, params: Params | None = None) -> Row | None:
        async with self.connection() as conn:
            return await conn.row(query, params)

    async def execute(self, query: str, params: Params | None = None) -> int:
        async with self.connection() as conn:
            return await conn.execute(query, params)

    async def close(self) -> None:
        """Close every connection, as each is given back."""
        with trio.CancelScope(shield=True):
            for _ in range(self.size):
                conn = await self._receive.receive()
                if conn is not None:
                    conn.raw.close_now()


@asynccontextmanager
async def notifications(db: Database, channel: str) -> AsyncIterator[AsyncIterator[str]]:
    """A dedicated connection to ``db``'s database LISTENing on ``channel`` (at its
    ``listen_dsn``, which a pooler in transaction mode cannot be), yielding notification
    payloads.

    A lost connection surfaces as :class:`Unavailable`, from here or from iterating.
    """
    try:
        raw = await db.session(db.listen_dsn)
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    try:
        await raw.execute(f"LISTEN {channel}".encode())
        yield _payloads(raw)
    except psycopg.OperationalError as exc:
        raise Unavailable(_first_line(exc)) from None
    finally:
        raw.close_now()


async def _payloads(raw: _TrioConnection) -> AsyncIterator[str]:
    async for note in raw.notifies():
        yield note.payload


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
