"""The HTTP front end (quart-trio): JSON in, JSON out, RFC 9457 problems for every error.

Every error a caller can cause is answered with ``application/problem+json``
carrying a stable ``code`` and a ``detail`` that says what to change; nothing a
caller sends produces a 5xx or a stack trace. What the caller cannot change — the
database down, this process shutting down — is 503 with ``Retry-After`` and one log
line. JSON routes take only JSON media types (415 otherwise). The routes are those of
``openapi.yaml``, which ``/openapi.json`` serves and the API fuzzer checks.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources

import trio
import yaml
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from registry_coordinator.authoring.canonical import JSON, UnusableJson, storable, strict_json
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.authoring.expressions import format_instant, parse_instant
from registry_coordinator.engine import store
from registry_coordinator.engine.calls import Product
from registry_coordinator.engine.database import Database, Row, Unavailable
from registry_coordinator.engine.listener import Listener
from registry_coordinator.engine.metrics import CONTENT_TYPE, Metrics
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http import admission, operations
from registry_coordinator.http.auth import Authenticator, Caller
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, verify
from registry_coordinator.semantics.codes import TERMINAL

log = logging.getLogger(__name__)

PROBLEM_TYPE = "https://registrystack.org/problems/coordinator/"
STATES = ("running", "waiting", "held", *TERMINAL)
#: Seconds a client is asked to wait before trying again a request refused with 503: about
#: what the service needs to reconnect to a database that is back, or to restart.
RETRY_AFTER = 5
_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Unprocessable input",
    500: "Internal error",
    502: "Product unavailable",
    503: "Service unavailable",
}


@dataclass
class Context:
    """What the handlers work with; built by the service before it serves."""

    db: Database
    workflows: Workflows
    timer: Timer
    products: dict[str, Product]
    listener: Listener
    auth: Authenticator
    metrics: Metrics
    stopping: trio.Event = field(default_factory=trio.Event)  # set when shutdown begins


def problem(status: int, code: str, detail: str, **extra: JSON) -> Response:
    body = {
        "type": PROBLEM_TYPE + code,
        "title": _TITLES.get(status, "Request refused"),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    response = Response(json.dumps(body), status=status, content_type="application/problem+json")
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="registry-coordinator"'
    if status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


def _json(body: JSON, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body), status=status, content_type="application/json", headers=headers or {}
    )


def _instant(value: datetime | None) -> str | None:
    return format_instant(value) if value is not None else None


def run_status(row: Row) -> JSON:
    """A run's status as the API shows it."""
    return {
        "id": str(row["id"]),
        "workflow": {"id": row["workflow_id"], "version": row["version"], "digest": row["digest"]},
        "caller": row["caller"],
        "state": row["state"],
        "step": row["step"],
        "outcome": row["outcome"],
        "output": row["output"],
        "failure": {"code": row["failure_code"], "detail": row["detail"]}
        if row["failure_code"]
        else None,
        "hold": _hold(row) if row["hold_code"] else None,
        "admittedAt": _instant(row["admitted_at"]),
        "deadlineAt": _instant(row["deadline_at"]),
        "updatedAt": _instant(row["updated_at"]),
        "endedAt": _instant(row["ended_at"]),
    }


def _hold(row: Row) -> JSON:
    """Why a run is held, and the product's answer if one came back after its claim on
    the run was lost (the evidence ``reconcile`` uses)."""
    hold: JSON = {"code": row["hold_code"], "detail": row["detail"]}
    if row["late_status"] is not None:
        hold["lateAnswer"] = {
            "attempt": row["late_attempt"],
            "status": row["late_status"],
            "at": _instant(row["late_at"]),
        }
    return hold


def openapi_document() -> JSON:
    text = resources.files(__package__).joinpath("openapi.yaml").read_text("utf-8")
    return yaml.safe_load(text)


def _run_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        raise Problem(404, "run.not-found", f"no run {text} that you may see") from None


#: The problem code of a request body :func:`strict_json` refuses, by its reason.
_UNUSABLE_BODY = {
    "not-json": "request.malformed-json",
    "too-deep": "request.too-deep",
    "unstorable": "request.unstorable-text",
}


def _require_json(raw: bytes) -> None:
    """JSON routes take ``application/json`` or a ``+json`` type (RFC 6839), in UTF-8 if a
    charset is named; a request with neither body nor type has nothing to judge."""
    if not raw and not request.content_type:
        return
    media = request.mimetype
    charset = request.mimetype_params.get("charset", "utf-8").lower()
    kind, _, subtype = media.partition("/")
    if (
        kind != "application"
        or not (subtype == "json" or subtype.endswith("+json"))
        or charset not in ("utf-8", "utf8")
    ):
        raise Problem(
            415,
            "request.unsupported-media-type",
            f"the body is sent as {request.content_type or 'no Content-Type'}: send JSON "
            "with Content-Type: application/json (curl: --json)",
        )


def _cursor(text: str | None) -> tuple[datetime, uuid.UUID]:
    """A page cursor: the (admitted_at, id) of the last run on the previous page."""
    if text is None:
        return parse_instant("9999-12-31T00:00:00Z"), uuid.UUID(int=(1 << 128) - 1)
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(text.encode() + b"=="))
        return parse_instant(at), uuid.UUID(run_id)
    except (ValueError, TypeError, AttributeError, OverflowError, UnicodeDecodeError):
        raise Problem(
            400,
            "request.invalid-cursor",
            "the cursor is not one this API returned; start again without it",
        ) from None


def _next_cursor(row: Row) -> str:
    raw = json.dumps([format_instant(row["admitted_at"]), str(row["id"])]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def create_app(context: Context, body_limit: int) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = body_limit
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    spec = openapi_document()

    @app.before_request
    async def read_the_body() -> None:
        """Read the whole body before answering, even with a refusal: an answer sent while
        the client is still sending the body leaves the connection unable to carry the
        client's next request (hypercorn never reads it, and the client waits)."""
        await request.get_data(as_text=False)

    @app.errorhandler(Problem)
    async def refused(error: Problem) -> Response:
        return problem(error.status, error.code, error.detail, **error.extra)

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {
            404: "route.not-found",
            405: "route.method-not-allowed",
            413: "request.too-large",
            500: "service.internal-error",
        }.get(status, "request.invalid")
        detail = {
            413: f"the body is larger than {body_limit} bytes",
            500: "the service failed to answer (a defect, logged with its cause); "
            "what the request changed, if anything, is in the run's history",
        }.get(status, error.description or "the request was refused")
        response = problem(status, code, detail)
        if status == 413:
            # The rest of the body is left unread: the connection cannot carry another
            # request, so tell the client to open a new one.
            response.headers["Connection"] = "close"
        return response

    @app.errorhandler(Unavailable)
    async def database_unavailable(error: Unavailable) -> Response:
        """An outage is not the caller's mistake nor a defect: one line in the log, and
        503 with Retry-After. A statement that committed before its answer was lost is
        found again by the same request (a start, by its Idempotency-Key)."""
        log.warning(
            "answered %s %s with 503: the database is unavailable: %s",
            request.method,
            request.path,
            error,
        )
        return problem(
            503,
            "service.unavailable",
            f"the database cannot be reached: send the same request again in {RETRY_AFTER} s "
            "(a start with the same Idempotency-Key)",
        )

    async def caller() -> Caller:
        return await context.auth.authenticate(request.headers.get("Authorization"))

    async def body_json() -> JSON:
        raw = await request.get_data(as_text=False)
        assert isinstance(raw, bytes)
        _require_json(raw)
        try:
            return strict_json(raw) if raw else {}
        except UnusableJson as exc:
            raise Problem(400, _UNUSABLE_BODY[exc.reason], f"the body is refused: {exc}") from None

    async def visible_run(who: Caller, run_id: str, action: str) -> Row:
        """A run the caller may see (its own, or any for an operator) and may take ``action``
        on: its token's policies must cover the run's workflow, as they did its start."""
        who.require(action)
        row = await store.status(context.db, _run_id(run_id))
        if row is None or not (who.operator or row["caller"] == who.client):
            raise Problem(404, "run.not-found", f"no run {run_id} that you may see")
        who.require(action, row["workflow_id"])
        return row

    @app.post("/v1/runs")
    async def start_run() -> Response:
        who = await caller()
        body = await body_json()
        if context.stopping.is_set():
            raise Problem(
                503,
                "service.stopping",
                f"this process is shutting down: send the same start again in {RETRY_AFTER} s, "
                "to it once restarted or to another process",
            )
        started = await admission.start(
            context.db,
            context.workflows,
            context.timer,
            who,
            request.headers.get("Idempotency-Key"),
            body,
        )
        row = await store.status(context.db, uuid.UUID(started.run_id))
        assert row is not None
        if started.created:
            context.metrics.runs_started.labels(row["workflow_id"]).inc()
        status = 201 if started.created else 200
        return _json(run_status(row), status, {"Location": f"/v1/runs/{started.run_id}"})

    @app.get("/v1/runs")
    async def list_runs() -> Response:
        who = await caller()
        who.require("read")
        state, workflow = request.args.get("state"), request.args.get("workflow")
        if not storable(workflow):
            raise Problem(
                400, "request.invalid-filter", "workflow holds text that cannot be stored"
            )
        if state is not None and state not in STATES:
            raise Problem(
                400, "request.invalid-filter", f"state must be one of {', '.join(STATES)}"
            )
        try:
            limit = int(request.args.get("limit", "50"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise Problem(400, "request.invalid-filter", "limit must be a number from 1 to 100")
        rows = await store.runs_page(
            context.db,
            store.RunFilter(
                caller=None if who.operator else who.client,
                readable=who.workflows_for("read"),
                state=state,
                workflow=workflow,
            ),
            _cursor(request.args.get("cursor")),
            limit + 1,
        )
        page = rows[:limit]
        more = len(rows) > limit
        return _json(
            {
                "runs": [run_status(r) for r in page],
                "next": _next_cursor(page[-1]) if more else None,
            }
        )

    @app.get("/v1/runs/<run_id>")
    async def get_run(run_id: str) -> Response:
        who = await caller()
        return _json(run_status(await visible_run(who, run_id, "read")))

    @app.get("/v1/runs/<run_id>/history")
    async def get_history(run_id: str) -> Response:
        who = await caller()
        row = await visible_run(who, run_id, "read")
        events = await store.history(context.db, row["id"])
        return _json(
            {
                "run": str(row["id"]),
                "events": [
                    {
                        "seq": e["seq"],
                        "at": format_instant(e["at"]),
                        "kind": e["kind"],
                        "step": e["step"],
                        "actor": e["actor"],
                        "detail": e["detail"],
                    }
                    for e in events
                ],
            }
        )

    @app.post("/v1/runs/<run_id>/<action>")
    async def run_action(run_id: str, action: str) -> Response:
        if action not in ("cancel", "retry-same", "reconcile"):
            raise Problem(404, "route.not-found", f"no run action {action}")
        who = await caller()
        if action != "cancel":
            who.require_operator()
        row = await visible_run(who, run_id, "cancel" if action == "cancel" else "read")
        reason = operations.require_reason(await body_json())
        status = 200
        if action == "cancel":
            if not await operations.cancel(context.db, row["id"], who.client, reason):
                status = 202
            else:
                context.metrics.runs_ended.labels(row["workflow_id"], "cancelled", "").inc()
        elif action == "retry-same":
            await operations.retry_same(context.db, context.timer, row["id"], who.client, reason)
        else:
            await operations.reconcile(
                context.db,
                context.workflows,
                context.products,
                context.timer,
                row["id"],
                who.client,
                reason,
            )
        after = await store.status(context.db, row["id"])
        assert after is not None
        return _json(run_status(after), status)

    @app.post("/v1/admission/<change>")
    async def admission_change(change: str) -> Response:
        if change not in ("hold", "release"):
            raise Problem(404, "route.not-found", f"no admission action {change}")
        who = await caller()
        who.require_operator()
        reason = operations.require_reason(await body_json())
        await operations.set_admission(context.db, change == "hold", who.client, reason)
        return _json({"held": change == "hold", "reason": reason, "actor": who.client})

    @app.get("/v1/workflows")
    async def pinned_workflows() -> Response:
        await caller()
        return _json(
            {
                "workflows": [
                    {
                        "id": p.definition.id,
                        "version": p.definition.version,
                        "digest": p.digest,
                        "title": p.definition.workflow.title,
                    }
                    for p in context.workflows.pinned
                ]
            }
        )

    @app.post("/v1/results/<connection>")
    async def deliver_result(connection: str) -> Response:
        product = context.products.get(connection)
        if product is None or product.config.webhook_secret is None:
            raise Problem(
                404,
                "connection.unknown",
                f"no connection {connection} that accepts result webhooks",
            )
        raw = await request.get_data(as_text=False)
        assert isinstance(raw, bytes)
        try:
            verify(
                product.config.webhook_secret,
                request.headers.get(SIGNATURE_HEADER),
                connection,
                raw,
                time.time(),
            )
        except Problem as refused:
            context.metrics.deliveries.labels(connection, refused.code).inc()
            raise
        body = await body_json()
        results = builtin_catalog().products[product.config.product].results
        _check_delivery(body, sorted(results))
        new, woken = await store.record_delivery(
            context.db,
            store.Delivery(
                connection, body["eventId"], body["result"], body["key"], body.get("payload")
            ),
        )
        context.metrics.deliveries.labels(connection, "accepted" if new else "duplicate").inc()
        if woken:
            context.metrics.delivered(connection, body["result"], body["key"])
            context.timer.runnable()
        return _json({"eventId": body["eventId"], "duplicate": not new, "woke": woken}, 202)

    @app.get("/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        parts = await readiness(context)
        ok = all(part["ok"] for part in parts.values())
        return _json({"ready": ok, "parts": parts}, 200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        await _scrape(context)
        return Response(context.metrics.render(), status=200, content_type=CONTENT_TYPE)

    @app.get("/openapi.json")
    async def openapi() -> Response:
        return _json(spec)

    return app


def _check_delivery(body: JSON, results: list[str]) -> None:
    """Refuse a delivery body that is not ``{result, key, eventId, payload?}``."""

    def refuse(status: int, detail: str) -> Problem:
        return Problem(status, "webhook.invalid-delivery", detail)

    if not isinstance(body, dict):
        raise refuse(400, "the delivery must be a JSON object {result, key, eventId, payload?}")
    unknown = sorted(set(body) - {"result", "key", "eventId", "payload"})
    if unknown:
        raise refuse(400, f"unknown fields: {', '.join(unknown)}")
    for name, limit in (("result", 64), ("key", 500), ("eventId", 200)):
        value = body.get(name)
        if not isinstance(value, str) or not 1 <= len(value) <= limit:
            raise refuse(400, f"{name} must be a string of 1 to {limit} characters")
    if body["result"] not in results:
        raise refuse(
            422, f"unknown result {body['result']!r}; this product delivers: " + ", ".join(results)
        )


async def readiness(context: Context) -> dict[str, JSON]:
    """Each part of readiness, named: what /ready and systemd's READY=1 go by."""
    parts: dict[str, JSON] = {}
    try:
        with trio.fail_after(2):
            await context.db.row("server_version")
        parts["database"] = {"ok": True}
    except (trio.TooSlowError, Unavailable) as exc:
        parts["database"] = {"ok": False, "detail": str(exc) or "no answer within 2 s"}
    parts["schema"] = {"ok": True, "detail": "checked at startup"}
    parts["listener"] = {
        "ok": context.listener.connected,
        "reconnects": context.listener.reconnects,
    }
    parts["keys"] = context.auth.readiness()
    parts["workflows"] = {
        "ok": bool(context.workflows.pinned),
        "pinned": len(context.workflows.pinned),
    }
    return parts


async def _scrape(context: Context) -> None:
    """Refresh the gauges that describe the present, just before they are read."""
    metrics = context.metrics
    try:
        with trio.fail_after(2):
            rows = await context.db.rows("active_runs_by_state")
    except (trio.TooSlowError, Unavailable):
        rows = None
    if rows is not None:
        counts = {r["state"]: r["runs"] for r in rows}
        for state in ("running", "waiting", "held"):
            metrics.runs.labels(state).set(counts.get(state, 0))
        metrics.held.set(counts.get("held", 0))
    for name, product in context.products.items():
        metrics.pool_in_use.labels(name).set(product.limiter.borrowed_tokens)
        metrics.pool_queued.labels(name).set(
            max(0, product.queued - product.limiter.borrowed_tokens)
        )
    metrics.listener.set(1 if context.listener.connected else 0)
