"""Call pools: one bounded pool per configured connection, and the life of one call.

Each connection has its own Trio capacity limiter and its own httpx client, so a
slow product fills only its own pool; calls and result reads alike wait in its
bounded queue (reads in half of it), and a run that finds the queue full is left
for later. A call goes
through these steps, and the order is what makes it safe to crash anywhere:

1. with a pool slot, the service identity's token is had (a token endpoint that is
   down or slow holds up nothing that was sent);
2. the request is sealed and marked dispatched in PostgreSQL;
3. it is sent;
4. the outcome is recorded in the same transaction that moves the run on, with the
   history event that says what became of the request (answered, not sent, or lost:
   ``statements.CALL_OUTCOMES``), after the ``call-dispatched`` of step 2.

A crash between 2 and 4 leaves a dispatched call without an outcome, which the
next holder of the run treats as unknown: a read is sent again, a mutation is
held for an operator. Nothing is ever resent on a guess. A shutdown knows more:
a request that had not begun to leave (no byte of it was written) is recorded as
not sent, and tried again after the restart.

An answer in hand is always recorded: through a database outage (the lease is
kept meanwhile); as a hold (``engine-defect``) if the database refuses to store
it; and, if the claim on the run was lost meanwhile, kept as late evidence on the
call's execution (``store.keep_late_answer``), which ``reconcile`` uses.

A wait-for's result read is recorded too: the read that completes the step as a
``result-read`` event committed with it, and a read that found no final result as a
``result-polled`` one when its answer differs from the wait's last (``store.release_wait``).
"""

from __future__ import annotations

import email.utils
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio

from registry_coordinator import __version__
from registry_coordinator.authoring.catalog import Operation
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.authoring.workflow import Call, WaitFor
from registry_coordinator.engine import logs, statements, store, tracing
from registry_coordinator.engine.backoff import ANSWER_RECORDING
from registry_coordinator.engine.config import ConnectionConfig
from registry_coordinator.engine.database import Database, StatementFailed, Unavailable
from registry_coordinator.engine.identity import (
    Credentials,
    IdentityRefused,
    IdentityUnavailable,
    credentials,
)
from registry_coordinator.engine.metrics import Metrics
from registry_coordinator.engine.timers import Timer
from registry_coordinator.semantics.codes import HoldCode
from registry_coordinator.semantics.steps import (
    Fetch,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    Transition,
    build_receipt_request,
    build_request,
    detail,
    fetched,
    settle,
)

log = logging.getLogger(__name__)

#: Runs queued for one connection beyond its pool size, before workers leave them for later.
QUEUE_FACTOR = 16
#: Error bodies kept on an execution row; the rest of a refusal is not needed to explain it.
KEPT_ERROR_BODY = 2048

#: Told what became of one read that was sent: its result class and the seconds it took.
Observe = Callable[[str, float], None]


class Sending:
    """Whether a request may have begun to leave. ``begun`` is set when it is handed to
    httpx; ``left`` by httpcore's trace of the connection, the moment before its first
    byte is written. The trace is trusted only once it has been seen to work in this
    process (:attr:`proven`): should a newer httpcore stop reporting it, every request
    handed to httpx counts as possibly sent, as if there were no trace."""

    proven = False  # the trace has reported a request leaving, in this process

    def __init__(self) -> None:
        self.begun = False
        self.left = False

    @property
    def never_left(self) -> bool:
        """Certainly not sent: not handed to httpx, or the trace says no byte was written."""
        return not self.begun or (Sending.proven and not self.left)

    async def trace(self, event: str, _: dict[str, Any]) -> None:
        if event.endswith("send_request_headers.started"):
            self.left = Sending.proven = True


class Product:
    """One configured connection at run time: capacity limit, HTTP client, identity."""

    def __init__(
        self,
        config: ConnectionConfig,
        token_client: httpx.AsyncClient,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.limiter = trio.CapacityLimiter(config.pool_size)
        self.queued = 0  # calls and result reads waiting for a slot or in flight
        self.latency = 0.1  # seconds: a moving average of the product's answers
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
        #: Where its receipt lookups are timed (the service's; none for doctor's checks).
        self.metrics = metrics

    def _trouble(self, exc: httpx.HTTPError) -> str:
        """What went wrong on the way, in words an operator can act on: httpx's timeouts
        carry no text of their own, so say which limit ran out."""
        config = self.config
        limits = {
            httpx.ConnectTimeout: f"no connection within connectTimeout "
            f"{format_duration(config.connect_timeout)}",
            httpx.ReadTimeout: f"nothing came back within requestTimeout "
            f"{format_duration(config.request_timeout)}",
            httpx.WriteTimeout: f"the request could not be sent within requestTimeout "
            f"{format_duration(config.request_timeout)}",
        }
        said = next((text for kind, text in limits.items() if isinstance(exc, kind)), str(exc))
        return f"{type(exc).__name__}: {said}" if said else type(exc).__name__

    def url(self, target: str) -> str:
        return self.config.base_url + target

    def saturated(self, *, read: bool) -> bool:
        """Whether the queue is full: for calls at :data:`QUEUE_FACTOR` times the pool, for
        result reads at half that — so reads (a poll, a webhook's wake-up) never fill the
        queue ahead of the calls that move runs on."""
        limit = self.config.pool_size * QUEUE_FACTOR
        return self.queued >= (max(1, limit // 2) if read else limit)

    def drain_time(self, jitter: Callable[[], float] = random.random) -> timedelta:
        """Roughly how long until a full queue has room again — its calls, each as slow as
        the product's recent answers, over the pool — spread by ``jitter`` (in [0, 1]), so
        the runs turned away meanwhile do not all come back at once."""
        estimate = max(1.0, self.queued * self.latency / self.config.pool_size)
        return timedelta(seconds=estimate * (1 + jitter()))

    async def authorize(self) -> str | Reply:
        """The Authorization header for the next request; or, when none could be had, the
        Reply of a request that never left: not sent (the token endpoint is unreachable),
        or refused (the token endpoint refused Coordinator's credentials: 401)."""
        try:
            return await self.credentials.authorization()
        except IdentityUnavailable as exc:
            return Reply(ReplyKind.NOT_SENT, detail=str(exc))
        except IdentityRefused as exc:
            return Reply(ReplyKind.RESPONSE, 401, str(exc).encode(), detail=str(exc))

    async def send(
        self,
        request: Request,
        url: str,
        authorization: str,
        sending: Sending | None = None,
        trace: Mapping[str, str] = tracing.NO_HEADERS,
    ) -> Reply:
        """Send one request; transport trouble becomes a Reply, never an exception. A
        failure before the request began to leave (``sending``) is not-sent, after it lost.

        The caller holds a slot of :attr:`limiter`.
        """
        sending = sending or Sending()
        sending.begun = True
        headers = {"Authorization": authorization, **trace}
        if request.idempotency_key is not None:
            headers["Idempotency-Key"] = request.idempotency_key
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        started = trio.current_time()
        try:
            async with self.client.stream(
                request.method,
                url,
                content=request.body,
                headers=headers,
                extensions={"trace": sending.trace},
            ) as response:
                body = await self._read(response)
                retry_after = _retry_after(response.headers.get("Retry-After"))
                reply = Reply(ReplyKind.RESPONSE, response.status_code, body, retry_after)
        except httpx.HTTPError as exc:
            refused = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            kind = ReplyKind.NOT_SENT if refused or sending.never_left else ReplyKind.LOST
            return Reply(kind, detail=self._trouble(exc))
        self.latency = 0.8 * self.latency + 0.2 * (trio.current_time() - started)
        return reply

    async def read(
        self,
        request: Request,
        observe: Observe | None = None,
        trace: Mapping[str, str] = tracing.NO_HEADERS,
    ) -> Reply:
        """Authorize and send a read (a result fetch, a receipt lookup); ``observe`` is
        told its result and how long the sending took (not a read that never had a
        token: it was not sent, as a call that never had one is not timed either)."""
        authorization = await self.authorize()
        if isinstance(authorization, Reply):
            return authorization
        started = trio.current_time()
        reply = await self.send(request, self.url(request.target), authorization, None, trace)
        if observe is not None:
            observe(_result_class(reply), trio.current_time() - started)
        return reply

    async def look_up_receipt(self, operation: Operation, key: str) -> tuple[Reply, str]:
        """Ask the product for its record of the original idempotency ``key`` of a call of
        ``operation`` (reconcile), with a slot of the pool; its answer and the URL asked,
        for the history. Timed as ``coordinator_receipt_lookup_duration_seconds``."""
        lookup = build_receipt_request(operation, key)
        metrics = self.metrics
        observe = None
        if metrics is not None:
            observe = partial(metrics.looked_up, self.config.name, operation.name)
        async with self.limiter:
            reply = await self.read(lookup, observe)
        return reply, self.url(lookup.target)

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


#: How a run goes on after its call or read completes its step, still held: the engine's
#: own step loop (``Engine.advance``), so the run does not wait to be claimed again.
Proceed = Callable[[Definition, store.Claimed, store.Ahead | None], Awaitable[None]]


@dataclass
class Calls:
    """The nursery every call runs in, and the products calls go to. The engine builds
    it, giving it the step loop a run goes on in (``proceed``); it knows no engine."""

    db: Database
    products: dict[str, Product]
    timer: Timer
    lease: timedelta
    metrics: Metrics
    holdings: store.Holdings
    proceed: Proceed

    def __post_init__(self) -> None:
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

    def connection(self, definition: Definition, step_id: str) -> Product:
        """The product a call or wait-for step talks to."""
        step = definition.step(step_id)
        assert isinstance(step, Call | WaitFor)
        return self.products[step.connection]

    def poll(self, definition: Definition, step_id: str) -> timedelta | None:
        """How often a run waiting at ``step_id`` reads its result without a delivery."""
        step = definition.step(step_id)
        if not isinstance(step, WaitFor):
            return None
        return self.products[step.connection].config.result_poll

    def submit(self, definition: Definition, run: store.Claimed, request: Request) -> None:
        """Hand a claimed run at a call step to its connection's pool; returns at once."""
        self._spawn(self._call(definition, run, request), run, definition)

    def fetch(self, definition: Definition, run: store.Claimed, fetch: Fetch) -> None:
        """Hand a claimed waiting run to its connection's pool to read its result."""
        self._spawn(self._fetch(definition, run, fetch), run, definition)

    def _spawn(
        self, job: Coroutine[Any, Any, None], run: store.Claimed, definition: Definition
    ) -> None:
        """Start a call or read task. It counts in its connection's queue from now (the task
        lets go of it), so the next worker's saturation check sees it at once."""
        assert self._nursery is not None
        self.connection(definition, run.step).queued += 1
        self._in_flight += 1
        self._idle = trio.Event() if self._in_flight == 1 else self._idle
        self.holdings.take(run.token)  # before the hand-off, so the lease is never left unkept
        self._nursery.start_soon(self._tracked, job, run)

    async def _tracked(self, job: Coroutine[Any, Any, None], run: store.Claimed) -> None:
        try:
            await job
        except Unavailable as exc:
            # As a worker does: the run is left to its lease, and this process goes on.
            log.warning("database unavailable: %s", exc)
        except Exception as exc:
            log.exception("call task: unexpected error", extra={"run": run.id})
            why = detail(f"a call task failed: {type(exc).__name__}: {exc}")
            with trio.CancelScope(shield=True):
                try:
                    await store.record_defect(self.db, run, HoldCode.ENGINE_DEFECT, why)
                except (Unavailable, StatementFailed) as failed:
                    log.warning("could not record the defect: %s", failed, extra={"run": run.id})
        finally:
            self.holdings.let_go(run.token)
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
        product = self.connection(definition, run.step)
        sending = Sending()
        dispatched = False
        try:
            async with product.limiter:
                # A resend (an automatic retry, or an operator's retry-same) sends the bytes
                # sealed on the first sending, never a rebuilt request.
                sealed = await store.sealed_request(self.db, run) if run.attempt else None
                request, url = sealed or (request, product.url(request.target))
                authorization = await product.authorize()
                if isinstance(authorization, Reply):
                    # Nothing was sealed or sent; the try counts, for the next one's backoff.
                    run = replace(run, attempt=run.attempt + 1)
                    reply = authorization
                else:
                    with trio.CancelScope(shield=True):  # know whether it was sealed
                        run = await self._dispatch_persistently(run, request, url)
                    dispatched = True
                    await trio.lowlevel.checkpoint_if_cancelled()
                    step = definition.step(run.step)
                    assert isinstance(step, Call)  # only a call step sends a request
                    started = trio.current_time()
                    name = product.config.name
                    with tracing.call(run, name, step.operation, request.method, url) as traced:
                        reply = await product.send(
                            request, url, authorization, sending, traced.headers
                        )
                        traced.answered(reply)
                    self.metrics.calls.labels(
                        product.config.name, step.operation, _result_class(reply)
                    ).observe(trio.current_time() - started)
            with trio.CancelScope(shield=True):  # an answer in hand is always recorded
                committed = await self._settle_persistently(definition, run, reply)
        except store.LeaseLost:
            log.warning("lost the lease before the call was recorded", extra={"run": run.id})
            return
        except trio.Cancelled:
            # Shutdown. A request that may have left is an uncertain outcome; a sealed one
            # that had not begun to leave was not sent; an unsealed one gives the run back.
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    if not dispatched:
                        await store.release(self.db, run, run.now())
                    elif sending.never_left:
                        why = "the service stopped before sending"
                        await self._settle(definition, run, Reply(ReplyKind.NOT_SENT, detail=why))
                    else:
                        why = "the service stopped during the call"
                        await self._settle(definition, run, Reply(ReplyKind.LOST, detail=why))
                except (store.LeaseLost, Unavailable, StatementFailed) as exc:
                    # The next holder finds the call dispatched, as after a crash.
                    log.warning(
                        "stopping: left the call unrecorded: %r", exc, extra={"run": run.id}
                    )
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
        lookup = fetch.result.fetch
        try:
            async with product.limiter:
                request = build_request(lookup, {fetch.result.fetch_input: fetch.key}, None)
                observe = partial(self.metrics.result_fetched, product.config.name, lookup.name)
                url = product.url(request.target)
                name = product.config.name
                with tracing.call(run, name, lookup.name, request.method, url) as traced:
                    reply = await product.read(request, observe, traced.headers)
                    traced.answered(reply)
            with trio.CancelScope(shield=True):
                advance = fetched(definition, run.step, reply)
                committed = None
                if advance is not None:
                    assert reply.status is not None  # only a 2xx answer is a result
                    read = statements.result_read(url, reply.status, fetch.key)
                    committed = await store.commit(
                        self.db, definition, run, advance, self.lease, read=read, go_on=True
                    )
                    self.metrics.committed(definition, committed)
                    logs.transitions(committed, run.id)
                    tracing.committed(definition, committed, run.attempt)
                    self.metrics.resumed(step.connection, step.result_name, fetch.key)
                else:
                    polled = statements.result_polled(url, reply)
                    due = await store.release_wait(self.db, run, poll, polled)
                    self.timer.scheduled((due - run.now()).total_seconds())
        except store.LeaseLost:
            log.warning("lost the lease while reading the result", extra={"run": run.id})
            return
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await store.release_wait(self.db, run, poll)
            raise
        finally:
            product.queued -= 1
        await self._go_on(definition, committed)  # as after a call: outside the handler

    async def _go_on(self, definition: Definition, committed: store.Committed | None) -> None:
        """Take the run's next steps now if its call or read completed its step."""
        if committed is None or not committed.held:
            return
        await self.proceed(definition, committed.run, committed.ahead)

    async def _dispatch_persistently(
        self, run: store.Claimed, request: Request, url: str
    ) -> store.Claimed:
        """Seal the request, waiting out a database outage (the lease is kept meanwhile).
        A sealing whose reply the outage hid is looked up before it is sent again: if it
        committed, the request is sealed and certainly not sent — this task is its one
        sender — so it is sent now, where leaving the run to its lease would have made
        the next holder hold it as interrupted. At shutdown the wait ends, and the run is
        left to its lease as before."""
        outages = 0
        while True:
            try:
                if outages:
                    sealed = await store.sealed_meanwhile(self.db, run)
                    if sealed is not None:
                        return sealed
                return await store.dispatch(self.db, run, request, url)
            except Unavailable as exc:
                if self._stopping:
                    raise
                log.warning(
                    "could not seal a call's request (%s); retrying", exc, extra={"run": run.id}
                )
            outages += 1
            await trio.sleep(ANSWER_RECORDING.pause(outages))

    async def _settle_persistently(
        self, definition: Definition, run: store.Claimed, reply: Reply
    ) -> store.Committed | None:
        """Record a call's answer, waiting out a database outage (the lease is kept
        meanwhile): an answer in hand must not become an unknown outcome. If the database
        refuses to store it, the run is held (engine-defect), the answer's bytes kept on
        the call's execution. If the claim was lost meanwhile, the answer is kept as late
        evidence. At shutdown the wait ends, and the run is taken up later as interrupted."""
        transition = settle(definition, run.step, reply, run.attempt, run.now())
        outages = 0  # in a row; a refused answer is recorded again at once, as a hold
        while True:
            try:
                return await self._settle(definition, run, reply, transition)
            except Unavailable as exc:
                log.warning(
                    "could not record a call's answer (%s); retrying", exc, extra={"run": run.id}
                )
            except StatementFailed as exc:
                if isinstance(transition, Held) and transition.code is HoldCode.ENGINE_DEFECT:
                    raise
                log.error("the database refused a call's answer: %s", exc, extra={"run": run.id})
                why = f"the database refused to record the answer ({_result_class(reply)}): {exc}"
                transition = Held(HoldCode.ENGINE_DEFECT, detail(why))
                continue
            except store.LeaseLost:
                if run.dispatched and reply.kind is ReplyKind.RESPONSE and reply.status:
                    await store.keep_late_answer(self.db, run, reply.status, reply.body)
                raise
            if self._stopping:
                return None
            outages += 1
            await trio.sleep(ANSWER_RECORDING.pause(outages))

    async def _settle(
        self,
        definition: Definition,
        run: store.Claimed,
        reply: Reply,
        transition: Transition | None = None,
    ) -> store.Committed:
        """Record one answer (or why there was none) and the transition it leads to."""
        if transition is None:
            transition = settle(definition, run.step, reply, run.attempt, run.now())
        settlement = None
        if run.dispatched:
            outcome = reply.kind.value if reply.kind is not ReplyKind.RESPONSE else "response"
            body = reply.body
            if reply.status is not None and not 200 <= reply.status < 300:
                body = body[:KEPT_ERROR_BODY]
            settlement = store.Settlement(outcome, reply.status, body or None)
        committed = await store.commit(
            self.db,
            definition,
            run,
            transition,
            self.lease,
            settlement=settlement,
            no_answer=reply.detail,
            go_on=True,
        )
        self.metrics.committed(definition, committed)
        logs.transitions(committed, run.id)
        tracing.committed(definition, committed, run.attempt)
        if isinstance(transition, Retry) and committed.due_at is not None:
            self.timer.scheduled((committed.due_at - committed.run.now()).total_seconds())
        return committed


@asynccontextmanager
async def open_products(
    connections: dict[str, ConnectionConfig], metrics: Metrics | None = None
) -> AsyncIterator[tuple[dict[str, Product], httpx.AsyncClient]]:
    """An HTTP client per connection, and one for token endpoints and key sets; all
    closed on the way out. ``metrics`` times the products' receipt lookups."""
    async with httpx.AsyncClient(timeout=10.0, follow_redirects=False) as token_client:
        products = {
            name: Product(config, token_client, metrics) for name, config in connections.items()
        }
        try:
            yield products, token_client
        finally:
            for product in products.values():
                await product.aclose()
