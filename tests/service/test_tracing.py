"""Tracing: the spans of a run's steps and product calls, where they sit in which trace,
and the trace ids in the JSON logs.

The service runs in this process (``service.serve``, real PostgreSQL, real HTTP on
loopback), so its spans can go to the SDK's in-memory exporter; it is stopped as a
supervisor stops it, with SIGTERM, and its spans are read once it has flushed them.
Product calls are traced through ``tracing.call``, sending a real request to a loopback
server that keeps the headers it was sent.
"""

from __future__ import annotations

import json
import logging
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from registry_coordinator import service, store
from registry_coordinator.config import TracingConfig
from registry_coordinator.engine.workflows import load_service
from registry_coordinator.observability import tracing
from registry_coordinator.observability.logs import QUIETED, JsonLines
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import Reply, ReplyKind, Send, on_due
from registry_coordinator.store.database import sync_connection
from tests.support import (
    QUIET,
    STANDIN_TOKEN,
    Services,
    admit,
    connection,
    database,
    decide,
    free_port,
    new_review,
    reply,
    run_state,
    stand_ins,
    wait_state,
)

#: Seconds after which a test waiting for the service is failed as hung, not timed.
HANG = 60
ON = {"tracing": {"enabled": True}}

#: A choose and the finish after it: taken in one statement, so one step span and one
#: span for the step committed with it.
BRIEF = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: brief
version: "1"
deadline: PT1H
input: {type: object, required: [answer], properties: {answer: {type: string}}}
outcomes: {yes: {type: "null"}, no: {type: "null"}}
start: route
steps:
  route:
    type: choose
    cases: [{when: 'input.answer == "yes"', next: said_yes}]
    otherwise: said_no
  said_yes: {type: finish, outcome: yes}
  said_no: {type: finish, outcome: no}
"""

#: A wait-until a night long between its first step and the next.
OVERNIGHT = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: overnight
version: "1"
deadline: P2D
input: {type: object}
outcomes: {done: {type: "null"}}
start: night
steps:
  night: {type: wait-until, at: run.admitted_at + duration("12h"), next: morning}
  morning: {type: choose, cases: [{when: "false", next: done}], otherwise: done}
  done: {type: finish, outcome: done}
"""

#: A run that expires while it waits, which the engine logs (inside the step's span).
LAPSE = """\
apiVersion: coordinator.registrystack.org/v1alpha1
kind: Workflow
id: lapse
version: "1"
deadline: PT1S
input: {type: object}
outcomes: {done: {type: "null"}}
start: sleep
steps:
  sleep: {type: wait-until, at: run.admitted_at + duration("1h"), next: done}
  done: {type: finish, outcome: done}
"""

#: A record the stand-in BReg has (read-record takes UUIDs).
RECORD = "3f2a1b0c-9d8e-4f7a-8b6c-5d4e3f2a1b01"
CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN = "b7ad6b7169203331"
CALLER = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def workflow(directory: Path, source: str) -> Path:
    """The workflow ``source`` as a file in ``directory``, named for its id."""
    directory.mkdir(exist_ok=True)
    path = directory / f"{source.split('id: ', 1)[1].split(maxsplit=1)[0]}.yaml"
    path.write_text(source)
    return path


class Running:
    """A service running in this process, and its API client."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def start(self, name: str, run_input: Any, headers: dict[str, str] | None = None) -> str:
        response = await self.http.post(
            "/v1/runs",
            json={"workflow": name, "input": run_input},
            headers={"Idempotency-Key": uuid.uuid4().hex, **(headers or {})},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def wait_state(self, run: str, state: RunState) -> None:
        while (await self.http.get(f"/v1/runs/{run}")).json()["state"] != state:
            await trio.sleep(0.05)


@asynccontextmanager
async def serving(config: Path, spans: InMemorySpanExporter) -> AsyncIterator[Running]:
    """``coordinator serve`` on ``config`` in this process, its spans to ``spans``; stopped
    with SIGTERM on the way out (as a supervisor stops it), so its spans are flushed by
    the time the block has left."""
    settings, workflows = load_service(config)
    stopped = trio.Event()

    async def serve() -> None:
        try:
            await service.serve(settings, workflows, spans=spans)
        finally:
            stopped.set()

    url = f"http://127.0.0.1:{settings.port}"
    async with trio.open_nursery() as nursery, httpx.AsyncClient(base_url=url) as http:
        nursery.start_soon(serve)
        listening = False
        try:
            with trio.fail_after(HANG):
                while not listening:
                    with suppress(httpx.TransportError):
                        listening = (await http.get("/ready")).status_code == 200
                    await trio.sleep(0 if listening else 0.05)
            with trio.fail_after(HANG):
                yield Running(http)
        finally:
            if listening and not stopped.is_set():
                signal.raise_signal(signal.SIGTERM)  # the service's signal receiver takes it
            else:  # before its receiver is open, the signal would end the tests
                nursery.cancel_scope.cancel()


def steps(spans: InMemorySpanExporter, run: str) -> list[ReadableSpan]:
    """The step spans of ``run``, in the order they began."""
    return sorted(
        (
            s
            for s in spans.get_finished_spans()
            if s.name.startswith("step ") and (s.attributes or {})["coordinator.run.id"] == run
        ),
        key=lambda s: s.start_time or 0,
    )


def names(spans: list[ReadableSpan]) -> list[tuple[str, object]]:
    return [(s.name, s.attributes and s.attributes["coordinator.step.outcome"]) for s in spans]


def served(spans: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    """The server spans of the requests ``name`` (method and route), in the order they began."""
    return sorted(
        (s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER and s.name == name),
        key=lambda s: s.start_time or 0,
    )


def kept(span: ReadableSpan) -> str:
    """The traceparent of ``span``, as a run it is the root of keeps it."""
    assert span.context is not None
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"


def children(taken: list[ReadableSpan], of: ReadableSpan) -> None:
    """Every span of ``taken`` is a child of ``of``, in its trace."""
    assert of.context is not None and taken
    for span in taken:
        assert span.context is not None and span.parent is not None
        assert span.context.trace_id == of.context.trace_id
        assert span.parent.span_id == of.context.span_id


@pytest.mark.trio
async def test_a_run_started_in_a_callers_trace_continues_it(
    services: Services, tmp_path: Path
) -> None:
    """The start request's server span is a child of the caller's span (remote), and every
    step span a child of that request's span, with the step's id, type, attempt and
    outcome: the run's trace has one root below the caller's."""
    config = services.configure([workflow(tmp_path / "wf", BRIEF)], extra=ON)
    spans = InMemorySpanExporter()
    async with serving(config, spans) as running:
        run = await running.start("brief", {"answer": "no"}, {"traceparent": CALLER})
        await running.wait_state(run, RunState.FINISHED)
    (request,) = served(spans, "POST /v1/runs")
    assert request.context is not None and request.parent is not None
    assert f"{request.context.trace_id:032x}" == CALLER_TRACE
    assert f"{request.parent.span_id:016x}" == CALLER_SPAN
    assert request.parent.is_remote
    assert dict(request.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v1/runs",
        "http.response.status_code": 201,
    }
    taken = steps(spans, run)
    assert names(taken) == [("step route", "step-completed"), ("step said_no", "finished")]
    children(taken, request)
    route, said_no = (dict(s.attributes or {}) for s in taken)
    assert route == {
        "coordinator.run.id": run,
        "coordinator.workflow.id": "brief",
        "coordinator.step.id": "route",
        "coordinator.step.type": "choose",
        "coordinator.step.attempt": 0,
        "coordinator.step.outcome": "step-completed",
    }
    assert said_no["coordinator.step.type"] == "finish"
    assert said_no["coordinator.run.outcome"] == "no"
    assert run_state(services.dsn, run)["traceparent"] == kept(request)


@pytest.mark.trio
async def test_a_run_outside_any_trace_is_traced_by_its_run_id_across_a_restart(
    services: Services, tmp_path: Path
) -> None:
    """The run's start request is the root of a trace whose id is the run id; the run's
    first step is taken by one service, its next by another started after it stopped,
    and every step span is a child of that one root."""
    config = services.configure([workflow(tmp_path / "wf", OVERNIGHT)], extra=ON)
    before, after = InMemorySpanExporter(), InMemorySpanExporter()
    async with serving(config, before) as running:
        run = await running.start("overnight", {})
        await running.wait_state(run, RunState.WAITING)
    # The night passes while no service runs: the wait-until's instant is brought forward,
    # for the next service's timer to take the run on, through the steps after it.
    with sync_connection(services.dsn) as conn:
        conn.execute("UPDATE runs SET timer_at = now() WHERE id = %s", (run,))
    async with serving(config, after) as running:
        await running.wait_state(run, RunState.FINISHED)
    assert names(steps(before, run)) == [("step night", "waiting")]
    assert names(steps(after, run)) == [
        ("step night", "step-completed"),
        ("step morning", "step-completed"),
        ("step done", "finished"),
    ]
    (request,) = served(before, "POST /v1/runs")
    assert request.parent is None and request.context is not None
    assert request.context.trace_id == uuid.UUID(run).int
    children(steps(before, run) + steps(after, run), request)


@pytest.mark.trio
async def test_an_invalid_traceparent_is_ignored_and_the_run_starts(
    services: Services, tmp_path: Path
) -> None:
    """W3C Trace Context: a traceparent that is not one (or is sent twice) is ignored, never
    refused; the run is traced as one started outside any trace."""
    config = services.configure([workflow(tmp_path / "wf", BRIEF)], extra=ON)
    spans = InMemorySpanExporter()
    invalid = [
        [("traceparent", "not a traceparent")],
        [("traceparent", f"00-{'0' * 32}-{CALLER_SPAN}-01")],  # the all-zero trace id
        [("traceparent", f"00-{CALLER_TRACE}-{'0' * 16}-01")],  # the all-zero span id
        [("traceparent", f"ff-{CALLER_TRACE}-{CALLER_SPAN}-01")],  # the forbidden version
        [("traceparent", CALLER.upper())],  # hex digits are lowercase
        [("traceparent", f"{CALLER}-extra")],  # version 00 has four fields
        [("traceparent", CALLER), ("traceparent", CALLER)],  # twice
    ]
    runs = []
    async with serving(config, spans) as running:
        for headers in invalid:
            response = await running.http.post(
                "/v1/runs",
                json={"workflow": "brief", "input": {"answer": "yes"}},
                headers=httpx.Headers([("Idempotency-Key", uuid.uuid4().hex), *headers]),
            )
            assert response.status_code == 201, (headers, response.text)
            runs.append(str(response.json()["id"]))
        for run in runs:
            await running.wait_state(run, RunState.FINISHED)
    requests = served(spans, "POST /v1/runs")
    assert [r.context and r.context.trace_id for r in requests] == [uuid.UUID(r).int for r in runs]
    assert [r.parent for r in requests] == [None] * len(runs)
    for run, request in zip(runs, requests, strict=True):
        assert run_state(services.dsn, run)["traceparent"] == kept(request)
        taken = steps(spans, run)
        assert names(taken) == [("step route", "step-completed"), ("step said_yes", "finished")]
        children(taken, request)


@pytest.mark.trio
async def test_each_run_a_batch_creates_outside_a_trace_has_a_root_of_its_own(
    services: Services, tmp_path: Path
) -> None:
    """One request cannot be the root of many traces: each run the batch creates gets a
    ``run admitted`` span, the root of a trace whose id is its run id, linked to the
    batch's request span, and its steps are children of it. The same batch sent again
    creates nothing, and no span says it did."""
    config = services.configure([workflow(tmp_path / "wf", BRIEF)], extra=ON)
    spans = InMemorySpanExporter()
    prefix = uuid.uuid4().hex[:8]
    batch = {
        "starts": [
            {"key": f"{prefix}-{n}", "workflow": "brief", "input": {"answer": answer}}
            for n, answer in enumerate(["yes", "no"])
        ]
    }
    async with serving(config, spans) as running:
        first = await running.http.post("/v1/runs:batch", json=batch)
        again = await running.http.post("/v1/runs:batch", json=batch)
        assert first.status_code == again.status_code == 200, first.text
        assert [r["status"] for r in first.json()["results"]] == [201, 201]
        assert [r["status"] for r in again.json()["results"]] == [200, 200]
        runs = [str(r["run"]["id"]) for r in first.json()["results"]]
        for run in runs:
            await running.wait_state(run, RunState.FINISHED)
    requests = served(spans, "POST /v1/runs:batch")
    assert [r.parent for r in requests] == [None, None]
    roots = sorted(
        (s for s in spans.get_finished_spans() if s.name == "run admitted"),
        key=lambda s: str((s.attributes or {})["coordinator.run.id"]),
    )
    assert [(s.attributes or {})["coordinator.run.id"] for s in roots] == sorted(runs)
    for root in roots:
        run = str((root.attributes or {})["coordinator.run.id"])
        assert root.parent is None and root.context is not None
        assert root.context.trace_id == uuid.UUID(run).int
        assert [link.context for link in root.links] == [requests[0].context]
        assert (root.attributes or {})["coordinator.workflow.id"] == "brief"
        assert run_state(services.dsn, run)["traceparent"] == kept(root)
        children(steps(spans, run), root)


@pytest.mark.trio
async def test_every_api_request_and_webhook_has_a_server_span_and_probes_none(
    services: Services, tmp_path: Path
) -> None:
    """A read of a run, a webhook to a connection that takes none (refused: 404), a path
    no route matches: each a server span, in the caller's trace where it sent one, with
    its route's pattern (never its path) and status; the probes have none."""
    config = services.configure([workflow(tmp_path / "wf", BRIEF)], extra=ON)
    spans = InMemorySpanExporter()
    async with serving(config, spans) as running:
        run = await running.start("brief", {"answer": "no"})
        assert (await running.http.get(f"/v1/runs/{run}")).status_code == 200
        webhook = await running.http.post(
            "/v1/results/nowhere", json={}, headers={"traceparent": CALLER}
        )
        assert webhook.status_code == 404
        assert (await running.http.get("/nothing/here")).status_code == 404
        assert (await running.http.get("/health")).status_code == 200
        assert (await running.http.get("/metrics")).status_code == 200
    servers = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    (read,) = served(spans, "GET /v1/runs/<run_id>")
    assert dict(read.attributes or {}) == {
        "http.request.method": "GET",
        "http.route": "/v1/runs/<run_id>",
        "http.response.status_code": 200,
        "coordinator.run.id": run,
    }
    (delivered,) = served(spans, "POST /v1/results/<connection>")
    assert delivered.parent is not None and f"{delivered.parent.span_id:016x}" == CALLER_SPAN
    assert (delivered.attributes or {})["http.response.status_code"] == 404
    (unrouted,) = served(spans, "GET")
    assert dict(unrouted.attributes or {}) == {
        "http.request.method": "GET",
        "http.response.status_code": 404,
    }
    assert sorted(s.name for s in servers) == sorted(
        ["POST /v1/runs", "GET /v1/runs/<run_id>", "POST /v1/results/<connection>", "GET"]
    )


@contextmanager
def json_lines() -> Iterator[list[dict[str, Any]]]:
    """The log lines of the block, as the service writes them to journald (JsonLines)."""
    lines: list[dict[str, Any]] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(self.format(record)))

    keep = Keep()
    keep.setFormatter(JsonLines())
    root = logging.getLogger()
    quieted = [logging.getLogger(name) for name in QUIETED]
    levels = [root.level, *(each.level for each in quieted)]
    root.addHandler(keep)
    root.setLevel(logging.INFO)  # as the service logs (logs.configure)
    for each in quieted:
        each.setLevel(logging.WARNING)
    try:
        yield lines
    finally:
        root.removeHandler(keep)
        for each, level in zip([root, *quieted], levels, strict=True):
            each.setLevel(level)


@pytest.mark.trio
async def test_log_lines_inside_a_step_carry_its_trace_and_span_ids(
    services: Services, tmp_path: Path
) -> None:
    """The engine's line about a run that expired is logged in the span of the step it
    expired at: the line names that span and its trace (the caller's); the start's access
    log line names the request's span; lines outside any span name none."""
    config = services.configure([workflow(tmp_path / "wf", LAPSE)], extra=ON)
    spans = InMemorySpanExporter()
    with json_lines() as lines:
        async with serving(config, spans) as running:
            run = await running.start("lapse", {}, {"traceparent": CALLER})
            await running.wait_state(run, RunState.EXPIRED)
    expired = [line for line in lines if line["message"] == "run expired at sleep"]
    (step,) = [
        s
        for s in steps(spans, run)
        if s.attributes and s.attributes["coordinator.step.outcome"] == "expired"
    ]
    assert step.context is not None
    assert [(line["run"], line["trace_id"], line["span_id"]) for line in expired] == [
        (run, CALLER_TRACE, f"{step.context.span_id:016x}")
    ]
    (request,) = served(spans, "POST /v1/runs")
    assert request.context is not None
    started = [line for line in lines if line.get("route") == "/v1/runs"]
    assert [(line["trace_id"], line["span_id"]) for line in started] == [
        (CALLER_TRACE, f"{request.context.span_id:016x}")
    ]
    listening = [line for line in lines if line["message"].startswith("listening on")]
    assert len(listening) == 1
    assert "trace_id" not in listening[0]


@pytest.mark.trio
async def test_tracing_off_records_nothing_and_keeps_no_trace_context(
    services: Services, tmp_path: Path
) -> None:
    """Off (the default): a caller's traceparent is not kept, and no span is current
    where one would be with tracing on: the line logged inside the expiring step's span
    (test above) carries no trace id."""
    config = services.configure(
        [workflow(tmp_path / "wf", LAPSE), workflow(tmp_path / "wf", BRIEF)]
    )
    spans = InMemorySpanExporter()
    with json_lines() as lines:
        async with serving(config, spans) as running:
            finished = await running.start("brief", {"answer": "no"}, {"traceparent": CALLER})
            expired = await running.start("lapse", {}, {"traceparent": CALLER})
            await running.wait_state(finished, RunState.FINISHED)
            await running.wait_state(expired, RunState.EXPIRED)
    assert run_state(services.dsn, finished)["traceparent"] is None
    assert [line for line in lines if line["message"] == "run expired at sleep"] != []
    assert [line for line in lines if "trace_id" in line] == []


class Recorder:
    """A loopback HTTP server that answers 200 and keeps the headers of each request."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[dict[str, str]] = []

    async def serve(
        self,
        *,
        task_status: trio.TaskStatus[list[trio.SocketListener]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await trio.serve_tcp(self._answer, self.port, host="127.0.0.1", task_status=task_status)

    async def _answer(self, stream: trio.SocketStream) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += await stream.receive_some(65536)
        lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")[1:]
        self.received.append({k.lower(): v.strip() for k, v in (h.split(":", 1) for h in lines)})
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        await stream.aclose()


@pytest.mark.trio
async def test_a_product_call_is_a_child_of_its_step_and_sends_its_traceparent(
    dsn: str,
) -> None:
    """``tracing.call``: a client span, child of the step span current when it is made (in
    the service, the step that handed the run to its pool), whose context is the
    ``traceparent`` the product receives; the answer sets its status. Outside a step it
    starts from the run's origin: the caller's span, or none in the run's own trace. Off,
    it sends nothing."""
    spans = InMemorySpanExporter()
    recorder = Recorder()
    url = f"http://127.0.0.1:{recorder.port}/records/applications/{RECORD}"

    async def sent(client: httpx.AsyncClient, run: store.Claimed, answer: Reply) -> None:
        with tracing.call(run, "records", "read-record", "GET", url) as call:
            response = await client.get(url, headers=dict(call.headers))
            assert response.status_code == 200
            call.answered(answer)

    async with (
        database(dsn) as db,
        trio.open_nursery() as nursery,
        httpx.AsyncClient() as client,
    ):
        await nursery.start(recorder.serve)
        definition, _ = await admit(db, "lookup", {"recordId": RECORD})
        run = await store.claim(db, "holder:1", timedelta(seconds=30))
        assert run is not None
        send = on_due(definition, run.record(), run.step, False, None, run.now())
        assert isinstance(send, Send)
        await sent(client, run, reply(200, b"{}"))  # tracing off
        async with tracing.started(TracingConfig(enabled=True), spans):
            with tracing.step(run, definition, send):
                await sent(client, run, reply(200, b"{}"))
            await sent(client, run, reply(kind=ReplyKind.NOT_SENT))
            await sent(client, replace(run, traceparent=CALLER), reply(503))
        nursery.cancel_scope.cancel()
    off, *received = recorder.received
    assert "traceparent" not in off
    step, in_step, alone, in_caller = sorted(
        spans.get_finished_spans(), key=lambda s: s.start_time or 0
    )
    calls = [in_step, alone, in_caller]
    assert [(s.kind, s.name) for s in calls] == [(SpanKind.CLIENT, "GET records read-record")] * 3
    assert [h["traceparent"] for h in received] == [
        f"00-{s.context.trace_id:032x}-{s.context.span_id:016x}-01" for s in calls if s.context
    ]
    assert step.context is not None and in_step.parent == step.context
    assert alone.parent is None
    assert [s.context and s.context.trace_id for s in (step, in_step, alone)] == [run.id.int] * 3
    assert in_caller.parent is not None and f"{in_caller.parent.span_id:016x}" == CALLER_SPAN
    assert in_caller.context is not None and f"{in_caller.context.trace_id:032x}" == CALLER_TRACE
    statuses = [(s.attributes or {}).get("http.response.status_code") for s in calls]
    assert statuses == [200, None, 503]
    assert [s.status.status_code for s in calls] == [StatusCode.UNSET, *[StatusCode.ERROR] * 2]
    assert (alone.attributes or {})["error.type"] == "not-sent"
    assert dict(in_step.attributes or {}) == {
        "coordinator.run.id": str(run.id),
        "coordinator.workflow.id": "lookup",
        "coordinator.step.id": "read",
        "coordinator.step.attempt": 0,
        "coordinator.connection": "records",
        "coordinator.operation": "read-record",
        "http.request.method": "GET",
        "url.scheme": "http",
        "server.address": "127.0.0.1",
        "server.port": recorder.port,
        "coordinator.call.outcome": "response",
        "http.response.status_code": 200,
    }


@pytest.mark.trio
async def test_no_log_line_span_or_metric_carries_a_value_of_the_run(
    services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Canaries: a record id in a run's input (and so in its request's path), and the
    e-mail address stand-in BReg makes from it (in the step's output and the run's). The
    run reads and keeps both, its caller reads the output, and nothing the service tells
    its operators — a log line, a span's name, attributes, events or status, /metrics —
    carries either."""
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)  # the connection's bearer, by reference
    port = free_port()
    record = str(uuid.uuid4())
    email = f"applicant+{record[:8]}@example.org"
    spans = InMemorySpanExporter()
    with stand_ins(tmp_path / "standins.log", {"breg": port}):
        config = services.configure(
            ["lookup"], connections={"records": connection("breg", port)}, extra=ON
        )
        with json_lines() as lines:
            async with serving(config, spans) as running:
                run = await running.start("lookup", {"recordId": record})
                await running.wait_state(run, RunState.FINISHED)
                answered = (await running.http.get(f"/v1/runs/{run}")).json()
                exposed = (await running.http.get("/metrics")).text
    assert answered["output"] == {"email": email}
    finished = spans.get_finished_spans()
    assert [s for s in steps(spans, run) if s.name == "step read"] != []
    told = {
        "logs": json.dumps(lines),
        "spans": json.dumps(
            [
                [
                    s.name,
                    dict(s.attributes or {}),
                    [(e.name, dict(e.attributes or {})) for e in s.events],
                    s.status.description,
                ]
                for s in finished
            ]
        ),
        "metrics": exposed,
    }
    assert run in told["logs"] and run in told["spans"]  # ids are told; values are not
    for what, text in told.items():
        assert record not in text and email not in text, what


@pytest.mark.parametrize("enabled", [True, False])
def test_the_engines_calls_and_reads_send_the_runs_trace_to_the_products(
    dsn: str, services: Services, enabled: bool
) -> None:
    """Through the engine's own path (a worker hands the run to its connection's pool, whose
    task sends it): a call's request and a result read both carry a traceparent in the
    run's trace (its run id, started outside any trace), each with a span id of its own.
    Off, no request carries one."""
    service, products = services.deploy(
        ["lookup", "await-review"],
        {"records": ("breg", {}), "reviews": ("casework", {**QUIET, "resultPoll": "PT1S"})},
        extra={"tracing": {"enabled": enabled}},
    )
    looked_up = service.start_run("lookup", {"recordId": RECORD})
    review = new_review(products)
    decide(products, review)  # decided already: the wait's first poll reads the result
    awaited = service.start_run("await-review", {"requestId": review})
    wait_state(dsn, looked_up, RunState.FINISHED)
    wait_state(dsn, awaited, RunState.FINISHED)

    sent = [
        *products.requests("breg", "GET", "/"),
        *products.requests("casework", "GET", f"/v1/review-requests/{review}/result"),
    ]
    assert len(sent) == 2, sent
    parents = [r["traceparent"] for r in sent]
    if not enabled:
        assert parents == [None, None]
        return
    runs = [uuid.UUID(looked_up).hex, uuid.UUID(awaited).hex]
    assert [p.split("-")[1] for p in parents] == runs
    span_ids = {p.split("-")[2] for p in parents}
    assert len(span_ids) == 2 and "0" * 16 not in span_ids
