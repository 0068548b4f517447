"""Call pools: one bounded pool per configured connection, and the life of one call.

Each connection has its own Trio capacity limiter and its own httpx client, so a
slow product fills only its own pool. A call goes through three steps, and the
order is what makes it safe to crash anywhere:

1. with a pool slot, the request is sealed and marked dispatched in PostgreSQL;
2. it is sent;
3. the outcome is recorded in the same transaction that moves the run on.

A crash between 1 and 3 leaves a dispatched call without an outcome, which the
next holder of the run treats as unknown: a read is sent again, a mutation is
held for an operator. Nothing is ever resent on a guess.
"""

from __future__ import annotations

import email.utils
import logging
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import trio

from . import __version__, logs, store
from .authoring import Call, WaitFor
from .config import ConnectionConfig
from .database import Database, Unavailable
from .definition import Definition
from .identity import Credentials, IdentityRefused, IdentityUnavailable, credentials
from .metrics import Metrics
from .steps import (
    Fetch,
    Reply,
    ReplyKind,
    Request,
    Retry,
    build_request,
    fetched,
    settle,
)
from .timers import Timer

log = logging.getLogger(__name__)

#: Runs queued for one connection beyond its pool size, before workers leave them for later.
QUEUE_FACTOR = 16
#: Error bodies kept on an execution row; the rest of a refusal is not needed to explain it.
KEPT_ERROR_BODY = 2048


class Product:
    """One configured connection at run time: capacity limit, HTTP client, identity."""

    def __init__(self, config: ConnectionConfig, token_client: httpx.AsyncClient) -> None:
        self.config = config
        self.limiter = trio.CapacityLimiter(config.pool_size)
        self.queued = 0
        request = config.request_timeout.total_seconds()
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=config.connect_timeout.total_seconds(),
                read=request,
                write=request,
                pool=None,
            ),
            limits=httpx.Limits(
                max_connections=config.pool_size,
                max_keepalive_connections=config.pool_size,
                # Shorter than servers' usual keep-alive, so a pooled connection is not
                # reused just as the server closes it (an ambiguous failure for a mutation).
                keepalive_expiry=2.0,
            ),
            follow_redirects=False,
            headers={
                "User-Agent": f"registry-coordinator/{__version__}",
                "Accept": "application/json",
            },
        )
        self.credentials: Credentials = credentials(config.identity, token_client)

    def url(self, target: str) -> str:
        return self.config.base_url + target

    @property
    def saturated(self) -> bool:
        return self.queued >= self.config.pool_size * QUEUE_FACTOR

    async def send(self, request: Request, url: str) -> Reply:
        """Send one request; transport trouble becomes a Reply, never an exception.

        The caller holds a slot of :attr:`limiter`.
        """
        try:
            authorization = await self.credentials.authorization()
        except IdentityUnavailable as exc:
            return Reply(ReplyKind.NOT_SENT, detail=str(exc))
        except IdentityRefused as exc:
            return Reply(ReplyKind.RESPONSE, 401, str(exc).encode(), detail=str(exc))
        headers = {"Authorization": authorization}
        if request.idempotency_key is not None:
            headers["Idempotency-Key"] = request.idempotency_key
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        try:
            async with self.client.stream(
                request.method, url, content=request.body, headers=headers
            ) as response:
                body = await self._read(response)
                retry_after = _retry_after(response.headers.get("Retry-After"))
                return Reply(ReplyKind.RESPONSE, response.status_code, body, retry_after)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return Reply(ReplyKind.NOT_SENT, detail=f"{type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            return Reply(ReplyKind.LOST, detail=f"{type(exc).__name__}: {exc}")

    async def _read(self, response: httpx.Response) -> bytes:
        limit = self.config.response_limit
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                # Refused, not truncated: a cut JSON body is no answer. An empty body
                # fails the response schema, so this is an invalid response.
                return b""
            chunks.append(chunk)
        return b"".join(chunks)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.client.aclose()


def _result_class(reply: Reply) -> str:
    """A call's result as a metric label: 2xx, 4xx, 5xx, not-sent or lost."""
    if reply.kind is not ReplyKind.RESPONSE or reply.status is None:
        return reply.kind.value
    return f"{reply.status // 100}xx"


def _retry_after(value: str | None) -> timedelta | None:
    if not value:
        return None
    if value.strip().isdigit():
        return timedelta(seconds=min(int(value), 86_400))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(timedelta(0), when.astimezone(UTC) - datetime.now(UTC))


@dataclass
class Calls:
    """The nursery every call runs in, and the products calls go to."""

    db: Database
    products: dict[str, Product]
    timer: Timer
    lease: timedelta
    metrics: Metrics
    holdings: store.Holdings

    def __post_init__(self) -> None:
        # How a run goes on after its call or read completes its step, still held: the
        # engine sets this to its own step loop, so the run does not wait to be claimed.
        self.proceed: (
            Callable[[Definition, store.Claimed, store.Ahead | None], Awaitable[None]] | None
        ) = None
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        self._in_flight = 0
        self._idle = trio.Event()
        self._idle.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def product(self, definition: Definition, step_id: str) -> Product:
        step = definition.step(step_id)
        assert isinstance(step, Call)
        return self.products[step.connection]

    def poll(self, definition: Definition, step_id: str) -> timedelta | None:
        """How often a run waiting at ``step_id`` reads its result without a delivery."""
        step = definition.step(step_id)
        if not isinstance(step, WaitFor):
            return None
        return self.products[step.connection].config.result_poll

    def submit(self, definition: Definition, run: store.Claimed, request: Request) -> None:
        """Hand a claimed run at a call step to its connection's pool; returns at once."""
        self._spawn(self._call(definition, run, request), run.token)

    def fetch(self, definition: Definition, run: store.Claimed, fetch: Fetch) -> None:
        """Hand a claimed waiting run to its connection's pool to read its result."""
        self._spawn(self._fetch(definition, run, fetch), run.token)

    def _spawn(self, job: Coroutine[Any, Any, None], token: uuid.UUID) -> None:
        assert self._nursery is not None
        self._in_flight += 1
        self._idle = trio.Event() if self._in_flight == 1 else self._idle
        self.holdings.take(token)  # before the hand-off, so the lease is never left unkept
        self._nursery.start_soon(self._tracked, job, token)

    async def _tracked(self, job: Coroutine[Any, Any, None], token: uuid.UUID) -> None:
        try:
            await job
        except Unavailable as exc:
            # As a worker does: the run is left to its lease, and this process goes on.
            log.warning("database unavailable: %s", exc)
        except Exception:
            log.exception("call task: unexpected error; the run is left to its lease")
        finally:
            self.holdings.let_go(token)
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def drain(self, grace: timedelta) -> None:
        """Let calls in flight finish within ``grace``, then cancel the rest."""
        self._stopping = True
        with trio.move_on_after(grace.total_seconds()):
            await self._idle.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _call(self, definition: Definition, run: store.Claimed, request: Request) -> None:
        product = self.product(definition, run.step)
        product.queued += 1
        sent = False
        try:
            async with product.limiter:
                # A resend (an automatic retry, or an operator's retry-same) sends the bytes
                # sealed on the first sending, never a rebuilt request.
                sealed = await store.sealed_request(self.db, run) if run.attempt else None
                request, url = sealed or (request, product.url(request.target))
                run = await store.dispatch(self.db, run, request, url)
                sent = True
                started = trio.current_time()
                reply = await product.send(request, url)
                self.metrics.calls.labels(
                    product.config.name, run.step, _result_class(reply)
                ).observe(trio.current_time() - started)
            with trio.CancelScope(shield=True):  # an answer in hand is always recorded
                committed = await self._settle_persistently(definition, run, reply)
        except store.LeaseLost:
            log.warning("lost the lease before the call was recorded", extra={"run": run.id})
            return
        except trio.Cancelled:
            # Shutdown. A request that may have left is an uncertain outcome; one that
            # never left gives the run back untouched.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                if sent:
                    stopped = Reply(ReplyKind.LOST, detail="the service stopped during the call")
                    await self._settle(definition, run, stopped)
                else:
                    await store.release(self.db, run, run.now())
            raise
        finally:
            product.queued -= 1
        # Outside the handler above: once the answer is recorded, a shutdown while the run
        # goes on must not record the call again as interrupted.
        await self._go_on(definition, committed)

    async def _fetch(self, definition: Definition, run: store.Claimed, fetch: Fetch) -> None:
        step = definition.step(run.step)
        assert isinstance(step, WaitFor)
        product = self.products[step.connection]
        poll = product.config.result_poll
        # Deliveries from a little before this claim may describe a state the read below
        # does not see yet; the release checks for them and makes the run due again.
        since = run.clock[0] - timedelta(seconds=1)
        try:
            async with product.limiter:
                lookup = fetch.result.fetch
                request = build_request(lookup, {fetch.result.fetch_input: fetch.key}, None)
                reply = await product.send(request, product.url(request.target))
            with trio.CancelScope(shield=True):
                advance = fetched(definition, run.step, reply)
                committed = None
                if advance is not None:
                    committed = await store.commit(
                        self.db, definition, run, advance, self.lease, go_on=True
                    )
                    self.metrics.committed(definition, committed)
                    logs.transitions(committed, run.id)
                    self.metrics.resumed(step.connection, step.result_name, fetch.key)
                else:
                    due = await store.release_wait(self.db, run, step, fetch.key, poll, since)
                    self.timer.scheduled((due - run.now()).total_seconds())
        except store.LeaseLost:
            log.warning("lost the lease while reading the result", extra={"run": run.id})
            return
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await store.release_wait(self.db, run, step, fetch.key, poll, since)
            raise
        await self._go_on(definition, committed)  # as after a call: outside the handler

    async def _go_on(self, definition: Definition, committed: store.Committed | None) -> None:
        """Take the run's next steps now if its call or read completed its step."""
        if committed is None or not committed.held:
            return
        assert self.proceed is not None, "the engine sets proceed when it is built"
        await self.proceed(definition, committed.run, committed.ahead)

    async def _settle_persistently(
        self, definition: Definition, run: store.Claimed, reply: Reply
    ) -> store.Committed | None:
        """Record a call's answer, waiting out a database outage (the lease is kept
        meanwhile): an answer in hand must not become an unknown outcome. At shutdown
        the wait ends, and the run is taken up later as interrupted."""
        pause = 0.5
        while True:
            try:
                return await self._settle(definition, run, reply)
            except Unavailable as exc:
                log.warning(
                    "could not record a call's answer (%s); retrying", exc, extra={"run": run.id}
                )
            if self._stopping:
                return None
            await trio.sleep(pause)
            pause = min(pause * 2, 5.0)

    async def _settle(
        self, definition: Definition, run: store.Claimed, reply: Reply
    ) -> store.Committed:
        transition = settle(definition, run.step, reply, run.attempt, run.now())
        outcome = reply.kind.value if reply.kind is not ReplyKind.RESPONSE else "response"
        body = reply.body
        if reply.status is not None and not 200 <= reply.status < 300:
            body = body[:KEPT_ERROR_BODY]
        committed = await store.commit(
            self.db,
            definition,
            run,
            transition,
            self.lease,
            settlement=store.Settlement(outcome, reply.status, body or None),
            go_on=True,
        )
        self.metrics.committed(definition, committed)
        logs.transitions(committed, run.id)
        if isinstance(transition, Retry) and committed.due_at is not None:
            self.timer.scheduled((committed.due_at - committed.run.now()).total_seconds())
        return committed


async def with_products(
    connections: dict[str, ConnectionConfig],
    body: Callable[[dict[str, Product], httpx.AsyncClient], Awaitable[None]],
) -> None:
    """Open an HTTP client per connection around ``body``, and one for token endpoints and
    key sets (which ``body`` gets too)."""
    async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as token_client:
        products = {name: Product(config, token_client) for name, config in connections.items()}
        try:
            await body(products, token_client)
        finally:
            for product in products.values():
                await product.aclose()
