"""What every handler reads from a request and answers with: the caller, a JSON body, page
cursors, and JSON or problem+json responses.

A body is judged before any handler looks at it: JSON routes take only JSON media types
(415 otherwise), and a body :func:`strict_json` refuses is a 400 with a code naming why.
Every refusal is an RFC 9457 problem with a stable ``code`` from ``problems.CODES``; a
401 says how to authenticate and a 503 when to try again.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime

from quart import Response, g, request

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, UnusableJson, strict_json
from registry_coordinator.authoring.expressions import format_instant, parse_instant
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.observability import tracing

PROBLEM_TYPE = "https://registrystack.org/problems/coordinator/"
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
#: The problem code of a request body :func:`strict_json` refuses, by its reason.
_UNUSABLE_BODY = {
    "not-json": "request.malformed-json",
    "too-deep": "request.too-deep",
    "unstorable": "request.unstorable-text",
}


def problem_body(status: int, code: str, detail: str, **extra: JSON) -> dict[str, JSON]:
    """An RFC 9457 problem's body: what a refused request is answered with, and what a
    batch start says of each start refused."""
    return {
        "type": PROBLEM_TYPE + code,
        "title": _TITLES.get(status, "Request refused"),
        "status": status,
        "code": code,
        "detail": detail,
        **extra,
    }


def problem(status: int, code: str, detail: str, **extra: JSON) -> Response:
    body = problem_body(status, code, detail, **extra)
    response = Response(json.dumps(body), status=status, content_type="application/problem+json")
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="registry-coordinator"'
    if status == 503:
        response.headers["Retry-After"] = str(RETRY_AFTER)
    return response


def json_response(body: JSON, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body), status=status, content_type="application/json", headers=headers or {}
    )


def instant(value: datetime | None) -> str | None:
    return format_instant(value) if value is not None else None


def moment(name: str, text: str | None) -> datetime | None:
    """An instant a filter ``name`` gives (ISO 8601; without an offset, taken as UTC), or
    None when it gives none."""
    text = (text or "").strip()
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise Problem(
            400, "request.invalid-filter", f"{name} must be a date and time like 2026-12-01T09:30"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


async def authenticated(context: Context) -> Caller:
    """Who sent the request, by its bearer token; refused (401) if it names no one. Named
    in the request's access log line."""
    caller = await context.auth.authenticate(request.headers.get("Authorization"))
    g.caller = caller.actor
    return caller


def serving() -> tracing.Serving:
    """The server span of the request being served (made as it is answered)."""
    made: tracing.Serving = g.get("serving", tracing.NO_SERVING)
    return made


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


async def body_json() -> JSON:
    """The request's body as strict JSON; no body at all is ``{}``."""
    raw = await request.get_data(as_text=False)
    assert isinstance(raw, bytes)
    _require_json(raw)
    try:
        return strict_json(raw) if raw else {}
    except UnusableJson as exc:
        raise Problem(400, _UNUSABLE_BODY[exc.reason], f"the body is refused: {exc}") from None


def cursor(
    text: str | None, first: tuple[datetime, uuid.UUID] | None = None
) -> tuple[datetime, uuid.UUID]:
    """A page cursor: the (admitted_at, id) of the last run on the previous page; without
    one, ``first`` (unless told, after the newest run: a listing newest first)."""
    if text is None:
        return first or (parse_instant("9999-12-31T00:00:00Z"), uuid.UUID(int=(1 << 128) - 1))
    try:
        at, run_id = json.loads(base64.urlsafe_b64decode(text.encode() + b"=="))
        return parse_instant(at), uuid.UUID(run_id)
    except (ValueError, TypeError, AttributeError, OverflowError, UnicodeDecodeError):
        raise Problem(
            400,
            "request.invalid-cursor",
            "the cursor is not one this API returned; start again without it",
        ) from None


def next_cursor(run: store.RunStatus | store.ArchivedRun) -> str:
    """The cursor of the page after the one ``run`` is the last of."""
    return cursor_at(run.admitted_at, run.id)


def cursor_at(at: datetime, run_id: uuid.UUID) -> str:
    """The cursor of a page that ends at the run ``run_id`` at ``at`` (as :func:`cursor`
    reads it back)."""
    raw = json.dumps([format_instant(at), str(run_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


async def read_whole_body() -> None:
    """Read the whole body before answering, even with a refusal: an answer sent while
    the client is still sending the body leaves the connection unable to carry the
    client's next request (hypercorn never reads it, and the client waits)."""
    await request.get_data(as_text=False)
