"""What every stand-in product shares: serving, bearer tokens, problems, traces, keys.

A stand-in answers as its real product does on the wire: lowercase UUID ids, problem
documents (RFC 9457) whose ``type``, ``code`` and ``status`` come from the product's
closed vocabulary and whose ``traceId`` is the trace of the ``traceparent`` header every
answer carries (the caller's trace continued when it sent one), ``Cache-Control:
no-store``, and idempotency keys honoured as the product honours them: the same key and
body replays the original answer and changes nothing, the same key with another body
is refused (:class:`Keys`).

For testing, each keeps a ledger of every request and of every key it applied, and
takes fault rules (answer with a status, hang after applying, delay, answer garbage,
answer with given raw bytes after applying) on a control route. The ledger is how tests
prove a mutation was never sent twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from quart import Response, request
from quart_trio import QuartTrio

from registry_coordinator.authoring.canonical import (
    JSON,
    UnusableJson,
    canonical_bytes,
    strict_json,
)
from registry_coordinator.authoring.expressions import format_instant

log = logging.getLogger(__name__)

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


def new_id() -> str:
    """A fresh id as the products mint them: a v4 UUID, lowercase and hyphenated."""
    return str(uuid.uuid4())


def now() -> str:
    return format_instant(datetime.now(UTC))


@dataclass
class Fault:
    """A rule that changes how matching requests are answered, ``times`` times (None: always).

    ``hold`` keeps a request waiting, before it is routed, until the rules are next set (or
    ``seconds`` pass): a test holds a product's requests as long as it needs, then lets them
    all go at once, without betting on how long a loaded machine takes to get there."""

    match: str  # "METHOD /path-prefix", "METHOD /exact/path$", or "*"
    mode: str  # status, hang-after-apply, delay, hold, invalid, answer
    status: int = 503
    seconds: float = 0.0
    retry_after: int | None = None
    times: int | None = None
    body: str = ""  # answer: the raw body sent with ``status`` once the route has applied
    released: trio.Event = field(default_factory=trio.Event, compare=False)

    def matches(self, method: str, path: str) -> bool:
        if self.match == "*":
            return True
        want_method, _, prefix = self.match.partition(" ")
        if prefix.endswith("$"):
            return method == want_method and path == prefix[:-1]
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


@dataclass(frozen=True)
class Issued:
    """A token the stand-in IdP issued: until when, for what, and under which task grant
    (a token exchanged for a Casework assertion of one)."""

    expiry: float  # monotonic
    scope: str = ""
    resource: str | None = None
    grant: str | None = None


@dataclass
class Tokens:
    """Bearer tokens the stand-ins accept: Coordinator's static one, a staff member's (who
    decides reviews at Casework), and those their IdP issued."""

    static: str
    staff: str = "stand-in-staff-token"
    issued: dict[str, Issued] = field(default_factory=dict)

    def valid(self, header: str | None, *, staff: bool = False) -> bool:
        if header is None or not header.startswith("Bearer "):
            return False
        token = header[7:]
        if staff:
            return secrets.compare_digest(token, self.staff)
        return token == self.static or self.of(header) is not None

    def of(self, header: str | None) -> Issued | None:
        """What the IdP issued the bearer token of ``header`` as, while it is valid."""
        token = (header or "").removeprefix("Bearer ")
        issued = self.issued.get(token)
        return issued if issued is not None and issued.expiry > time.monotonic() else None


@dataclass
class Webhook:
    """Where a stand-in pushes its completion events (Casework's destination), with the
    secret its destination is configured with, and how long it waits before the first."""

    url: str
    secret: str
    delay: float = 0.0


@dataclass
class Client:
    """The one OAuth 2 client the stand-in IdP knows: Coordinator."""

    client_id: str
    secret: str | None
    public_key: str | None  # PEM, for private_key_jwt
    lifetime: int = 3600


@dataclass(frozen=True)
class Answer:
    """What a route answers: a status, a JSON body (None: an empty body, and no content
    type) and headers of its own."""

    status: int
    body: JSON = None
    headers: Mapping[str, str] = field(default_factory=dict)
    empty: bool = False


@dataclass(frozen=True)
class Call:
    """One request as a route sees it."""

    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    body: JSON
    raw: bytes
    headers: Mapping[str, str]
    key: str | None


Handler = Callable[[Call], Awaitable[Answer]]


class Refusal(Exception):
    """A route refusing a request with one of its product's problems."""

    def __init__(self, code: str, detail: str = "", headers: Mapping[str, str] | None = None):
        super().__init__(code)
        self.code, self.detail, self.headers = code, detail, dict(headers or {})


@dataclass
class Route:
    method: str
    pattern: str  # /v1/records/{collection}/{recordId}
    handler: Handler
    keyed: bool = False  # a mutation: it takes an Idempotency-Key, and keys are honoured
    staff: bool = False  # decided by staff, with the staff token, not Coordinator's
    open: bool = False  # takes no bearer token (a token endpoint)
    json: bool = True  # its body is JSON

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


@dataclass
class Keys:
    """Idempotency keys as a product keeps them: the first answer to a key, with the
    digest of the canonical request it answered."""

    conflict: str  # the product's problem code for a key sent with another request
    replay_status: Callable[[int], int] = lambda status: status
    #: key -> (the request's route, its digest, the answer held)
    held: dict[str, tuple[str, str, Answer]] = field(default_factory=dict)

    @staticmethod
    def digest(call: Call) -> str:
        """The digest of a request's canonical body and query: member order and spacing
        do not matter, any other difference does."""
        try:
            canonical = canonical_bytes(call.body)
        except (TypeError, ValueError):
            canonical = call.raw
        query = json.dumps(sorted(call.query.items())).encode()
        return hashlib.sha256(query + b"\n" + canonical).hexdigest()


class StandIn:
    """One product's stand-in: its app, its state, its faults and its ledger. A product's
    subclass gives its :attr:`routes`, its problem vocabulary and how it keeps keys."""

    product = ""
    problem_base = ""
    #: The product's problem codes, each with its status, title and fixed detail.
    problems: Mapping[str, tuple[int, str, str]] = {}

    def __init__(self, tokens: Tokens, webhook: Webhook | None = None) -> None:
        self.tokens = tokens
        self.webhook = webhook
        self.ledger = Ledger()
        self.faults: list[Fault] = []
        self.holding: list[Fault] = []  # the hold rules requests wait on, until rules are set
        self.keys = self.make_keys()
        self._nursery: trio.Nursery | None = None
        self.app = self._build()

    # --- what a product gives ------------------------------------------------------------

    def routes(self) -> list[Route]:
        return []

    def make_keys(self) -> Keys:
        return Keys("idempotency.key-reused")

    def check(self, call: Call, route: Route) -> None:
        """Refuse a request before its route runs (a product's profile checks)."""

    def control(self, name: str, body: Any) -> JSON:
        """A product's own control route for tests (``POST /_control/<name>``); None: it
        has none of that name."""
        return None

    # --- serving --------------------------------------------------------------------------

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started(await nursery.start(serve_app, self.app, host, port))

    def start_soon(self, job: Callable[[], Awaitable[None]]) -> None:
        """Run ``job`` in the background, in the stand-in's own nursery."""
        if self._nursery is not None:
            self._nursery.start_soon(job)

    def _build(self) -> QuartTrio:
        app = QuartTrio(f"standin-{self.product}")
        app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
        routes = self.routes()

        @app.route("/_control/ledger", methods=["GET"])
        async def ledger() -> Response:
            return _json(200, self.ledger.as_json())

        @app.route("/_control/faults", methods=["POST"])
        async def faults() -> Response:
            rules = json.loads(await request.get_data())
            for held in self.holding:  # what was set before lets its held requests go
                held.released.set()
            self.holding.clear()
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

        @app.route("/_control/<name>", methods=["POST"])
        async def control(name: str) -> Response:
            said = self.control(name, json.loads(await request.get_data() or b"{}"))
            return _json(404 if said is None else 200, said or {"unknown": name})

        @app.route("/", methods=["GET", "POST"], defaults={"path": ""})
        @app.route("/<path:path>", methods=["GET", "POST"])
        async def product_route(path: str) -> Response:
            return await self._handle("/" + path, routes)

        return app

    def noted(self, entry: dict[str, JSON], call: Call) -> None:
        """More of a request for the ledger, as a product's subclass sees fit."""

    async def _handle(self, path: str, routes: list[Route]) -> Response:
        method = request.method
        key = request.headers.get("Idempotency-Key")
        raw = await request.get_data(as_text=False)
        assert isinstance(raw, bytes)
        trace = self._trace(request.headers.get("traceparent"))
        entry: dict[str, JSON] = {
            "method": method,
            "path": path,
            "query": dict(request.args),
            "key": key,
            "at": time.time(),
            "bodySha256": hashlib.sha256(raw).hexdigest(),
            "traceparent": request.headers.get("traceparent"),  # whose trace it joins
        }
        self.ledger.requests.append(entry)
        self.ledger.in_flight += 1
        self.ledger.max_in_flight = max(self.ledger.max_in_flight, self.ledger.in_flight)
        try:
            answer = await self._answer(method, path, key, raw, routes, entry)
        finally:
            self.ledger.in_flight -= 1
        if isinstance(answer, Response):
            entry["status"] = answer.status_code
            answer.headers["traceparent"] = trace
            return answer
        entry["status"] = answer.status
        return self._respond(answer, trace)

    def _trace(self, inbound: str | None) -> str:
        """The answer's trace context: the caller's trace continued when its
        ``traceparent`` is one valid lowercase version-0 value, else a new trace."""
        match = _TRACEPARENT.match(inbound or "")
        trace_id = match[1] if match and match[1] != "0" * 32 else secrets.token_hex(16)
        return f"00-{trace_id}-{secrets.token_hex(8)}-01"

    def _respond(self, answer: Answer, trace: str) -> Response:
        headers = {"Cache-Control": "no-store", "traceparent": trace, **answer.headers}
        if answer.empty:  # no body, and no media type to read one as
            empty = Response(b"", status=answer.status, headers=headers)
            del empty.headers["Content-Type"]
            return empty
        problem = answer.headers.get("Content-Type") == "application/problem+json"
        body = answer.body
        if problem and isinstance(body, dict):
            body = {**body, "traceId": trace.split("-")[1]}
        headers["Content-Type"] = "application/problem+json" if problem else "application/json"
        return Response(json.dumps(body), status=answer.status, headers=headers)

    def problem(self, code: str, headers: Mapping[str, str] | None = None) -> Answer:
        """One of the product's problems, as it documents them (its detail fixed, as the
        products' are: why a stand-in refused is in its ledger, not its answer)."""
        status, title, detail = self.problems[code]
        body = {
            "type": self.problem_base + code.replace(".", "/"),
            "title": title,
            "status": status,
            "detail": detail,
            "code": code,
        }
        extra = {"Content-Type": "application/problem+json", **(headers or {})}
        if status == 401:
            extra["WWW-Authenticate"] = "Bearer"
        if status == 503:
            extra.setdefault("Retry-After", "5")
        return Answer(status, body, extra)

    def _fault_answer(self, status: int, retry_after: int | None) -> Answer:
        """A fault's answer: the product's problem of that status if it has one, else what
        a gateway in front of it would say."""
        headers = {"Retry-After": str(retry_after)} if retry_after else {}
        for code, (known, *_) in self.problems.items():
            if known == status:
                return self.problem(code, headers)
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        return Answer(status, {"title": f"stand-in fault {status} {phrase}".strip()}, headers)

    async def _answer(
        self,
        method: str,
        path: str,
        key: str | None,
        raw: bytes,
        routes: list[Route],
        entry: dict[str, JSON],
    ) -> Answer | Response:
        fault = next((f for f in self.faults if f.matches(method, path)), None)
        if fault is not None and fault.times is not None:
            fault.times -= 1
            if fault.times <= 0:
                self.faults.remove(fault)
        if fault is not None and fault.mode == "delay":
            await trio.sleep(fault.seconds)
        if fault is not None and fault.mode == "hold":
            self.holding.append(fault)
            with trio.move_on_after(fault.seconds):
                await fault.released.wait()
        if fault is not None and fault.mode == "status":
            return self._fault_answer(fault.status, fault.retry_after)
        for route in routes:
            params = route.match(method, path)
            if params is not None:
                break
        else:
            return self.not_found(method, path)
        bearer = request.headers.get("Authorization")
        if not route.open and not self.tokens.valid(bearer, staff=route.staff):
            return self.problem("authentication.refused")
        try:
            body: JSON = strict_json(raw) if raw and route.json else None
        except UnusableJson:
            entry["why"] = "the body is not JSON"
            return self.problem("request.invalid")
        headers = dict(request.headers.items())
        call = Call(method, path, params, dict(request.args), body, raw, _Folded(headers), key)
        self.noted(entry, call)
        try:
            self.check(call, route)
            answer = await self._keyed(call, route) if route.keyed else await route.handler(call)
        except Refusal as refused:
            entry["why"] = refused.detail or refused.code
            answer = self.problem(refused.code, refused.headers)
        if fault is not None and fault.mode == "hang-after-apply":
            await trio.sleep(fault.seconds)
        if fault is not None and fault.mode == "invalid":
            return Answer(200, {"unexpected": True})
        if fault is not None and fault.mode == "answer":
            return Response(fault.body, status=fault.status, content_type="application/json")
        return answer

    def not_found(self, method: str, path: str) -> Answer:
        return self.problem("request.not-found")

    async def _keyed(self, call: Call, route: Route) -> Answer:
        """A mutation under its idempotency key: the original answer to the same key and
        request again, a refusal for another request, else the route applied once."""
        if (
            not call.key
            or len(call.key) > 128
            or not call.key.isascii()
            or not call.key.isprintable()
        ):
            raise Refusal("request.invalid", "send one Idempotency-Key of visible ASCII")
        digest = Keys.digest(call)
        held = self.keys.held.get(call.key)
        if held is not None:
            path, was, original = held
            if (path, was) != (call.path, digest):
                raise Refusal(self.keys.conflict)
            return Answer(self.keys.replay_status(original.status), original.body, original.headers)
        answer = await route.handler(call)
        if 200 <= answer.status < 300:
            self.keys.held[call.key] = (call.path, digest, answer)
            self.ledger.applied[call.key] += 1
        return answer

    def held_answer(self, path: str, call: Call) -> Answer | None:
        """The answer held for ``call``'s key, if it answered the same request at ``path``
        (the products' receipt routes: the original key and body, resent elsewhere)."""
        held = self.keys.held.get(call.key or "")
        if held is None or held[:2] != (path, Keys.digest(call)):
            return None
        return held[2]


class _Folded(dict[str, str]):
    """Request headers looked up whatever the case of their names, as HTTP has them."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        super().__init__({k.lower(): v for k, v in headers.items()})

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


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


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(body), status=status, content_type="application/json", headers=headers or {}
    )
