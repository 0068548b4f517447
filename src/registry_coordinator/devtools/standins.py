"""Stand-in Registry Stack products: small, real HTTP servers for the demo and the tests.

Each stand-in serves its product's catalog routes on its own port, keeps its
state in memory, honours ``Idempotency-Key`` (a repeated key gets the original
answer and changes nothing), answers receipt lookups by key, checks the bearer
token Coordinator presents, and — for Casework and Messaging — sends signed
webhooks when a review is decided or a message delivered.

For testing they keep a ledger of every request and every key they applied, and
accept fault rules (answer with a status, hang after applying, delay, answer
garbage, answer with given raw bytes after applying) on a control route. The
ledger is how tests prove a mutation was never sent twice.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import parse_qs

import httpx
import jwt
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, request
from quart_trio import QuartTrio

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, sign

log = logging.getLogger(__name__)
PRODUCTS = ("breg", "casework", "messaging", "scheduling")
#: Not a catalog product: an OAuth 2 token endpoint the product stand-ins trust.
IDP = "idp"


@dataclass
class Fault:
    """A rule that changes how matching requests are answered, ``times`` times (None: always)."""

    match: str  # "METHOD /path-prefix", or "*"
    mode: str  # status, hang-after-apply, delay, invalid, answer
    status: int = 503
    seconds: float = 0.0
    retry_after: int | None = None
    times: int | None = None
    body: str = ""  # answer: the raw body sent with ``status`` once the route has applied

    def matches(self, method: str, path: str) -> bool:
        if self.match == "*":
            return True
        want_method, _, prefix = self.match.partition(" ")
        return method == want_method and path.startswith(prefix)


@dataclass
class Ledger:
    """Everything a stand-in received, for tests and for the demo's curious user."""

    requests: list[dict[str, JSON]] = field(default_factory=list)
    applied: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    webhooks: list[dict[str, JSON]] = field(default_factory=list)

    def as_json(self) -> JSON:
        return {
            "requests": self.requests,
            "applied": dict(self.applied),
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "webhooks": self.webhooks,
        }


@dataclass
class Webhook:
    """Where a stand-in delivers results, and the secret it signs them with."""

    url: str
    secret: str
    delay: float = 0.0

    @property
    def connection(self) -> str:
        """The connection the URL delivers to, which the signature names."""
        return self.url.rstrip("/").rsplit("/", 1)[-1]


@dataclass
class Tokens:
    """Bearer tokens the stand-ins accept: the static one, and those their IdP issued."""

    static: str
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (monotonic)

    def valid(self, header: str | None) -> bool:
        if header is None or not header.startswith("Bearer "):
            return False
        token = header[7:]
        return token == self.static or self.issued.get(token, 0.0) > time.monotonic()


@dataclass
class Client:
    """The one OAuth 2 client the stand-in IdP knows: Coordinator."""

    client_id: str
    secret: str | None
    public_key: str | None  # PEM, for private_key_jwt
    lifetime: int = 3600


class StandIn:
    """One product's stand-in: its app, its state, its faults and its ledger."""

    def __init__(
        self,
        product: str,
        tokens: Tokens,
        webhook: Webhook | None = None,
        client: Client | None = None,
    ) -> None:
        assert product in (*PRODUCTS, IDP), product
        self.product = product
        self.tokens = tokens
        self.client = client
        self.webhook = webhook
        self.ledger = Ledger()
        self.faults: list[Fault] = []
        self.receipts: dict[str, tuple[int, JSON]] = {}  # idempotency key -> original answer
        self.state: dict[str, dict[str, JSON]] = {}
        self._ids = itertools.count(1)
        self._nursery: trio.Nursery | None = None
        self.app = self._build()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    # --- serving ------------------------------------------------------------------------

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(await nursery.start(serve_app, self.app, host, port))

    def _build(self) -> QuartTrio:
        app = QuartTrio(f"standin-{self.product}")
        app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
        routes = ROUTES.get(self.product, [])

        @app.route("/_control/ledger", methods=["GET"])
        async def ledger() -> Response:
            return _json(200, self.ledger.as_json())

        @app.route("/_control/faults", methods=["POST"])
        async def faults() -> Response:
            rules = json.loads(await request.get_data())
            self.faults = [
                Fault(
                    r.get("match", "*"),
                    r["mode"],
                    r.get("status", 503),
                    r.get("seconds", 0.0),
                    r.get("retryAfter"),
                    r.get("times"),
                    r.get("body", ""),
                )
                for r in rules
            ]
            return _json(200, {"faults": len(self.faults)})

        @app.route("/<path:path>", methods=["GET", "POST"])
        async def product_route(path: str) -> Response:
            return await self._handle("/" + path, routes)

        return app

    async def _handle(self, path: str, routes: list[Route]) -> Response:
        method = request.method
        key = request.headers.get("Idempotency-Key")
        body = await request.get_data(as_text=False)
        assert isinstance(body, bytes)
        entry = {
            "method": method,
            "path": path,
            "key": key,
            "at": time.time(),
            "bodySha256": hashlib.sha256(body).hexdigest(),
            "traceparent": request.headers.get("traceparent"),  # whose trace it joins
        }
        self.ledger.requests.append(entry)
        self.ledger.in_flight += 1
        self.ledger.max_in_flight = max(self.ledger.max_in_flight, self.ledger.in_flight)
        try:
            response = await self._answer(method, path, key, body, routes)
        finally:
            self.ledger.in_flight -= 1
        entry["status"] = response.status_code
        return response

    async def _answer(
        self, method: str, path: str, key: str | None, body: bytes, routes: list[Route]
    ) -> Response:
        fault = next((f for f in self.faults if f.matches(method, path)), None)
        if fault is not None and fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                self.faults.remove(fault)
        if fault is not None and fault.mode == "delay":
            await trio.sleep(fault.seconds)
        if fault is not None and fault.mode == "status":
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after else {}
            return _json(fault.status, {"title": f"stand-in fault {fault.status}"}, headers)
        if self.product == IDP:
            return self._issue(body)
        if not self.tokens.valid(request.headers.get("Authorization")):
            return _json(401, {"title": "unknown or missing bearer token"})
        if path.startswith("/v1/") and "/by-idempotency-key/" in path:
            original = self.receipts.get(path.rsplit("/", 1)[1])
            if original is None:
                return _json(404, {"title": "no request with this idempotency key"})
            return _json(*original)
        if method == "POST" and key is not None and key in self.receipts:
            return _json(*self.receipts[key])  # a repeated key changes nothing
        for route in routes:
            params = route.match(method, path)
            if params is not None:
                break
        else:
            return _json(404, {"title": f"no route {method} {path}"})
        try:
            payload = json.loads(body) if body else {}
        except ValueError:
            return _json(400, {"title": "the body is not JSON"})
        status, answer = await route.handler(self, params, payload)
        if method == "POST" and key is not None and 200 <= status < 300:
            self.receipts[key] = (status, answer)
            self.ledger.applied[key] += 1
        if fault is not None and fault.mode == "hang-after-apply":
            await trio.sleep(fault.seconds)
        if fault is not None and fault.mode == "invalid":
            return _json(200, {"unexpected": True})
        if fault is not None and fault.mode == "answer":
            return Response(fault.body, status=fault.status, content_type="application/json")
        return _json(status, answer)

    def _issue(self, body: bytes) -> Response:
        """The token endpoint: client credentials by client_secret_post or private_key_jwt."""
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        client = self.client
        if (
            client is None
            or form.get("grant_type") != "client_credentials"
            or form.get("client_id") != client.client_id
        ):
            return _json(400, {"error": "invalid_client"})
        if client.secret is not None:
            if not hmac.compare_digest(form.get("client_secret", ""), client.secret):
                return _json(401, {"error": "invalid_client"})
        else:
            try:
                claims = jwt.decode(
                    form.get("client_assertion", ""),
                    client.public_key or "",
                    algorithms=["RS256", "ES256", "EdDSA"],
                    audience=request.url.split("?")[0],
                )
            except jwt.PyJWTError as exc:
                return _json(401, {"error": "invalid_client", "error_description": str(exc)})
            if claims.get("iss") != client.client_id or claims.get("sub") != client.client_id:
                return _json(401, {"error": "invalid_client"})
        token = self.next_id("tok") + "-" + hashlib.sha256(body).hexdigest()[:16]
        self.tokens.issued[token] = time.monotonic() + client.lifetime
        self.ledger.applied["tokens"] += 1
        return _json(
            200,
            {
                "access_token": token,
                "token_type": "Bearer",
                "expires_in": client.lifetime,
                "scope": form.get("scope", ""),
            },
        )

    # --- webhooks -----------------------------------------------------------------------

    def deliver(self, result: str, key: str, delay: float | None = None) -> None:
        """Send a signed result webhook in the background (if one is configured)."""
        if self.webhook is None or self._nursery is None:
            return
        self._nursery.start_soon(
            self._deliver, result, key, self.webhook.delay if delay is None else delay
        )

    async def _deliver(self, result: str, key: str, delay: float) -> None:
        assert self.webhook is not None
        await trio.sleep(delay)
        event = {"result": result, "key": key, "eventId": f"evt-{uuid.uuid4()}"}
        body = json.dumps(event).encode()
        headers = {
            SIGNATURE_HEADER: sign(
                self.webhook.secret, int(time.time()), self.webhook.connection, body
            ),
            "Content-Type": "application/json",
        }
        for attempt in range(5):
            try:
                async with httpx.AsyncClient(timeout=5) as client:
                    response = await client.post(self.webhook.url, content=body, headers=headers)
                self.ledger.webhooks.append({**event, "status": response.status_code})
                if response.status_code < 500:
                    return
            except httpx.HTTPError as exc:
                self.ledger.webhooks.append({**event, "error": repr(exc)})
            await trio.sleep(0.5 * 2**attempt)


# --- routes -------------------------------------------------------------------------------

Handler = Callable[["StandIn", dict[str, str], JSON], Awaitable[tuple[int, JSON]]]


@dataclass
class Route:
    method: str
    pattern: str  # /v1/records/{collection}/{recordId}
    handler: Handler

    def match(self, method: str, path: str) -> dict[str, str] | None:
        if method != self.method:
            return None
        want, got = self.pattern.strip("/").split("/"), path.strip("/").split("/")
        if len(want) != len(got):
            return None
        params = {}
        for a, b in zip(want, got, strict=True):
            if a.startswith("{"):
                params[a[1:-1]] = b
            elif a != b:
                return None
        return params


async def serve_app(
    app: QuartTrio,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve a stand-in's app (a product's, the IdP's or the OIDC issuer's) on
    ``host:port`` until cancelled; reports the URL it is bound to."""
    config = HypercornConfig()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(hypercorn_serve, app, config)
        task_status.started(bound[0])


def _json(status: int, body: JSON, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body), status=status, content_type="application/json", headers=headers or {}
    )


def _now() -> str:
    return format_instant(datetime.now(UTC))


async def read_record(s: StandIn, p: dict[str, str], _: JSON) -> tuple[int, JSON]:
    record = p["recordId"]
    if not record.startswith("app-"):
        return 404, {"title": f"no record {record} in {p['collection']}"}
    domain = {
        "email": f"applicant+{record}@example.org",
        "name": f"Applicant {record}",
        "status": "awaiting-review",
    }
    data = {"recordIdentifier": record, "revisionIdentifier": "r1", "domainData": domain}
    return 200, {"data": data, "meta": {"collection": p["collection"]}}


async def invoke_action(s: StandIn, p: dict[str, str], _: JSON) -> tuple[int, JSON]:
    return 200, {"actionId": s.next_id("act"), "status": "accepted"}


async def request_review(s: StandIn, _: dict[str, str], payload: JSON) -> tuple[int, JSON]:
    request_id = s.next_id("rev")
    s.state[request_id] = {
        "requestId": request_id,
        "decision": "pending",
        "decidedAt": None,
        "reviewer": None,
        "comment": None,
        "subject": payload.get("subject"),
    }
    return 201, {"requestId": request_id, "status": "open"}


async def review_result(s: StandIn, p: dict[str, str], _: JSON) -> tuple[int, JSON]:
    review = s.state.get(p["requestId"])
    if review is None:
        return 404, {"title": f"no review request {p['requestId']}"}
    return 200, {
        k: review[k] for k in ("requestId", "decision", "decidedAt", "reviewer", "comment")
    }


async def decide_review(s: StandIn, p: dict[str, str], payload: JSON) -> tuple[int, JSON]:
    """The reviewer's route (not part of the catalog): decide, then send the webhook."""
    review = s.state.get(p["requestId"])
    decision = payload.get("decision")
    if review is None:
        return 404, {"title": f"no review request {p['requestId']}"}
    if decision not in ("approved", "rejected", "changes_requested"):
        return 422, {"title": "decision must be approved, rejected or changes_requested"}
    review.update(
        decision=decision,
        decidedAt=_now(),
        reviewer=payload.get("reviewer", "reviewer"),
        comment=payload.get("comment"),
    )
    s.deliver("review-decision", review["requestId"])
    return 200, {
        k: review[k] for k in ("requestId", "decision", "decidedAt", "reviewer", "comment")
    }


async def submit_message(s: StandIn, _: dict[str, str], payload: JSON) -> tuple[int, JSON]:
    message_id = s.next_id("msg")
    s.state[message_id] = {
        "id": message_id,
        "status": "accepted",
        "updatedAt": _now(),
        "failureReason": None,
        "to": payload.get("to"),
    }
    if s.webhook is not None and s.webhook.delay >= 0 and s._nursery is not None:
        s._nursery.start_soon(_deliver_message, s, message_id)
    return 202, {"id": message_id, "status": "accepted"}


async def _deliver_message(s: StandIn, message_id: str) -> None:
    assert s.webhook is not None
    await trio.sleep(s.webhook.delay)
    s.state[message_id].update(status="delivered", updatedAt=_now())
    s.deliver("message-delivered", message_id, delay=0)


async def read_message(s: StandIn, p: dict[str, str], _: JSON) -> tuple[int, JSON]:
    message = s.state.get(p["id"])
    if message is None:
        return 404, {"title": f"no message {p['id']}"}
    return 200, {k: message[k] for k in ("id", "status", "updatedAt", "failureReason")}


async def read_availability(s: StandIn, _: dict[str, str], __: JSON) -> tuple[int, JSON]:
    args = request.args
    slots = [
        {
            "slotId": f"{args.get('service', 'svc')}-1",
            "start": args.get("from", ""),
            "end": args.get("to", ""),
        }
    ]
    return 200, {"slots": slots}


async def create_appointment(s: StandIn, _: dict[str, str], payload: JSON) -> tuple[int, JSON]:
    start = "2026-01-13T10:00:00Z"
    return 201, {
        "appointmentId": s.next_id("appt"),
        "status": "booked",
        "start": start,
        "end": "2026-01-13T10:30:00Z",
    }


ROUTES: dict[str, list[Route]] = {
    "breg": [
        Route("GET", "/v1/records/{collection}/{recordId}", read_record),
        Route("POST", "/v1/actions/{action}", invoke_action),
    ],
    "casework": [
        Route("POST", "/v1/review-requests", request_review),
        Route("GET", "/v1/review-requests/{requestId}/result", review_result),
        Route("POST", "/v1/review-requests/{requestId}/decision", decide_review),
    ],
    "messaging": [
        Route("POST", "/v1/messages", submit_message),
        Route("GET", "/v1/messages/{id}", read_message),
    ],
    "scheduling": [
        Route("GET", "/v1/availability", read_availability),
        Route("POST", "/v1/appointments", create_appointment),
    ],
}


async def serve_stand_ins(
    ports: dict[str, int],
    token: str,
    webhooks: dict[str, Webhook],
    host: str = "127.0.0.1",
    client: Client | None = None,
    *,
    task_status: trio.TaskStatus[dict[str, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the named products (and the IdP), each on its own port; reports their URLs."""
    tokens = Tokens(token)
    async with trio.open_nursery() as nursery:
        urls = {}
        for product, port in ports.items():
            stand_in = StandIn(product, tokens, webhooks.get(product), client)
            urls[product] = await nursery.start(stand_in.serve, host, port)
        task_status.started(urls)
