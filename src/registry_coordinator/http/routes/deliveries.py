"""Result deliveries: a product telling Coordinator that a result runs wait for is there.

Two kinds arrive at ``POST /v1/results/{connection}``, and both are only wake-ups: the
woken runs read the authoritative result from the product with Coordinator's own
identity. A product that pushes completion events of its own kind (Casework's
``review.completed``, per the result's ``delivery.push`` in the catalog) sends them as it
sends them to any destination: authenticated by the static secret its destination is
configured with (a bearer token, or a header of its own; Casework signs nothing), and
acknowledged by an empty 204 alone. Coordinator's own signed deliveries
(``{result, key, eventId, payload?}`` with ``Coordinator-Signature``) are judged on their
signature first, over the raw bytes, before the body is parsed: an unsigned or forged
body is never read as JSON.

Either kind is kept once per event id (a product sends it again while it has not seen its
acknowledgement — Casework at a fixed interval, up to its destination's configured
attempts, then gives up: its feed still lists the completion), so a second sending is
answered as a duplicate and wakes no run. Each
delivery is counted by connection and outcome (accepted, duplicate, or the code it was
refused with).
"""

from __future__ import annotations

import hmac
import time

from quart import Response, request

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import Result, builtin_catalog
from registry_coordinator.config import Completions
from registry_coordinator.engine.calls import Product
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import body_json, json_response
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, verify

#: The header a Casework completion names its recipient binding in.
RECIPIENT_BINDING = "Registry-Recipient-Binding"


async def deliver(context: Context, connection: str) -> Response:
    product = context.products.get(connection)
    pushed = _pushed(product)
    if product is None or (product.config.webhook_secret is None and pushed is None):
        raise Problem(
            404,
            "connection.unknown",
            f"no connection {connection} that accepts result webhooks",
        )
    try:
        if SIGNATURE_HEADER in request.headers or pushed is None:
            return await _signed(context, product)
        return await _completion(context, product, *pushed)
    except Problem as refused:
        context.metrics.deliveries.labels(connection, refused.code).inc()
        raise


def _pushed(product: Product | None) -> tuple[Result, Completions] | None:
    """The result a connection's product pushes completion events for, and how the
    connection authenticates them; None if it pushes none or none are configured."""
    if product is None or product.config.completions is None:
        return None
    kind = builtin_catalog().products.get(product.config.product)
    found = [r for r in kind.results.values() if r.push is not None] if kind else []
    return (found[0], product.config.completions) if found else None


async def _record(context: Context, delivery: store.Delivery) -> tuple[bool, int]:
    new, woken = await store.record_delivery(context.db, delivery)
    context.metrics.deliveries.labels(delivery.connection, "accepted" if new else "duplicate").inc()
    if woken:
        context.metrics.delivered(delivery.connection, delivery.result, delivery.key)
        context.timer.runnable()
    return new, woken


async def _completion(
    context: Context, product: Product, result: Result, completions: Completions
) -> Response:
    """A completion event the product pushed, as its own destinations receive it."""
    presented = request.headers.get(completions.header, "")
    if completions.header == "authorization":
        presented = presented.removeprefix("Bearer ")
    if not hmac.compare_digest(presented.encode(), completions.secret.encode()):
        raise Problem(
            401,
            "webhook.unauthenticated",
            f"present the secret this connection's completions are configured with "
            f"in {completions.header}",
        )
    binding = completions.recipient_binding
    if binding is not None and request.headers.get(RECIPIENT_BINDING) != binding:
        raise Problem(
            403,
            "webhook.recipient-mismatch",
            f"{RECIPIENT_BINDING} does not name this connection's recipient binding",
        )
    body = await body_json()
    assert result.push is not None
    push = result.push
    for name in (push.event_id, push.key):
        value = body.get(name) if isinstance(body, dict) else None
        if not isinstance(value, str) or not 1 <= len(value) <= 200:
            raise Problem(
                400,
                "webhook.invalid-delivery",
                f"a {push.event} event must carry {name} as a string of 1 to 200 characters",
            )
    assert isinstance(body, dict)
    if body.get("type") != push.event:
        raise Problem(
            422,
            "webhook.invalid-delivery",
            f"this connection takes {push.event} events, not {body.get('type')!r}",
        )
    payload = {k: v for k, v in body.items() if k not in ("type", push.event_id, push.key)}
    await _record(
        context,
        store.Delivery(
            product.config.name, body[push.event_id], result.name, body[push.key], payload
        ),
    )
    acknowledged = Response(b"", status=204)
    del acknowledged.headers["Content-Type"]
    return acknowledged


async def _signed(context: Context, product: Product) -> Response:
    """One of Coordinator's own signed deliveries."""
    secret = product.config.webhook_secret
    name = product.config.name
    if secret is None:
        raise Problem(
            401,
            "webhook.signature-invalid",
            f"connection {name} takes no signed deliveries: send its product's own events",
        )
    raw = await request.get_data(as_text=False)
    assert isinstance(raw, bytes)
    verify(secret, request.headers.get(SIGNATURE_HEADER), name, raw, time.time())
    body = await body_json()
    results = builtin_catalog().products[product.config.product].results
    _check_delivery(body, sorted(results))
    new, woken = await _record(
        context,
        store.Delivery(name, body["eventId"], body["result"], body["key"], body.get("payload")),
    )
    return json_response({"eventId": body["eventId"], "duplicate": not new, "woke": woken}, 202)


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
