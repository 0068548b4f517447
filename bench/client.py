"""`bench/run.py client`: what one statement costs the calling process, by database client.

The same round trip (the named query ``server_version``, the readiness probe's) on one
connection to the bench's embedded PostgreSQL 18, ``count`` times in a row, timed by the
CPU of this process (every thread: a client that hands statements to a thread pays for
both), through:

- psycopg's blocking API, called directly: the floor;
- psycopg's asyncio API under plain asyncio;
- the same from Trio through trio-asyncio: the service's client before 2026-12-01;
- the blocking API from Trio through ``trio.to_thread.run_sync`` (a cached thread per call);
- the service's own client, :class:`Database`: psycopg's connection with its waiting done
  by Trio (see store/database.py);
- the service's client again with 4 tasks on 4 connections at once, as the workers use it.

(A thread per connection fed by a queue, the service's client for a day, measured
269-311 us here, about what ``trio.to_thread`` costs.)

Rounds alternate the clients, so a noisy moment on a shared machine falls on all of them;
the figures are medians over the rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

import psycopg
import psycopg.waiting
import trio
import trio_asyncio

from registry_coordinator.store.database import Database, named

# trio_asyncio replaces asyncio's running-loop lookup so asyncio code finds the loop it
# runs inside Trio; psycopg.waiting took its own reference to the original when it was
# imported. Point it at the patched one, as the service did while it ran this path.
psycopg.waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]

QUERY = named("server_version")


def _blocking(dsn: str, count: int) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        began = time.process_time()
        for _ in range(count):
            conn.execute(QUERY).fetchall()
        return time.process_time() - began


async def _async_queries(conn: psycopg.AsyncConnection[tuple[object, ...]], count: int) -> float:
    began = time.process_time()
    for _ in range(count):
        await (await conn.execute(QUERY)).fetchall()
    return time.process_time() - began


def _asyncio(dsn: str, count: int) -> float:
    async def main() -> float:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await _async_queries(conn, count)

    return asyncio.run(main())


def _trio_asyncio(dsn: str, count: int) -> float:
    async def one(conn: psycopg.AsyncConnection[tuple[object, ...]]) -> list[tuple[object, ...]]:
        return await (await conn.execute(QUERY)).fetchall()

    async def main() -> float:
        async with trio_asyncio.open_loop():
            conn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(
                dsn, autocommit=True
            )
            began = time.process_time()
            for _ in range(count):
                await trio_asyncio.aio_as_trio(one)(conn)
            elapsed = time.process_time() - began
            await trio_asyncio.aio_as_trio(conn.close)()
            return elapsed

    return trio.run(main)


def _to_thread(dsn: str, count: int) -> float:
    async def main() -> float:
        with psycopg.connect(dsn, autocommit=True) as conn:
            began = time.process_time()
            for _ in range(count):
                await trio.to_thread.run_sync(lambda: conn.execute(QUERY).fetchall())
            return time.process_time() - began

    return trio.run(main)


def _service(dsn: str, count: int, tasks: int = 1) -> float:
    async def main() -> float:
        db = await Database(dsn, tasks).open()

        async def queries(n: int) -> None:
            for _ in range(n):
                await db.rows("server_version")

        try:
            began = time.process_time()
            async with trio.open_nursery() as nursery:
                for _ in range(tasks):
                    nursery.start_soon(queries, count // tasks)
            return time.process_time() - began
        finally:
            await db.close()

    return trio.run(main)


CLIENTS: dict[str, Callable[[str, int], float]] = {
    "psycopg blocking, direct": _blocking,
    "psycopg asyncio, plain asyncio": _asyncio,
    "psycopg asyncio via trio-asyncio (before)": _trio_asyncio,
    "psycopg blocking via trio.to_thread": _to_thread,
    "Database: psycopg, Trio's waits (now)": _service,
    "Database, 4 tasks on 4 connections": lambda dsn, count: _service(dsn, count, 4),
}


def client(dsn: str, count: int, rounds: int) -> None:
    print(
        f"client: {count} round trips on one connection (4 where it says so), CPU of this process "
        f"per statement, medians of {rounds} interleaved rounds"
    )
    spent: dict[str, list[float]] = {name: [] for name in CLIENTS}
    for _ in range(rounds):
        for name, run in CLIENTS.items():
            spent[name].append(1e6 * run(dsn, count) / count)
    floor = statistics.median(spent["psycopg blocking, direct"])
    for name, figures in spent.items():
        median = statistics.median(figures)
        print(
            f"  {name:<44} {median:7.0f} us  ({median / floor:4.1f}x the floor; rounds "
            f"{', '.join(f'{x:.0f}' for x in figures)})"
        )
