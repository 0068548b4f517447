"""`bench/run.py client`: what one statement costs the calling process, by database client.

The same round trip (the named query ``server_version``, the readiness probe's) on one
connection to the bench's embedded PostgreSQL 18, ``count`` times in a row, timed by the
CPU of this process (every thread: a client that hands statements to a thread pays for
both), through:

- psycopg's blocking API, called directly: the floor;
- psycopg's asyncio API under plain asyncio;
- the same from Trio through trio-asyncio: the service's client before 2026-12-01;
- the blocking API from Trio through ``trio.to_thread.run_sync`` (a cached thread per call);
- the service's own client, :class:`Database` (a thread per connection, fed by a queue);
- the service's client again with 4 tasks on 4 connections at once, as the workers use it;
- a candidate, not in the service: psycopg's asyncio API with its waits done by Trio itself
  (``AsyncConnection.wait`` overridden to drive psycopg's generators with
  ``trio.lowlevel.wait_readable``/``wait_writable``; it leans on psycopg's internals, so it
  is measured here before anything relies on it).

Rounds alternate the clients, so a noisy moment on a shared machine falls on all of them;
the figures are medians over the rounds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import trio
import trio_asyncio
from psycopg import generators
from psycopg.abc import PQGen
from psycopg.conninfo import make_conninfo
from psycopg.waiting import Ready, Wait

from registry_coordinator.engine.database import Database, named

QUERY = named("server_version")
T = TypeVar("T")


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


async def _trio_waits(gen: PQGen[T], fileno: int) -> T:
    """Run a psycopg generator to its end, waiting on ``fileno`` as it asks, with Trio."""
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
        return ended.value  # type: ignore[no-any-return]


class _TrioConnection(psycopg.AsyncConnection[tuple[object, ...]]):
    async def wait(self, gen: PQGen[T], interval: float = 0.1, timeout: float | None = None) -> T:
        return await _trio_waits(gen, self.pgconn.socket)


def _trio_native(dsn: str, count: int) -> float:
    async def main() -> float:
        connecting = generators.connect(make_conninfo(dsn))
        try:
            fileno, state = next(connecting)
            while True:  # the socket may change while connecting: the generator says which
                if state == Wait.R:
                    await trio.lowlevel.wait_readable(fileno)
                    fileno, state = connecting.send(Ready.R)
                else:
                    await trio.lowlevel.wait_writable(fileno)
                    fileno, state = connecting.send(Ready.W)
        except StopIteration as connected:
            conn = _TrioConnection(connected.value)
        await conn.set_autocommit(True)
        try:
            return await _async_queries(conn, count)
        finally:
            await conn.close()

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
        db = await Database.open(dsn, tasks)

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
    "Database: a thread per connection (now)": _service,
    "Database, 4 tasks on 4 connections": lambda dsn, count: _service(dsn, count, 4),
    "candidate: psycopg asyncio API, Trio's waits": _trio_native,
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
