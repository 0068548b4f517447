"""Result webhooks: a product delivering a result that runs waiting for it wake to.

A delivery is judged on its signature first, over the raw bytes, before its body is
parsed: an unsigned or forged body is never read as JSON. It is kept once per event id
(a product may send it again until it sees a 202), so a second sending is answered as a
duplicate and wakes no run. Each delivery is counted by connection and outcome (accepted,
duplicate, or the code its signature was refused with).
"""

from __future__ import annotations

import time

from quart import Response, request

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.engine import store
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import body_json, json_response
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, verify


async def deliver(context: Context, connection: str) -> Response:
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
