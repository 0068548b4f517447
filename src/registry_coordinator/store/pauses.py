"""Connections paused for their product's maintenance (schema 23).

An operator pauses a connection with a reason; while it is paused no call is sent over
it. A run that comes to one of its call steps is *parked* (:func:`park`): given back
unsent, due at its deadline (so it still expires), and nothing is held. Resuming makes
every parked run due at once. Each process keeps the paused connections in memory
(:func:`paused`), read again whenever a change is notified on the wake channel and when
its listener reconnects; a call that process sealed before it heard is sent.

A park and a resume cannot pass each other: the park shares the pause's row in the
statement that parks, and the resume deletes that row before it looks for parked runs,
in a later statement of its transaction, so it waits for a park in progress and finds
its run. Reasons are sealed under the shared key, as admission's are.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from psycopg.types.json import Jsonb

from registry_coordinator.store.database import Database
from registry_coordinator.store.keys import SharedPlace

#: What tells every process that a connection was paused or resumed.
NOTICE = "connections"
_PLACE = SharedPlace("connection-pause", "pause.reason", "a pause's reason")


@dataclass(frozen=True)
class Pause:
    """A connection paused: since when, by whom, and why."""

    connection: str
    since: datetime
    actor: str
    reason: str


@dataclass(frozen=True)
class Resumed:
    """A pause lifted: whether there was one (and since when), and how many runs it let go."""

    was_paused: bool
    since: datetime | None
    runs: int


async def pause(db: Database, connection: str, actor: str, reason: str) -> Pause:
    """Pause ``connection`` for ``actor``, with ``reason`` (again, if it is paused)."""
    sealed, key = _PLACE.seal(db.sealer, reason)
    stored = Jsonb(sealed)
    params = {"connection": connection, "actor": actor, "reason": stored, "data_key": key}
    row = await db.row("pause_connection", params)
    assert row is not None
    return Pause(connection, row["paused_at"], actor, reason)


async def resume(db: Database, connection: str, actor: str, reason: str) -> Resumed:
    """Lift ``connection``'s pause for ``actor``, with ``reason``, and make the runs it
    parked due at once; a connection not paused is said so, nothing changed."""
    sealed, key = _PLACE.seal(db.sealer, reason)
    stored = Jsonb(sealed)
    params = {"connection": connection, "actor": actor, "reason": stored, "data_key": key}
    async with db.connection() as conn, conn.transaction():
        gone = await conn.row("unpause_connection", params)
        if gone is None:
            return Resumed(False, None, 0)
        woke = await conn.execute("resume_parked_runs", {"connection": connection})
    return Resumed(True, gone["paused_at"], woke)


async def paused(db: Database) -> list[Pause]:
    """The connections paused now, with who paused each, when and why."""
    rows = await db.rows("connection_pauses")
    return [
        Pause(
            r["connection"],
            r["paused_at"],
            r["actor"],
            str(_PLACE.open(db.sealer, r["reason"], r["reason_key"])),
        )
        for r in rows
    ]


async def park(db: Database, run_id: object, token: object, connection: str) -> bool:
    """Give the claimed run back parked for ``connection``'s pause; False, changing
    nothing, if the pause was lifted meanwhile (the run goes on) or the claim is gone."""
    params = {"id": run_id, "token": token, "connection": connection}
    return await db.row("park_run", params) is not None
