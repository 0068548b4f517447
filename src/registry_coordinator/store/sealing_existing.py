"""Runs written before custody, sealed after: ``coordinator keys seal``.

A database that ran before custody was configured holds its runs' values in clear (their
``data_key`` is NULL). Each ended one is sealed under the installation's shared key in one
transaction of its own — its input, outputs, output and every sending's URL, headers,
body and answers — locked against every other writer and only if it is still in clear,
so a kill at any point leaves each run whole, sealed or not, and running again goes on
where it stopped. A live run is left to end first: the engine holding it writes its
values as its row said when it claimed it.

The run's history stays as written, its personal fields in clear: the chain and the
checkpoints that signed it cover those bytes, and sealing them would make another
history. ``runs.sealed_from`` says which of its events are sealed (none: it is past the
end), so reads open only those.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg.types.json import Jsonb

from registry_coordinator.custody import SENDING, Purpose, Sealer
from registry_coordinator.store.database import Connection, Database, Row
from registry_coordinator.store.faults import crash_point
from registry_coordinator.store.statements import sealed_outputs


@dataclass(frozen=True)
class SealedExisting:
    """What a pass sealed: runs, and how many in clear are still live (sealed once ended)."""

    runs: int
    sendings: int
    live: int


async def seal_existing(db: Database, progress: Callable[[int, int], None]) -> SealedExisting:
    """Every ended run of ``db`` written in clear, sealed under the shared key, a page at a
    time; ``progress`` is told (done, of) after each run."""
    sealer = db.sealer
    assert sealer is not None, "keys seal opens the database with its custody keys"
    counted = await db.row("clear_runs_counted")
    assert counted is not None
    runs, sendings, after = 0, 0, "00000000-0000-0000-0000-000000000000"
    while True:
        page = await db.rows("clear_ended_runs", {"after": after})
        if not page:
            break
        for row in page:
            async with db.connection() as conn, conn.transaction():
                sealed = await _seal_run(conn, sealer, row["id"])
            if sealed is not None:
                runs, sendings = runs + 1, sendings + sealed
            progress(runs, counted["ended"])
        after = page[-1]["id"]
    left = await db.row("clear_runs_counted")
    assert left is not None
    return SealedExisting(runs, sendings, left["live"])


async def _seal_run(conn: Connection, sealer: Sealer, run_id: object) -> int | None:
    """Run ``run_id`` sealed in the caller's transaction: how many sendings it had, or None
    if it was sealed (or removed) meanwhile."""
    run = await conn.row("lock_clear_run", {"id": run_id})
    if run is None:
        return None
    key, id_ = sealer.key.id, run["id"]
    output = run["output"]
    await conn.execute(
        "seal_clear_run",
        {
            "id": id_,
            "data_key": key,
            "input": Jsonb(sealer.seal(id_, Purpose.INPUT, "", run["input"])),
            "outputs": Jsonb(sealed_outputs(sealer, id_, key, run["outputs"])),
            "output": None
            if output is None
            else Jsonb(sealer.seal(id_, Purpose.OUTPUT, "", output)),
        },
    )
    crash_point("mid-sealing")  # the run sealed, its sendings not: a kill rolls back both
    sending_rows = await conn.rows("clear_sendings", {"id": id_})
    for sending in sending_rows:
        await conn.execute("seal_clear_sending", _sealed_sending(sealer, sending))
    return len(sending_rows)


def _sealed_sending(sealer: Sealer, row: Row) -> dict[str, object]:
    """A sending's columns as a sealed run's row holds them (NULL stays NULL)."""
    sealed: dict[str, object] = {"id": row["id"], "step": row["step"], "attempt": row["attempt"]}
    for column, (_, _, raw) in SENDING.items():
        value = row[column]
        if value is not None:
            value = sealer.seal_sending(
                row["id"], row["step"], column, bytes(value) if raw else value
            )
        sealed[column] = Jsonb(value) if column == "headers" and value is not None else value
    return sealed
