"""The routes for machines that watch the service: /health, /ready, /metrics, /openapi.json.

None needs a caller's token. ``/health`` says only that the process answers; ``/ready``
names each part the service needs and whether it is there, 503 if any is not; a scrape of
``/metrics`` refreshes the gauges that describe the present before rendering them. What
the probes read from the database is :mod:`observability.health`'s, which gives up in seconds,
so a probe answers even when the database does not.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from quart import Response

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http.context import Context
from registry_coordinator.http.requests import instant, json_response
from registry_coordinator.observability import health as health_reads
from registry_coordinator.observability.metrics import CONTENT_TYPE
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store import console_reads, operator_actions
from registry_coordinator.store.database import Unavailable

#: Runs with a changed binding counted at most, per probe.
LISTED = 100


@cache
def openapi_document() -> JSON:
    """The API's OpenAPI document, ``openapi.yaml``, read once."""
    text = resources.files("registry_coordinator.http").joinpath("openapi.yaml").read_text("utf-8")
    return yaml.safe_load(text)


async def health(context: Context) -> Response:
    return json_response({"status": "ok"})


async def ready(context: Context) -> Response:
    parts = await readiness(context)
    ok = all(part["ok"] for part in parts.values())
    return json_response({"ready": ok, "parts": parts}, 200 if ok else 503)


async def metrics(context: Context) -> Response:
    await scrape(context)
    return Response(context.metrics.render(), status=200, content_type=CONTENT_TYPE)


async def openapi(context: Context) -> Response:
    return json_response(openapi_document())


async def readiness(context: Context) -> dict[str, JSON]:
    """Each part the service needs to serve, named, and whether it is there."""
    return {
        "database": await health_reads.database(context.db),
        "schema": {"ok": True, "detail": "checked at startup"},
        "listener": {"ok": context.listener.connected, "reconnects": context.listener.reconnects},
        "keys": context.auth.readiness(),
        "workflows": {
            "ok": bool(context.workflows.pinned),
            "pinned": len(context.workflows.pinned),
        },
        "recovery": {"ok": context.recovery is None, "detail": context.recovery},
        "bindings": await _bindings(context),
        "admission": await _admission(context),
        "connections": {  # paused for maintenance, as this process last heard
            "ok": True,
            "paused": sorted(name for name, p in context.products.items() if p.paused),
        },
        "highWaterMark": {
            "ok": context.high_water.failing is None,
            "detail": context.high_water.failing
            or ("kept" if context.high_water.path else "not configured"),
        },
    }


async def _admission(context: Context) -> dict[str, JSON]:
    """Whether new starts are held, every one or some workflows' (since when; who and why
    are for operators, as a paused connection's are): reported, not a reason to be
    unready."""
    try:
        now = await console_reads.admission(context.db)
        held = await operator_actions.held_workflow_starts(context.db, None)
    except Unavailable:
        return {"ok": True, "detail": "not read: the database is unavailable"}
    return {
        "ok": True,
        "held": bool(now and now.held),
        "heldWorkflows": [{"workflow": h.workflow, "since": instant(h.at)} for h in held],
    }


async def _bindings(context: Context) -> dict[str, JSON]:
    """Unfinished runs holding requests sealed under a binding their connection no longer
    has (an edited baseUrl, identity or parameters): reported, not a reason to be unready,
    since each goes on only where its sealing or an operator says (``retry-same``)."""
    current = {name: p.config.binding() for name, p in context.products.items()}
    try:
        changed = await store.changed_bindings(context.db, current, LISTED)
    except Unavailable:
        return {"ok": True, "detail": "not read: the database is unavailable"}
    if not changed:
        return {"ok": True, "changed": 0}
    names = sorted({str(c.binding["connection"]) for c in changed})
    more = "+" if len(changed) == LISTED else ""
    return {
        "ok": True,
        "changed": len(changed),
        "detail": f"{len(changed)}{more} unfinished runs hold requests sealed under a binding "
        f"since changed (connections {', '.join(names)}; oldest {changed[0].id}): a resend goes "
        "where it was sealed to, and retry-same asks which",
    }


async def scrape(context: Context) -> None:
    """Refresh the gauges that describe the present, just before they are read."""
    metrics = context.metrics
    now = await health_reads.runs_now(context.db)
    if now is not None:
        for state, runs in now.counts.items():
            metrics.runs.labels(state).set(runs)
        metrics.held.set(now.counts[RunState.HELD])
        metrics.held_longest.set(now.held_longest)
    for name, product in context.products.items():
        metrics.pool_size.labels(name).set(product.config.pool_size)
        metrics.pool_in_use.labels(name).set(product.limiter.borrowed_tokens)
        metrics.pool_queued.labels(name).set(
            max(0, product.queued - product.limiter.borrowed_tokens)
        )
        metrics.connection_paused.labels(name).set(1 if product.paused else 0)
        metrics.connection_slowed.labels(name).set(product.pace.pauses)
    metrics.listener.set(1 if context.listener.connected else 0)
