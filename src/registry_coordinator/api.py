"""The HTTP front end (quart-trio): JSON in, JSON out, RFC 9457 problems for every error.

Every error a caller can cause is answered with ``application/problem+json``
carrying a stable ``code`` and a ``detail`` that says what to change; nothing a
caller sends produces a 5xx or a stack trace.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import trio
from psycopg.types.json import Jsonb
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from . import admission, operations, store
from .calls import Product
from .catalog import builtin_catalog
from .database import Database, Row, Unavailable
from .expressions import format_instant, holds_nul
from .listener import Listener
from .timers import Timer
from .webhooks import SIGNATURE_HEADER, SignatureRefused, verify
from .workflows import Workflows

JSON = Any
PROBLEM_TYPE = "https://registrystack.org/problems/coordinator/"
ANONYMOUS = "anonymous"


@dataclass
class Context:
    """What the handlers work with; built by the service before it serves."""

    db: Database
    workflows: Workflows
    timer: Timer
    products: dict[str, Product]
    listener: Listener


def problem(status: int, code: str, detail: str, **extra: JSON) -> Response:
    body = {
        "type": PROBLEM_TYPE + code,
        "title": _TITLES.get(status, "Request refused"),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }
    return Response(json.dumps(body), status=status, content_type="application/problem+json")


_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Unprocessable input",
    502: "Product unavailable",
    503: "Service unavailable",
}


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
        "state": row["state"],
        "step": row["step"],
        "outcome": row["outcome"],
        "output": row["output"],
        "failure": {"code": row["failure_code"], "detail": row["detail"]}
        if row["failure_code"]
        else None,
        "hold": {"code": row["hold_code"], "detail": row["detail"]} if row["hold_code"] else None,
        "admittedAt": _instant(row["admitted_at"]),
        "deadlineAt": _instant(row["deadline_at"]),
        "updatedAt": _instant(row["updated_at"]),
        "endedAt": _instant(row["ended_at"]),
    }


def _delivery_problem(body: JSON, results: list[str]) -> str | None:
    """What is wrong with a delivery's body, if anything."""
    if not isinstance(body, dict):
        return "the delivery must be a JSON object {result, key, eventId, payload?}"
    unknown = sorted(set(body) - {"result", "key", "eventId", "payload"})
    if unknown:
        return f"unknown fields: {', '.join(unknown)}"
    for name, limit in (("result", 64), ("key", 500), ("eventId", 200)):
        value = body.get(name)
        if not isinstance(value, str) or not 1 <= len(value) <= limit:
            return f"{name} must be a string of 1 to {limit} characters"
    if body["result"] not in results:
        return f"unknown result {body['result']!r}; this product delivers: {', '.join(results)}"
    return None


def _uuid(run_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(run_id)
    except ValueError:
        raise operations.ActionRefused(
            404, "run.not-found", f"no run {run_id} that you may see"
        ) from None


def create_app(context: Context, body_limit: int) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = body_limit
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> Response:
        status = error.code or 500
        code = {
            404: "route.not-found",
            405: "route.method-not-allowed",
            413: "request.too-large",
        }.get(status, "request.invalid")
        detail = {413: f"the body is larger than {body_limit} bytes"}.get(
            status, error.description or "the request was refused"
        )
        response = problem(status, code, detail)
        if status == 413:
            # The rest of the body is left unread: the connection cannot carry another
            # request, so tell the client to open a new one.
            response.headers["Connection"] = "close"
        return response

    @app.post("/v1/runs")
    async def start_run() -> Response:
        raw = await request.get_data(as_text=False)
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            return problem(400, "request.malformed-json", f"the body is not JSON: {exc}")
        held = await operations.admission_held(context.db)
        if held is not None:
            return problem(
                503,
                "admission.held",
                f"new runs are not admitted: {held['reason']} ({held['actor']})",
            )
        try:
            started = await admission.start(
                context.db,
                context.workflows,
                context.timer,
                ANONYMOUS,
                request.headers.get("Idempotency-Key"),
                body,
            )
        except admission.Refusal as refusal:
            return problem(refusal.status, refusal.code, refusal.detail, **refusal.extra)
        row = await store.status(context.db, uuid.UUID(started.run_id))
        assert row is not None
        status = 201 if started.created else 200
        return _json(run_status(row), status, {"Location": f"/v1/runs/{started.run_id}"})

    async def _action_body() -> JSON:
        raw = await request.get_data(as_text=False)
        try:
            return json.loads(raw) if raw else {}
        except (UnicodeDecodeError, ValueError):
            raise operations.ActionRefused(
                400, "request.malformed-json", "the body is not JSON"
            ) from None

    async def _run_action(run_id: str, action: str) -> Response:
        try:
            parsed = _uuid(run_id)
            reason = operations.require_reason(await _action_body())
            actor = ANONYMOUS
            status = 200
            if action == "cancel":
                if not await operations.cancel(context.db, parsed, actor, reason):
                    status = 202
            elif action == "retry-same":
                await operations.retry_same(
                    context.db, context.workflows, context.timer, parsed, actor, reason
                )
            else:
                await operations.reconcile(
                    context.db,
                    context.workflows,
                    context.products,
                    context.timer,
                    parsed,
                    actor,
                    reason,
                )
        except operations.ActionRefused as refused:
            return problem(refused.status, refused.code, refused.detail)
        row = await store.status(context.db, parsed)
        assert row is not None
        return _json(run_status(row), status)

    @app.post("/v1/runs/<run_id>/cancel")
    async def cancel_run(run_id: str) -> Response:
        return await _run_action(run_id, "cancel")

    @app.post("/v1/runs/<run_id>/retry-same")
    async def retry_same(run_id: str) -> Response:
        return await _run_action(run_id, "retry-same")

    @app.post("/v1/runs/<run_id>/reconcile")
    async def reconcile(run_id: str) -> Response:
        return await _run_action(run_id, "reconcile")

    @app.post("/v1/admission/<change>")
    async def admission_change(change: str) -> Response:
        if change not in ("hold", "release"):
            return problem(404, "route.not-found", f"no admission action {change}")
        try:
            reason = operations.require_reason(await _action_body())
        except operations.ActionRefused as refused:
            return problem(refused.status, refused.code, refused.detail)
        await operations.set_admission(context.db, change == "hold", ANONYMOUS, reason)
        return _json({"held": change == "hold", "reason": reason})

    @app.post("/v1/results/<connection>")
    async def deliver_result(connection: str) -> Response:
        product = context.products.get(connection)
        if product is None or product.config.webhook_secret is None:
            return problem(
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
                raw,
                time.time(),
            )
        except SignatureRefused as refused:
            return problem(401, refused.code, refused.detail)
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, ValueError) as exc:
            return problem(400, "request.malformed-json", f"the body is not JSON: {exc}")
        results = builtin_catalog().products[product.config.product].results
        problem_text = _delivery_problem(body, sorted(results))
        if problem_text is not None:
            return problem(
                400 if "unknown result" not in problem_text else 422,
                "webhook.invalid-delivery",
                problem_text,
            )
        if holds_nul(body):
            return problem(400, "webhook.invalid-delivery", "the delivery holds a NUL character")
        row = await context.db.row(
            "record_delivery",
            {
                "connection": connection,
                "event_id": body["eventId"],
                "result": body["result"],
                "key": body["key"],
                "payload": Jsonb(body.get("payload")),
            },
        )
        assert row is not None
        if row["woken"]:
            context.timer.runnable()
        return _json(
            {"eventId": body["eventId"], "duplicate": row["new"] == 0, "woke": row["woken"]}, 202
        )

    @app.get("/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
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
        parts["workflows"] = {
            "ok": bool(context.workflows.pinned),
            "pinned": len(context.workflows.pinned),
        }
        ok = all(part["ok"] for part in parts.values())
        return _json({"ready": ok, "parts": parts}, 200 if ok else 503)

    @app.get("/v1/runs/<run_id>")
    async def get_run(run_id: str) -> Response:
        row = await _find(run_id)
        if row is None:
            return problem(404, "run.not-found", f"no run {run_id} that you may see")
        return _json(run_status(row))

    @app.get("/v1/runs/<run_id>/history")
    async def get_history(run_id: str) -> Response:
        row = await _find(run_id)
        if row is None:
            return problem(404, "run.not-found", f"no run {run_id} that you may see")
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

    async def _find(run_id: str) -> Row | None:
        try:
            return await store.status(context.db, _uuid(run_id))
        except operations.ActionRefused:
            return None

    return app
