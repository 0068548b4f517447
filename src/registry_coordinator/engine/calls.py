"""Call pools: one bounded pool per configured connection, and the life of one call.

Each connection has its own Trio capacity limiter, its own pace (``engine.pacing``: a
rate limit, and a product's Retry-After holding back the whole connection) and its own
httpx client, so a slow product fills only its own pool; calls and result reads alike wait in its
bounded queue (reads in half of it), and a run that finds the queue full is left
for later. A call goes
through these steps, and the order is what makes it safe to crash anywhere:

1. with a pool slot, the service identity's token is had (a token endpoint that is
   down or slow holds up nothing that was sent);
2. the request is sealed and marked dispatched in PostgreSQL;
3. the high-water mark outside the database is raised past that sealing
   (``engine.high_water``), so a database restored from an older backup is recognised;
4. it is sent;
5. the outcome is recorded in the same transaction that moves the run on, with the
   history event that says what became of the request (answered, not sent, or lost:
   ``statements.CALL_OUTCOMES``), after the ``call-dispatched`` of step 2.

A crash between 2 and 5 leaves a dispatched call without an outcome, which the
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
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio

from registry_coordinator import __version__, store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import Operation
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.durations import format_duration
from registry_coordinator.authoring.workflow import Call, WaitFor
from registry_coordinator.config import ConnectionConfig
from registry_coordinator.custody import Unopenable
from registry_coordinator.engine import destinations
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.backoff import ANSWER_RECORDING
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.identity import (
    Credentials,
    Grant,
    IdentityRefused,
    IdentityUnavailable,
    TaskGrants,
    credentials,
    task_grants,
)
from registry_coordinator.engine.pacing import Pace
from registry_coordinator.engine.preparation import Prepared, Preparer
from registry_coordinator.engine.timers import Timer
from registry_coordinator.observability import tracing
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.semantics.codes import FailureCode, HoldCode
from registry_coordinator.semantics.steps import (
    Check,
    Failed,
    Fetch,
    Held,
    Reply,
    ReplyKind,
    Request,
    Retry,
    Transition,
    backoff,
    bind,
    build_receipt_request,
    build_request,
    checked,
    detail,
    fetched,
    settle,
)
from registry_coordinator.store import pauses, statements
from registry_coordinator.store.database import Database, StatementFailed, Unavailable

log = logging.getLogger(__name__)

#: Runs queued for one connection beyond its pool size, before workers leave them for later.
QUEUE_FACTOR = 16
#: Error bodies kept on an execution row; the rest of a refusal is not needed to explain it.
KEPT_ERROR_BODY = 2048
#: The statuses whose Retry-After holds back the whole connection: the product is busy.
SLOW_DOWN = frozenset({429, 503})
#: The longest a product's Retry-After holds back its connection (its run waits its own).
LONGEST_PAUSE = timedelta(minutes=5)
#: The longest a request sealed and marked dispatched waits at its connection's gate for a
#: product's pause that came after it was sealed; past this it is not sent (and tried again
#: after the pause), so that a kill during the wait leaves no outcome unknown.
LONGEST_GATE_WAIT = 1.0

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
        self.pace = Pace(config.rate)  # its rate limit, and a product's word to slow down
        #: Paused by an operator for the product's maintenance (``store.pauses``), as this
        #: process last heard: no call is sealed over it meanwhile.
        self.paused = False
        self.queued = 0  # calls and result reads waiting for a slot or in flight
        self.latency = 0.1  # seconds: a moving average of the product's answers
        request = config.request_timeout.total_seconds()
        limits = httpx.Limits(
            max_connections=config.pool_size,
            max_keepalive_connections=config.pool_size,
            # Shorter than servers' usual keep-alive, so a pooled connection is not
            # reused just as the server closes it (an ambiguous failure for a mutation).
            keepalive_expiry=2.0,
        )
        transport = None
        if config.external is not None:
            # An external read connects only where its host resolves now and may go
            # (engine.destinations), and never through a proxy. httpx takes no network
            # backend for the pool it builds, so the pinned one is set on that pool
            # (tests/engine/test_destinations.py fails should a newer httpx not use it).
            transport = httpx.AsyncHTTPTransport(limits=limits)
            transport._pool._network_backend = destinations.Pinned()
        self.client = httpx.AsyncClient(
            transport=transport,
            limits=limits,
            timeout=httpx.Timeout(
                connect=config.connect_timeout.total_seconds(),
                read=request,
                write=request,
                pool=None,
            ),
            follow_redirects=False,
            headers={
                "User-Agent": f"registry-coordinator/{__version__}",
                "Accept": "application/json",
            },
        )
        self.credentials: Credentials = credentials(config.identity, token_client)
        #: Tokens had under Casework's task authority, if the connection has it.
        self.grants: TaskGrants | None = task_grants(config.identity, token_client)
        #: The read-only identity receipt lookups are made with.
        self.observer: Credentials = (
            credentials(config.observation, token_client)
            if config.observation is not None
            else self.credentials
        )
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

    async def authorize(self, *, observing: bool = False, grant: JSON = None) -> str | Reply:
        """The Authorization header for the next request (``observing``: of the read-only
        identity receipt lookups are made with; ``grant``: under Casework's task
        authority, for the task grant named); or, when none could be had, the Reply of a
        request that never left: not sent (the token endpoint, or Casework, is
        unreachable), or refused (either refused Coordinator's credentials: 401)."""
        try:
            if grant is not None and self.grants is not None and not observing:
                assert isinstance(grant, dict)
                return await self.grants.authorization(Grant(grant["id"], grant["expiresAt"]))
            credentials = self.observer if observing else self.credentials
            if self.config.external is None:
                return await credentials.authorization()
            # An external read's attempt is bounded as a whole, its token included.
            with trio.move_on_after(self.config.request_timeout.total_seconds()):
                return await credentials.authorization()
            within = format_duration(self.config.request_timeout)
            return Reply(ReplyKind.NOT_SENT, detail=f"no token within requestTimeout {within}")
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
        failure before the request began to leave (``sending``) is not-sent, after it lost;
        so is a request its product asked, since it was sealed, to wait for longer than
        :data:`LONGEST_GATE_WAIT`: a wait with it marked dispatched would leave its outcome
        unknown to a kill meanwhile.

        The caller holds a slot of :attr:`limiter`.
        """
        sending = sending or Sending()
        paused = self.pace.paused_until - trio.current_time()
        if paused > LONGEST_GATE_WAIT:  # a product's pause heard since it was sealed
            return Reply(
                ReplyKind.NOT_SENT,
                detail=f"the product asked for {math.ceil(paused)} s more before another "
                "request (Retry-After): not sent, taken again after it",
            )
        await self.pace.leave()
        sending.begun = True
        headers = {**dict(request.headers), **trace}
        if authorization:
            headers["Authorization"] = authorization
        if request.idempotency_key is not None:
            headers["Idempotency-Key"] = request.idempotency_key
        if request.body is not None:
            headers["Content-Type"] = "application/json"
        started = trio.current_time()
        # An external read is bounded as a whole; a product's call by httpx's timeouts.
        bound = self.config.request_timeout.total_seconds() if self.config.external else None
        try:
            with trio.move_on_after(bound if bound is not None else float("inf")) as attempt:
                async with self.client.stream(
                    request.method,
                    url,
                    content=request.body,
                    headers=headers,
                    extensions={"trace": sending.trace},
                ) as response:
                    body, exceeded = await self._read(response)
                    retry_after = _retry_after(response.headers.get("Retry-After"))
                    if retry_after is not None and response.status_code in SLOW_DOWN:
                        self.pace.slow_down(min(retry_after, LONGEST_PAUSE))
                    reply = Reply(
                        ReplyKind.RESPONSE, response.status_code, body, retry_after, "", exceeded
                    )
        except httpx.HTTPError as exc:
            refused = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
            kind = ReplyKind.NOT_SENT if refused or sending.never_left else ReplyKind.LOST
            return Reply(kind, detail=self._trouble(exc))
        if attempt.cancelled_caught:
            kind = ReplyKind.NOT_SENT if sending.never_left else ReplyKind.LOST
            within = format_duration(self.config.request_timeout)
            return Reply(kind, detail=f"no answer within requestTimeout {within}")
        self.latency = 0.8 * self.latency + 0.2 * (trio.current_time() - started)
        return reply

    async def read(
        self,
        request: Request,
        observe: Observe | None = None,
        trace: Mapping[str, str] = tracing.NO_HEADERS,
        *,
        observing: bool = False,
    ) -> Reply:
        """Authorize and send a read (a result fetch, a feed page, a receipt lookup: with
        ``observing``, as the read-only identity); ``observe`` is told its result and how
        long the sending took (not a read that never had a token: it was not sent, as a
        call that never had one is not timed either)."""
        authorization = await self.authorize(observing=observing)
        if isinstance(authorization, Reply):
            return authorization
        started = trio.current_time()
        reply = await self.send(request, self.url(request.target), authorization, None, trace)
        if observe is not None:
            observe(_result_class(reply), trio.current_time() - started)
        return reply

    async def look_up_receipt(
        self, operation: Operation, sealed: Request, trace: Mapping[str, str] = tracing.NO_HEADERS
    ) -> tuple[Reply, str]:
        """Ask the product for its record of the original idempotency key of a sealed call
        of ``operation`` (reconcile, and the engine's own checks), as the read-only
        identity with a slot of the pool; its answer and the URL asked, for the history.
        Timed as ``coordinator_receipt_lookup_duration_seconds``."""
        lookup = build_receipt_request(operation, sealed)
        metrics = self.metrics
        observe = None
        if metrics is not None:
            observe = partial(metrics.looked_up, self.config.name, operation.name)
        async with self.limiter:
            reply = await self.read(lookup, observe, trace, observing=True)
        return reply, self.url(lookup.target)

    async def _read(self, response: httpx.Response) -> tuple[bytes, bool]:
        """The answer's body, and whether it exceeded the connection's limit: refused, not
        truncated (the body is then empty), as a cut JSON body is no answer."""
        limit = self.config.response_limit
        chunks, size = [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                return b"", True
            chunks.append(chunk)
        return b"".join(chunks), False

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.client.aclose()


def _authority_problem(operation: Operation, product: Product, grant: JSON) -> Failed | None:
    """Why a call cannot be sent under the authority it names: a grant for a connection
    without Casework's task authority, or none for one with it (nothing is sent)."""
    name = f"{operation.product}/{operation.name}"
    if product.grants is None:
        if grant is None:
            return None
        why = (
            f"{name} names a task grant, but connection {product.config.name} has no taskAuthority"
        )
        return Failed(FailureCode.REQUEST_INVALID, why)
    if operation.grant is None or grant is not None:
        return None
    why = (
        f"connection {product.config.name} runs {name} under Casework's task authority: "
        "name the approval in the step's input, as grant: {id, expiresAt}"
    )
    return Failed(FailureCode.REQUEST_INVALID, why)


async def _authorization(
    operation: Operation, product: Product, request: Request, url: str
) -> str | Failed | Reply:
    """The Authorization header to send the request with; or why it cannot be sent: the
    operation needs an authority the connection lacks, an external read may not go to
    that address (:class:`Failed`), or no token could be had (a :class:`Reply` of a
    try that sent nothing)."""
    refused: Failed | Reply | None = _authority_problem(operation, product, request.grant)
    if refused is None and operation.external:
        refused = await _external_refusal(product, request, url)
    return refused if refused is not None else await product.authorize(grant=request.grant)


def _sealable(ready: Request | Prepared) -> tuple[Request, dict[str, JSON] | None]:
    """The request to seal and what it was prepared under, with the task grant it is
    sent under, sealed with it to be proved again on a resend."""
    request, prepared = (
        (ready.request, ready.binding) if isinstance(ready, Prepared) else (ready, None)
    )
    if request.grant is not None:
        prepared = {**(prepared or {}), "grant": request.grant}
    return request, prepared


async def _external_refusal(product: Product, request: Request, url: str) -> Failed | Reply | None:
    """Why an external read may not be sent, judged before its token is asked for: a path
    or query the connection's review does not allow, or a host that resolves where no
    read may go (failed, nothing sent); or a host that does not resolve now (not sent)."""
    reviewed = product.config.external
    assert reviewed is not None  # an external operation is bound to an external connection
    # A read sent again is the sealed one, to the URL it was sealed for: judged anew, as
    # the review may have changed since (its base URL included).
    base = product.config.base_url
    within = url.startswith(base + "/")
    # The detail names no query value: a run's failure is logged, and values may be personal.
    why = (
        reviewed.refusal(url.removeprefix(base))
        if within
        else f"the read was sealed for another base URL than the connection's, {base}"
    )
    if why is not None:
        return Failed(FailureCode.EXTERNAL_INVALID_COMMAND, why)
    try:
        why = await destinations.refusal(url)
    except destinations.Unresolved as exc:
        return Reply(ReplyKind.NOT_SENT, detail=str(exc))
    return Failed(FailureCode.EXTERNAL_DESTINATION_REFUSED, why) if why is not None else None


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
    after: AfterCommit  # what follows each commit a call task makes
    holdings: store.Holdings
    proceed: Proceed
    #: What a sealed request waits for before it leaves: the mark outside the database
    #: raised past its sealing (none to wait for without a mark configured).
    high_water: HighWater

    def __post_init__(self) -> None:
        self.metrics = self.after.metrics
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
        """When a run that begins to wait at ``step_id`` first reads its result without a
        delivery: soon for a result that only a read tells, else at the slow poll."""
        step = definition.step(step_id)
        if not isinstance(step, WaitFor):
            return None
        result = definition.results[step_id]
        return self.products[step.connection].config.read_schedule(0, result.read_only)

    def submit(self, definition: Definition, run: store.Claimed, request: Request) -> None:
        """Hand a claimed run at a call step to its connection's pool; returns at once."""
        self._spawn(self._call(definition, run, request), run, definition)

    def fetch(self, definition: Definition, run: store.Claimed, fetch: Fetch) -> None:
        """Hand a claimed waiting run to its connection's pool to read its result."""
        self._spawn(self._fetch(definition, run, fetch), run, definition)

    def check(self, definition: Definition, run: store.Claimed, check: Check) -> None:
        """Hand a claimed run whose call's outcome is unknown to its connection's pool, to
        ask the product for its receipt of the call's original key."""
        self._spawn(self._check(definition, run, check), run, definition)

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
            code = HoldCode.ENGINE_DEFECT
            if isinstance(exc, Unopenable):  # what it read of the run: no retry opens it
                code = HoldCode.DATA_UNOPENABLE
            else:
                log.exception("call task: unexpected error", extra={"run": run.id})
            why = detail(f"a call task failed: {type(exc).__name__}: {exc}")
            with trio.CancelScope(shield=True):
                try:
                    if await store.record_defect(self.db, run, code, why):
                        log.error("run held (%s): %s", code, why, extra={"run": run.id})
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
        """Send a call step's request once, and record what became of it: sealed before it
        leaves, its answer committed with the run's transition, shielded from shutdown
        wherever a cancellation would lose what the database must know."""
        product = self.connection(definition, run.step)
        sending = Sending()
        dispatched = False
        stopped: Transition | None = None  # a command that could not be prepared
        try:
            if product.paused and await self._parked(run, product):
                return
            async with product.limiter:
                # A resend (an automatic retry, an asking by the identical request, or an
                # operator's retry-same) sends the bytes sealed on the first sending,
                # never a rebuilt request.
                sealed = await store.sealed_request(self.db, run) if run.attempt else None
                request, url, binding = self._addressed(definition, run, product, request, sealed)
                authorization = await _authorization(
                    definition.operations[run.step], product, request, url
                )
                if isinstance(authorization, Failed):
                    stopped = authorization
                elif isinstance(authorization, Reply):
                    # Nothing was sealed or sent; the try counts, for the next one's backoff.
                    run = replace(run, attempt=run.attempt + 1)
                    reply = authorization
                else:
                    ready = await self._ready(
                        definition, run, product, authorization, request, sealed
                    )
                    if isinstance(ready, Prepared | Request):
                        request, prepared = _sealable(ready)
                        await product.pace.ticket()  # a backlog waits with nothing sealed
                        with trio.CancelScope(shield=True):  # know whether it was sealed
                            run = await self._dispatch_persistently(
                                run, request, url, prepared, binding
                            )
                        dispatched = True
                        # Not sent before a restored backup could forget it was sealed.
                        await self.high_water.passed()
                        reply = await self._send(
                            definition, run, product, request, url, authorization, sending
                        )
                    else:
                        stopped = ready
            if stopped is not None:
                await self._not_sent(definition, run, stopped)
                return
            with trio.CancelScope(shield=True):  # an answer in hand is always recorded
                uncertain = sealed is not None and sealed.uncertain
                committed = await self._settle_persistently(definition, run, reply, uncertain)
        except store.LeaseLost:
            log.warning("lost the lease before the call was recorded", extra={"run": run.id})
            return
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._interrupted(definition, run, dispatched, sending)
            raise
        finally:
            product.queued -= 1
        # Outside the handler above: once the answer is recorded, a shutdown while the run
        # goes on must not record the call again as interrupted.
        await self._go_on(definition, committed)

    async def _parked(self, run: store.Claimed, product: Product) -> bool:
        """Whether the run stops here, nothing sealed: parked for its connection's pause,
        or the pause still stands and the claim was lost; False if the database says the
        pause was lifted meanwhile (the run goes on)."""
        name = product.config.name
        with trio.CancelScope(shield=True):
            if await pauses.park(self.db, run.id, run.token, name):
                log.info(
                    "connection %s is paused: the run waits for it", name, extra={"run": run.id}
                )
                return True
            # Not parked: the pause was lifted (this process has not heard yet), or the
            # claim is gone. Ask the database which, rather than send over a pause.
            product.paused = name in {p.connection for p in await pauses.paused(self.db)}
        return product.paused

    def _addressed(
        self,
        definition: Definition,
        run: store.Claimed,
        product: Product,
        request: Request,
        sealed: store.Sealed | None,
    ) -> tuple[Request, str, JSON]:
        """The request, its URL and the binding it goes over: on a first sending, the
        step's request with the connection's parameters bound; on a resend, the sealed
        bytes and address, with the grant they were sealed under — at the connection's
        address as it is now only where an operator said so (``rebind``)."""
        if sealed is None:
            request = bind(definition.operations[run.step], request, product.config.parameters)
            return request, product.url(request.target), product.config.binding()
        grant = (sealed.prepared or {}).get("grant")
        url, binding = sealed.url, sealed.binding
        if sealed.rebind and binding is not None:
            base = str(binding["baseUrl"])
            url = product.config.base_url + url.removeprefix(base)
            binding = product.config.binding()
        return replace(sealed.request, grant=grant), url, binding

    async def _send(
        self,
        definition: Definition,
        run: store.Claimed,
        product: Product,
        request: Request,
        url: str,
        authorization: str,
        sending: Sending,
    ) -> Reply:
        """Send a sealed request, traced and timed by connection, operation and result."""
        step = definition.step(run.step)
        assert isinstance(step, Call)  # only a call step sends a request
        started = trio.current_time()
        name = product.config.name
        with tracing.call(run, name, step.operation, request.method, url) as traced:
            reply = await product.send(request, url, authorization, sending, traced.headers)
            traced.answered(reply)
        self.metrics.calls.labels(name, step.operation, _result_class(reply)).observe(
            trio.current_time() - started
        )
        return reply

    async def _not_sent(
        self, definition: Definition, run: store.Claimed, stopped: Transition
    ) -> None:
        """Commit what becomes of a run whose command could not be prepared or authorized:
        nothing was sent, so the run moves on (a retry counts, for the next backoff)."""
        with trio.CancelScope(shield=True):
            if isinstance(stopped, Retry):
                run = replace(run, attempt=run.attempt + 1)
            done = await store.commit(self.db, definition, run, stopped, self.lease, go_on=True)
            self.after(definition, done, attempt=run.attempt)
        await self._go_on(definition, done)

    async def _interrupted(
        self, definition: Definition, run: store.Claimed, dispatched: bool, sending: Sending
    ) -> None:
        """Shutdown, during a call. A request that may have left is an uncertain outcome; a
        sealed one that had not begun to leave was not sent; an unsealed one gives the run
        back. If none of that can be written, the next holder finds the call dispatched,
        as after a crash."""
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
            log.warning("stopping: left the call unrecorded: %r", exc, extra={"run": run.id})

    async def _fetch(self, definition: Definition, run: store.Claimed, fetch: Fetch) -> None:
        step = definition.step(run.step)
        assert isinstance(step, WaitFor)
        product = self.products[step.connection]
        # The read after this one, if it finds no final result: the schedule counts reads.
        poll = product.config.read_schedule(run.attempt + 1, fetch.result.read_only)
        lookup = fetch.result.fetch
        try:
            async with product.limiter:
                request = build_request(lookup, {fetch.result.fetch_input: fetch.key}, None)
                request = bind(lookup, request, product.config.parameters)
                observe = partial(self.metrics.result_fetched, product.config.name, lookup.name)
                url = product.url(request.target)
                name = product.config.name
                with tracing.call(run, name, lookup.name, request.method, url) as traced:
                    reply = await product.read(request, observe, traced.headers)
                    traced.answered(reply)
            with trio.CancelScope(shield=True):
                ends = fetched(definition, run.step, reply)
                committed = None
                if ends is not None:
                    assert reply.status is not None  # only an answer ends a wait
                    read = statements.result_read(url, reply.status, fetch.key)
                    committed = await store.commit(
                        self.db, definition, run, ends, self.lease, read=read, go_on=True
                    )
                    self.after(definition, committed, attempt=run.attempt)
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

    async def _check(self, definition: Definition, run: store.Claimed, check: Check) -> None:
        """Ask for the receipt of the run's sealed call, and record what it says: the step
        completed with a confirming receipt, else asked again later or held
        (``steps.checked``), after a ``receipt-looked-up`` event saying what was asked and
        what came back."""
        step = definition.step(run.step)
        assert isinstance(step, Call)
        product = self.products[step.connection]
        operation = check.operation
        try:
            found = await store.sealed_request(self.db, run)
            if found is None:  # a run is asked about only after its call was sealed
                raise store.NothingSealed(f"{run.id} at {run.step} asked about an unsent call")
            sealed = found.request
            receipt = operation.receipt
            assert receipt is not None
            target = product.url(receipt.path)
            name = f"{operation.name} receipt"
            with tracing.call(run, product.config.name, name, receipt.method, target) as traced:
                reply, url = await product.look_up_receipt(operation, sealed, traced.headers)
                traced.answered(reply)
            with trio.CancelScope(shield=True):
                verification = product.config.verification
                now = run.now()
                transition = checked(definition, run.step, reply, run.checks, now, verification)
                looked = statements.receipt_looked_up(url, reply, run.checks)
                committed = await store.commit(
                    self.db, definition, run, transition, self.lease, read=looked, go_on=True
                )
                self.after(definition, committed, attempt=run.attempt)
        except store.LeaseLost:
            log.warning("lost the lease while asking for a receipt", extra={"run": run.id})
            return
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await store.release(self.db, run, run.now())
            raise
        finally:
            product.queued -= 1
        await self._go_on(definition, committed)

    async def _go_on(self, definition: Definition, committed: store.Committed | None) -> None:
        """Take the run's next steps now if its call or read completed its step."""
        if committed is None or not committed.held:
            return
        await self.proceed(definition, committed.run, committed.ahead)

    async def _ready(
        self,
        definition: Definition,
        run: store.Claimed,
        product: Product,
        authorization: str,
        request: Request,
        sealed: store.Sealed | None,
    ) -> Request | Prepared | Transition:
        """The request to seal or send again, as it stands once a command its descriptor
        says is prepared has been (:mod:`engine.preparation`: its first sending), or
        checked against what it was prepared under (a resend); or, when it cannot be,
        what becomes of the run, with nothing sealed or sent."""
        operation = definition.operations[run.step]
        if operation.prepare is None or (sealed is not None and sealed.prepared is None):
            return request

        async def send(read: Request) -> Reply:
            return await product.send(read, product.url(read.target), authorization)

        preparer = Preparer(
            operation, product.config.parameters, send, run.now() + backoff(run.attempt + 1)
        )
        if sealed is None:
            return await preparer.prepare(request)
        assert sealed.prepared is not None
        return await preparer.recheck(request, sealed.prepared) or request

    async def _dispatch_persistently(
        self,
        run: store.Claimed,
        request: Request,
        url: str,
        prepared: dict[str, JSON] | None = None,
        binding: JSON = None,
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
                bound = binding if isinstance(binding, dict) else None
                return await store.dispatch(self.db, run, request, url, prepared, bound)
            except Unavailable as exc:
                if self._stopping:
                    raise
                log.warning(
                    "could not seal a call's request (%s); retrying", exc, extra={"run": run.id}
                )
            outages += 1
            await trio.sleep(ANSWER_RECORDING.pause(outages))

    async def _settle_persistently(
        self, definition: Definition, run: store.Claimed, reply: Reply, uncertain: bool = False
    ) -> store.Committed | None:
        """Record a call's answer, waiting out a database outage (the lease is kept
        meanwhile): an answer in hand must not become an unknown outcome. If the database
        refuses to store it, the run is held (engine-defect), the answer's bytes kept on
        the call's execution. If the claim was lost meanwhile, the answer is kept as late
        evidence. At shutdown the wait ends, and the run is taken up later as interrupted.
        ``uncertain``: an earlier sending of the same request may have taken effect."""
        transition = self._settlement(definition, run, reply, uncertain)
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
            transition = self._settlement(definition, run, reply)
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
        self.after(definition, committed, attempt=run.attempt)
        return committed

    def _settlement(
        self, definition: Definition, run: store.Claimed, reply: Reply, uncertain: bool = False
    ) -> Transition:
        """What a call's reply leads to, with what its connection allows of asking the
        product about an unknown outcome, and (an external read) what it reviewed."""
        config = self.connection(definition, run.step).config
        return settle(
            definition,
            run.step,
            reply,
            run.attempt,
            run.now(),
            checks=run.checks,
            verification=config.verification,
            reviewed=config.external,
            uncertain=uncertain,
        )


async def read_pauses(db: Database, products: Mapping[str, Product]) -> None:
    """Mark each product paused as the database says its connection is, now."""
    paused = {pause.connection for pause in await pauses.paused(db)}
    for name, product in products.items():
        product.paused = name in paused


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
