"""Tracing with OpenTelemetry: a span for each step a run takes and each product call, the
W3C trace context taken from API callers and sent to products.

A run lives for weeks and is taken up by whichever process claims it next, so it cannot
have one span open for its life, and no process remembers it between steps. Every span
of a run is placed from what the run itself carries:

- the request that starts a run has a server span (:func:`serving`), and the run keeps
  that span's context (``runs.traceparent``, schema 11): each of its step spans, whichever
  process makes it and however much later, is a child of the request that started it,
  so a run's trace has one root;
- started inside a caller's trace (a valid ``traceparent``), that request span is a child
  of the caller's span, in the caller's trace;
- started outside any trace, its trace id *is* its run id (the UUID's 128 bits, the same
  32 hex digits without the dashes): the run's id is chosen before its request's span,
  and an operator holding a run id holds its trace id. A batch start outside any trace
  cannot be the root of each run's own trace, so each run it creates gets a span of its
  own (``run admitted``, linked to the batch's request span) as that root;
- a run with no context kept (started with tracing off, or before schema 11) is traced
  by its run id, each of its step spans a root.

Every API request and webhook gets a server span (not the probes machines ask every few
seconds, nor the console's static files: those the access log leaves out too), made as
it is answered with its start at the request's arrival: made then, its ids can be chosen
first and kept by the runs it starts before it exists, and no span is left open should
the request never be answered. The access log line is written inside it.

A product call or result read is a child of the step span that handed it to its pool
(the call task inherits the step's context), and sends its own context to the product
as ``traceparent``. Steps committed in the same statement after the first (a choose and
the finish after it) get a span each, at the instant of the commit.

Off (the default), nothing here costs anything measurable: no SDK provider exists, the
functions the hot path calls test one attribute and hand back shared objects that do
nothing (no span, no allocation), and a request's ``traceparent`` is not even read. On
without an endpoint, spans are made and not sent: the JSON logs carry their ids, and
products receive the context. With an endpoint, a batch processor sends them
over OTLP/HTTP (the ``otlp`` extra, imported only then) from the SDK's own thread; the
service flushes it when it stops, within :data:`FLUSH_SECONDS`.

One service runs in a process, so the tracer is this module's (:func:`started` sets it
for the service's life); the logs, the engine and the HTTP layer reach it without being
handed anything.
"""

from __future__ import annotations

import importlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar, Token
from types import MappingProxyType, TracebackType
from typing import Protocol, Self, assert_never
from urllib.parse import urlsplit

import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from registry_coordinator import __version__
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.workflow import step_type
from registry_coordinator.config import TracingConfig
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.semantics.steps import (
    Advance,
    Await,
    Check,
    Expire,
    Failed,
    Fetch,
    Finished,
    Held,
    Reply,
    ReplyKind,
    Retry,
    Send,
    Sleep,
    Transition,
    Verify,
)
from registry_coordinator.store.claims import CancelledInFlight, Claimed, Committed

log = logging.getLogger(__name__)

#: Seconds a stopping service waits for the spans not yet sent; the rest are dropped.
FLUSH_SECONDS = 5.0
#: Where an OTLP/HTTP collector takes spans, when the endpoint names no path.
TRACES_PATH = "/v1/traces"
OTLP_EXPORTER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"

_PROPAGATOR = TraceContextTextMapPropagator()
#: The trace id a span about to start takes if it has no parent: its run's id.
_RUN_TRACE: ContextVar[int] = ContextVar("coordinator_run_trace", default=0)
#: The span id a span about to start takes when it was chosen before (0: a new one).
_SPAN_ID: ContextVar[int] = ContextVar("coordinator_span_id", default=0)
#: No headers: what a request carries with tracing off (a default for senders).
NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class TracingUnavailable(CoordinatorError):
    """Spans are to be sent, and the exporter that sends them is not installed."""

    exit_code = ExitCode.INVALID


class _Active:
    """The tracer of the service running in this process with tracing on; None when off."""

    tracer: Tracer | None = None


class _RunTraceIds(RandomIdGenerator):
    """Random ids, except the trace id of a span with no parent (its run's id) and a span
    id chosen before its span (one a run keeps before its request's span is made)."""

    def generate_span_id(self) -> int:
        return _SPAN_ID.get() or super().generate_span_id()

    def generate_trace_id(self) -> int:
        return _RUN_TRACE.get() or super().generate_trace_id()

    def is_trace_id_random(self) -> bool:
        # A run id is not promised random in the W3C sense (level 2's random flag).
        return not _RUN_TRACE.get()


@asynccontextmanager
async def started(
    config: TracingConfig, exporter: SpanExporter | None = None
) -> AsyncIterator[None]:
    """Tracing as configured, for as long as the block runs (the service's life): on
    leaving, the spans not yet sent are flushed, within :data:`FLUSH_SECONDS` even when
    the block was cancelled. ``exporter`` takes the spans instead of the configured
    endpoint (the tests' in-memory one); with tracing off it is not used.

    Raises :class:`TracingUnavailable` at once if the endpoint's exporter is missing."""
    if not config.enabled:
        yield
        return
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": config.service_name, "service.version": __version__}
        ),
        id_generator=_RunTraceIds(),
        shutdown_on_exit=False,  # flushed here, in the nursery's teardown, not at exit
    )
    if exporter is None and config.otlp_endpoint is not None:
        exporter = _otlp(config.otlp_endpoint)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    _Active.tracer = provider.get_tracer("registry_coordinator", __version__)
    try:
        yield
    finally:
        _Active.tracer = None
        with trio.move_on_after(FLUSH_SECONDS, shield=True) as waited:
            # The processor's thread sends what is queued; a collector that does not
            # answer is left behind (its thread is a daemon) rather than stop the stop.
            await trio.to_thread.run_sync(provider.shutdown, abandon_on_cancel=True)
        if waited.cancelled_caught:
            log.warning("stopping: spans not sent within %s s were dropped", FLUSH_SECONDS)


def _otlp(endpoint: str) -> SpanExporter:
    """The OTLP/HTTP exporter to ``endpoint`` (a collector's base URL gets the traces
    path), imported only now: it is an optional extra."""
    try:
        module = importlib.import_module(OTLP_EXPORTER)
    except ImportError as exc:
        raise TracingUnavailable(
            f"tracing.otlpEndpoint needs the OTLP exporter, which is not installed "
            f"(no module {exc.name}): pip install 'registry-coordinator[otlp]', or remove "
            "otlpEndpoint to make spans without sending them"
        ) from None
    if urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + TRACES_PATH
    made: SpanExporter = module.OTLPSpanExporter(endpoint=endpoint, timeout=FLUSH_SECONDS)
    return made


class _Headers(Protocol):
    def getlist(self, key: str) -> list[str]: ...


def _callers(headers: _Headers) -> Context | None:
    """The trace context a request was sent in; None when there is none, or when it is not
    one: W3C Trace Context has an invalid or repeated ``traceparent`` ignored (the
    request is then a trace of its own), never refused."""
    values = headers.getlist("traceparent")
    if len(values) != 1:
        return None
    context = _PROPAGATOR.extract({"traceparent": values[0]})
    parent = trace.get_current_span(context).get_span_context()
    return context if parent.is_valid else None


class Serving:
    """The server span of one API request or webhook (:func:`serving`). This base class is
    tracing off: shared by every request, it does nothing and keeps no context."""

    __slots__ = ()

    def start(self, run: uuid.UUID) -> str | None:
        """The trace context the run this request starts keeps (``run`` its id, chosen
        before): the request's span, in the caller's trace or in the run's own."""
        return None

    def starts(self, runs: Sequence[uuid.UUID]) -> list[str | None]:
        """The trace context each run this batch starts keeps, as :meth:`start` for one;
        outside a caller's trace, each run's own ``run admitted`` span."""
        return [None] * len(runs)

    def admitted(self, run: uuid.UUID, workflow: str) -> None:
        """Say that the batch created the run with this id (a start found, not created,
        has no span of its own)."""

    def answered(self, status: int, run: str | None) -> _Block:
        """Make the request's span, answered with ``status`` (about ``run``, if one), and
        end it when the block is left: the block's log lines carry its ids."""
        return _NO_BLOCK


#: The request span of tracing off (a default for the functions that take one).
NO_SERVING = Serving()


class _TracedServing(Serving):
    __slots__ = ("_at", "_attributes", "_caller", "_chosen", "_name", "_parent", "_runs", "_tracer")

    def __init__(self, tracer: Tracer, method: str, route: str | None, headers: _Headers) -> None:
        self._tracer = tracer
        self._at = time.time_ns()
        self._name = f"{method} {route}" if route is not None else method
        self._attributes: dict[str, str | int] = {"http.request.method": method}
        if route is not None:
            self._attributes["http.route"] = route
        self._caller = _callers(headers)
        self._parent = None
        if self._caller is not None:
            self._parent = trace.get_current_span(self._caller).get_span_context()
        # The request span's ids once chosen: its trace id should it have no parent (0:
        # a new one), its span id (0: a new one).
        self._chosen = (0, 0)
        self._runs: dict[uuid.UUID, tuple[int, str | None]] = {}  # run admitted: span, workflow

    def _context(self, trace_id: int, span_id: int) -> str:
        flags = trace.TraceFlags.SAMPLED if self._parent is None else self._parent.trace_flags
        if self._parent is not None:
            trace_id = self._parent.trace_id
        return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"

    def _own(self, trace_id: int) -> str:
        """The request span's context, its ids chosen now if not yet (its trace
        ``trace_id``, unless it is in the caller's)."""
        if self._chosen == (0, 0):
            self._chosen = (trace_id, _ID_GENERATOR.generate_span_id())
        return self._context(*self._chosen)

    def start(self, run: uuid.UUID) -> str | None:
        return self._own(run.int)

    def starts(self, runs: Sequence[uuid.UUID]) -> list[str | None]:
        if self._parent is not None:
            return [self._own(0)] * len(runs)
        self._own(_ID_GENERATOR.generate_trace_id())
        kept: list[str | None] = []
        for run in runs:
            span = _ID_GENERATOR.generate_span_id()
            self._runs[run] = (span, None)
            kept.append(self._context(run.int, span))
        return kept

    def admitted(self, run: uuid.UUID, workflow: str) -> None:
        if run in self._runs:
            self._runs[run] = (self._runs[run][0], workflow)

    def answered(self, status: int, run: str | None) -> _Block:
        attributes = self._attributes | {"http.response.status_code": status}
        if run is not None:
            attributes["coordinator.run.id"] = run
        span = _chosen(
            self._tracer,
            self._name,
            self._caller or Context(),
            self._chosen,
            attributes,
            SpanKind.SERVER,
            self._at,
        )
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR, f"{status}"))
            span.set_attribute("error.type", f"{status}")
        request = (trace.Link(span.get_span_context()),)
        for made, (chosen, workflow) in self._runs.items():
            if workflow is None:
                continue  # found, not created: the run has a root already
            root = _chosen(
                self._tracer,
                "run admitted",
                Context(),
                (made.int, chosen),
                {"coordinator.run.id": str(made), "coordinator.workflow.id": workflow},
                SpanKind.INTERNAL,
                self._at,
                request,
            )
            root.end()
        return _Current(span)


_ID_GENERATOR = RandomIdGenerator()


def _chosen(
    tracer: Tracer,
    name: str,
    context: Context,
    ids: tuple[int, int],
    attributes: dict[str, str | int],
    kind: SpanKind,
    at: int,
    links: Sequence[trace.Link] = (),
) -> Span:
    """A span whose ids were chosen before it (0: not chosen): the trace id where it has
    no parent, and its span id."""
    trace_id, span_id = ids
    chosen = _RUN_TRACE.set(trace_id), _SPAN_ID.set(span_id)
    try:
        return tracer.start_span(name, context, kind, attributes, links, start_time=at)
    finally:
        _RUN_TRACE.reset(chosen[0])
        _SPAN_ID.reset(chosen[1])


def serving(method: str, route: str | None, headers: _Headers) -> Serving:
    """The server span of a request that has just arrived (``route`` its pattern; None if
    it matched none), made when it is answered; with tracing off, one that does nothing."""
    tracer = _Active.tracer
    if tracer is None:
        return NO_SERVING
    return _TracedServing(tracer, method, route, headers)


def _origin(run: Claimed) -> tuple[Context, int]:
    """The context a run's spans start from (its caller's span, or none), and their trace."""
    if run.traceparent is not None:
        context = _PROPAGATOR.extract({"traceparent": run.traceparent})
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            return context, parent.trace_id
    return Context(), run.id.int


def _start(
    tracer: Tracer,
    name: str,
    run: Claimed,
    attributes: dict[str, str | int],
    *,
    context: Context | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    at: int | None = None,
) -> Span:
    if context is None:
        context, _ = _origin(run)
    chosen = _RUN_TRACE.set(run.id.int)  # the trace id, should the span have no parent
    try:
        return tracer.start_span(name, context, kind, attributes, start_time=at)
    finally:
        _RUN_TRACE.reset(chosen)


def _step_attributes(
    run: Claimed, step: str, definition: Definition | None, attempt: int
) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "coordinator.run.id": str(run.id),
        "coordinator.workflow.id": run.workflow_id,
        "coordinator.step.id": step,
        "coordinator.step.attempt": attempt,
    }
    if definition is not None:  # None: the run's definition could not be loaded
        attributes["coordinator.step.type"] = step_type(definition.step(step))
    return attributes


def _outcome(transition: Transition | CancelledInFlight) -> str:
    """A step's outcome in the words of the run's history (its event kinds), or the
    hand-off to a pool: ``call``, ``result-read``."""
    match transition:
        case Advance():
            return "step-completed"
        case Finished():
            return "finished"
        case Failed():
            return "failed"
        case Held():
            return "held"
        case Expire():
            return "expired"
        case Sleep() | Await():
            return "waiting"
        case Retry():
            return "retry-scheduled"
        case Verify():
            return "verify-scheduled"
        case Check():
            return "receipt-lookup"
        case CancelledInFlight():
            return "cancelled"
        case Send():
            return "call"
        case Fetch():
            return "result-read"
        case _:
            assert_never(transition)


def _describe(span: Span, transition: Transition | CancelledInFlight) -> None:
    """Set a step span's outcome; a failure, a hold or an expiry is an error status, so a
    trace viewer shows where runs stopped."""
    span.set_attribute("coordinator.step.outcome", _outcome(transition))
    match transition:
        case Failed(code=code, detail=detail) | Held(code=code, detail=detail):
            span.set_attribute("coordinator.step.code", code.value)
            span.set_status(Status(StatusCode.ERROR, detail))
        case Expire():
            span.set_status(Status(StatusCode.ERROR, "the run's deadline passed"))
        case Finished(outcome=finished):
            span.set_attribute("coordinator.run.outcome", finished)
        case _:
            pass


def _taken(
    tracer: Tracer,
    definition: Definition | None,
    run: Claimed,
    taken: Sequence[tuple[str, Transition | CancelledInFlight]],
    first_attempt: int = 0,
) -> None:
    """A span for each of these steps, committed in one statement: they took no time of
    their own, so each begins and ends at the instant the statement came back. The steps
    after the first are taken at their first attempt; the first at ``first_attempt``."""
    now = time.time_ns()
    for n, (step, transition) in enumerate(taken):
        attempt = first_attempt if n == 0 else 0
        attributes = _step_attributes(run, step, definition, attempt)
        span = _start(tracer, f"step {step}", run, attributes, at=now)
        _describe(span, transition)
        span.end(end_time=now)


class _Block:
    """A context manager that does nothing: tracing off, shared by every step and call."""

    __slots__ = ()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None


class StepSpan(_Block):
    """The span of one step a run takes in the engine's step loop: from its decision,
    through its commit or its hand-off to a pool, the current span meanwhile (so log lines
    carry its ids, and a call task started inside inherits it). This base class is
    tracing off: shared by every step, it does nothing."""

    __slots__ = ()

    def outcome(self, outcome: str) -> None:
        """Say how the step ended when it committed nothing (``queue-full``, ``lease-lost``)."""

    def committed(self, committed: Committed) -> None:
        """Say how the step ended as its statement committed it, and give the steps the
        same statement took after it their spans."""


_NO_STEP = StepSpan()
_NO_BLOCK = _Block()


class _Current(_Block):
    """A span that is the current one while its block runs (log lines carry its ids,
    tasks started inside inherit it), and ends when the block is left."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> Self:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._token is not None
        otel_context.detach(self._token)
        _ended(self._span, error)


class _TracedStep(_Current, StepSpan):
    __slots__ = ("_definition", "_run", "_tracer")

    def __init__(
        self, tracer: Tracer, run: Claimed, definition: Definition | None, transition: Transition
    ) -> None:
        self._tracer = tracer
        self._run = run
        self._definition = definition
        attributes = _step_attributes(run, run.step, definition, run.attempt)
        super().__init__(_start(tracer, f"step {run.step}", run, attributes))
        _describe(self._span, transition)

    def outcome(self, outcome: str) -> None:
        self._span.set_attribute("coordinator.step.outcome", outcome)

    def committed(self, committed: Committed) -> None:
        (_, first), *after = committed.taken
        _describe(self._span, first)
        _taken(self._tracer, self._definition, committed.run, after)


def _ended(span: Span, error: BaseException | None) -> None:
    """End a span, recording the exception that left it: a cancellation (the service
    stopping) interrupts it; anything else is an error."""
    if isinstance(error, trio.Cancelled):
        span.set_attribute("coordinator.interrupted", True)
    elif isinstance(error, Exception):
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.end()


def step(run: Claimed, definition: Definition | None, transition: Transition) -> StepSpan:
    """The span of the step ``run`` is at, which ``transition`` was decided for (None: the
    definition could not be loaded); use it as a context manager."""
    tracer = _Active.tracer
    if tracer is None:
        return _NO_STEP
    return _TracedStep(tracer, run, definition, transition)


def committed(definition: Definition, committed: Committed, attempt: int) -> None:
    """Spans for the steps a statement committed outside the step loop: a call's answer
    recorded (the call step's outcome, at the ``attempt`` it was sent at, and the steps
    taken after it), a result read."""
    tracer = _Active.tracer
    if tracer is not None:
        _taken(tracer, definition, committed.run, committed.taken, attempt)


class CallSpan(_Block):
    """The span of one request to a product (a call, a result read). :attr:`headers` are
    to be sent with it: its ``traceparent`` (and ``tracestate``), so the product's own
    spans join the run's trace. This base class is tracing off: no headers, no span."""

    __slots__ = ()

    @property
    def headers(self) -> Mapping[str, str]:
        return NO_HEADERS

    def answered(self, reply: Reply) -> None:
        """Record what came back: the HTTP status, or why there was none."""


_NO_CALL = CallSpan()


class _TracedCall(_Current, CallSpan):
    __slots__ = ("_headers",)

    def __init__(self, span: Span) -> None:
        super().__init__(span)
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
        self._headers: Mapping[str, str] = MappingProxyType(carrier)

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers

    def answered(self, reply: Reply) -> None:
        span = self._span
        span.set_attribute("coordinator.call.outcome", reply.kind.value)
        if reply.kind is ReplyKind.RESPONSE and reply.status is not None:
            span.set_attribute("http.response.status_code", reply.status)
            if reply.status >= 400:
                span.set_status(Status(StatusCode.ERROR, f"{reply.status}"))
        else:
            span.set_attribute("error.type", reply.kind.value)
            span.set_status(Status(StatusCode.ERROR, reply.detail or reply.kind.value))


def _server(url: str) -> dict[str, str | int]:
    """Where a request went, without its path or query: ``url.full`` would carry a record's
    id, which can be a person's (a national id in a path), to every collector."""
    parts = urlsplit(url)
    return {
        "url.scheme": parts.scheme,
        "server.address": parts.hostname or "",
        "server.port": parts.port or (443 if parts.scheme == "https" else 80),
    }


def call(run: Claimed, connection: str, operation: str, method: str, url: str) -> CallSpan:
    """The span of a request about to be sent to a product for ``run`` (a client span);
    use it as a context manager around the sending. Its parent is the current span if
    that is one of the run's (the step that handed the run to its pool), otherwise the
    run's origin, as for its steps."""
    tracer = _Active.tracer
    if tracer is None:
        return _NO_CALL
    current = trace.get_current_span()
    _, trace_id = _origin(run)
    context = None
    if current.get_span_context().trace_id == trace_id:
        context = otel_context.get_current()
    attributes = _step_attributes(run, run.step, None, run.attempt) | {
        "coordinator.connection": connection,
        "coordinator.operation": operation,
        "http.request.method": method,
        **_server(url),
    }
    span = _start(
        tracer,
        f"{method} {connection} {operation}",
        run,
        attributes,
        context=context,
        kind=SpanKind.CLIENT,
    )
    return _TracedCall(span)
