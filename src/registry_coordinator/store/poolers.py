"""Connection poolers: whether ``database.dsn`` keeps a PostgreSQL session per connection,
found out at startup rather than assumed, and held against what the file declares.

A pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) hands each
transaction whichever server session is free. The service then keeps nothing in a session
beyond a transaction: nothing prepared on the server (``Database`` with ``pooler =
"transaction"``), no session lock (the archiver's lock lasts its transaction), and LISTEN
on ``database.sessionDsn``, since a listening session handed to another client hears
nothing for this one. Undeclared, such a pooler shows as a log full of ``prepared
statement "_pg3_0" already exists`` and wake-ups lost, so it is refused in one line.

The probe: connection A asks which session it runs in, then B, then A again, each in a
statement of its own (nothing is held, so a pool of one server session answers too).
Directly, or through a pool in session mode, each connection has one session of its own:
B's differs from A's, and A's stays. Through a pool in transaction mode, B is given the
session A just let go (PgBouncer reuses the most recent one), or, handing sessions round in
turn, A is given another: either shows it. Nothing is written.
"""

from __future__ import annotations

from registry_coordinator.config import DatabaseConfig
from registry_coordinator.errors import CoordinatorError
from registry_coordinator.store.database import (
    Connection,
    ConnectionRefused,
    Database,
    Unavailable,
)

REPAIR = (
    "set database.pooler: transaction, and database.sessionDsn to PostgreSQL directly or to "
    "a session-mode pool (docs/operations.md, 'Connection poolers')"
)


class PoolerRefused(CoordinatorError):
    """A pooler in transaction mode where the file does not say so, or under the session
    DSN (exit code 1: the file must change)."""

    summary = "database pooler refused"

    def __init__(self, what: str, repair: str) -> None:
        super().__init__(f"{what}: {repair}")
        self.what = what
        self.repair = repair


async def transaction_pooled(db: Database, dsn: str) -> bool:
    """Whether ``dsn``'s connections change PostgreSQL sessions between transactions."""
    first = await db.outside(dsn)
    try:
        second = await db.outside(dsn)
        try:
            before, other, after = await _pid(first), await _pid(second), await _pid(first)
        finally:
            second.raw.close_now()
    finally:
        first.raw.close_now()
    return after != before or other in (before, after)


async def _pid(conn: Connection) -> int:
    row = await conn.row("backend_pid")
    assert row is not None
    return int(row["pid"])


async def _session_pooled(db: Database, dsn: str) -> bool:
    try:
        return await transaction_pooled(db, dsn)
    except (ConnectionRefused, Unavailable) as exc:  # said of the field it comes from
        raise type(exc)(f"database.sessionDsn: {exc}") from None


async def judge(db: Database, database: DatabaseConfig) -> str:
    """What stands between the service and PostgreSQL, said in a line; :class:`PoolerRefused`
    if it is not what ``database`` declares, or if LISTEN's session would not be its own."""
    if database.dsn is None:
        return "the embedded database, a session per connection"
    pooled = await transaction_pooled(db, database.dsn)
    if pooled and database.pooler != "transaction":
        raise PoolerRefused(
            "database.dsn leads through a connection pooler in transaction mode (one "
            "connection's transactions ran in different PostgreSQL sessions)",
            REPAIR,
        )
    if database.session_dsn is not None and await _session_pooled(db, database.session_dsn):
        raise PoolerRefused(
            "database.sessionDsn leads through a pooler in transaction mode, where LISTEN "
            "hears nothing",
            "point it at PostgreSQL directly or at a session-mode pool",
        )
    if database.pooler == "transaction":
        return (
            "database.pooler: transaction (nothing is prepared on the server; LISTEN "
            "connects to database.sessionDsn, a session of its own)"
        )
    return "database.pooler: none (database.dsn keeps a PostgreSQL session per connection)"
