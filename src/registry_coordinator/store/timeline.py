"""The database's timeline: how far it has come, and the restores it was recognised in.

A backup restored puts every run back where the backup found it, and forgets what runs
did since, requests sent included. The ``timeline`` row's epoch grows before requests
leave (``engine.high_water`` copies it to a file outside the database first), so a
database whose epoch is behind that copy is recognised as restored. Recognising one holds,
in one transaction under the timeline's lock, every run it may have forgotten the
progress of and records the restore; the recovery stays open until an operator ends it.
These are the statements; what they mean to a service is decided above.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Self

from registry_coordinator.store.database import Connection, Database, Queries, Row


@dataclass(frozen=True)
class Timeline:
    """Which database this is, across dumps and restores, and how far it has come."""

    installation: uuid.UUID
    epoch: int

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(row["installation"], row["epoch"])


@dataclass(frozen=True)
class Restore:
    """A restored database as it was recognised, and the runs still held for its review."""

    number: int
    detected_at: datetime
    database_epoch: int  # where the database's timeline stood
    mark_epoch: int  # where the mark outside it stood
    newest_change: datetime | None  # the newest transition it still had: about the backup's
    held: int  # runs held for review when it was recognised
    still_held: int

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            row["number"],
            row["detected_at"],
            row["database_epoch"],
            row["mark_epoch"],
            row["newest_change"],
            row["held"],
            row["still_held"],
        )


async def timeline(db: Queries) -> Timeline:
    row = await db.row("timeline")
    assert row is not None  # the migration inserts the one row
    return Timeline.from_row(row)


async def advance(db: Database) -> Timeline:
    """Move the timeline on: committed before the requests sealed until now are sent."""
    row = await db.row("advance_timeline")
    assert row is not None
    return Timeline.from_row(row)


async def open_restore(db: Queries) -> Restore | None:
    """The recovery still open, if there is one."""
    row = await db.row("open_restore")
    return None if row is None else Restore.from_row(row)


async def end_restore(db: Database, actor: str, reason: str) -> int | None:
    """End the open recovery (its number), or None if none was open."""
    row = await db.row("end_restore", {"actor": actor, "reason": reason})
    return None if row is None else int(row["number"])


@dataclass(frozen=True)
class Judged:
    """The timeline locked in an open transaction, for a mark to be held against it."""

    conn: Connection
    timeline: Timeline

    async def restored(self, mark: int, actor: str, detail: str) -> Restore:
        """Record the database as restored behind ``mark``: hold, with ``detail``, every run
        it may have forgotten the progress of, and bring the timeline up to the mark."""
        newest = await self.conn.row("newest_change")
        held = await self.conn.row("hold_restored", {"actor": actor, "detail": detail})
        assert newest is not None and held is not None
        params = {"mark": mark, "held": held["held"], "newest": newest["at"]}
        row = await self.conn.row("record_restore", params)
        assert row is not None
        return Restore.from_row(row)


@asynccontextmanager
async def judged(db: Database) -> AsyncIterator[Judged]:
    """The timeline, locked until the block ends: what is written in it commits together."""
    async with db.connection() as conn, conn.transaction():
        row = await conn.row("lock_timeline")
        assert row is not None
        yield Judged(conn, Timeline.from_row(row))
