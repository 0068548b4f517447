"""The HTTP front end (quart-trio): the route table, and how every error is answered.

Every error a caller can cause is answered with ``application/problem+json``
carrying a stable ``code`` and a ``detail`` that says what to change; nothing a
caller sends produces a 5xx or a stack trace. What the caller cannot change — the
database down, this process shutting down — is 503 with ``Retry-After`` and one log
line. JSON routes take only JSON media types (415 otherwise). The routes are those of
``openapi.yaml``, which ``/openapi.json`` serves and the API fuzzer checks; :data:`ROUTES`
is the one place a route is named, each naming a top-level handler of the shared
:class:`Context` and the route's path parameters (``tests/offline/test_routes.py`` holds the table
and the document together).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from quart import Response, current_app, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from registry_coordinator.custody import Unopenable
from registry_coordinator.http.console import routes as console
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem, data_unopenable
from registry_coordinator.http.requests import RETRY_AFTER, problem, read_whole_body, serving
from registry_coordinator.http.routes import (
    admission,
    approvals,
    bulk,
    connections,
    deliveries,
    probes,
    runs,
    subjects,
)
from registry_coordinator.http.routing import Handler, Route, bound, route
from registry_coordinator.observability import logs, tracing
from registry_coordinator.store.database import Unavailable

__all__ = [
    "ADMIN",
    "FALLBACKS",
    "ROUTES",
    "Context",
    "Handler",
    "Route",
    "create_admin_app",
    "create_app",
    "route",
]

log = logging.getLogger(__name__)

#: Every route of the API, as ``openapi.yaml`` documents it
#: (``tests/offline/test_routes.py`` compares).
ROUTES = (
    route("/v1/runs", post=runs.start, get=runs.listing),
    route("/v1/runs:batch", post=runs.start_batch),  # no slash: never a <run_id> below
    route("/v1/runs/<run_id>", get=runs.status),
    route("/v1/runs/<run_id>/history", get=runs.history),
    route("/v1/runs/<run_id>/cancel", post=runs.cancel),
    route("/v1/runs/<run_id>/retry-same", post=runs.retry_same),
    route("/v1/runs/<run_id>/reconcile", post=runs.reconcile),
    route("/v1/admission/hold", post=admission.hold),
    route("/v1/admission/release", post=admission.release),
    route("/v1/workflows", get=admission.pinned),
    route("/v1/connections", get=connections.listing),
    route("/v1/connections/<name>/pause", post=connections.pause),
    route("/v1/connections/<name>/resume", post=connections.resume),
    route("/v1/approvals", get=approvals.listing),
    route("/v1/approvals/<approval>/<decision>", post=approvals.decision),
    route("/v1/bulk-jobs", post=bulk.create, get=bulk.listing),
    route("/v1/bulk-jobs/<job>", get=bulk.status),
    route("/v1/bulk-jobs/<job>/<change>", post=bulk.change),
    route("/v1/erasures", post=subjects.erase),
    route("/v1/subject-reports", post=subjects.report),
    route("/v1/results/<connection>", post=deliveries.deliver),
    route("/health", get=probes.health),
    route("/ready", get=probes.ready),
    route("/metrics", get=probes.metrics),
    route("/openapi.json", get=probes.openapi),
)
#: Not in the document: any other POST under a run or under /v1/admission is answered
#: 404 ``route.not-found`` naming the action it does not know (werkzeug matches the
#: routes above first), and another method there 405, as on the routes above.
FALLBACKS = (
    route("/v1/runs/<run_id>/<action>", post=runs.unknown_action),
    route("/v1/admission/<change>", post=admission.unknown_change),
    route("/v1/connections/<name>/<action>", post=connections.unknown_action),
)


#: What an admin listener serves (``listen.admin``), and the public one then does not.
ADMIN = ("/ready", "/metrics")


def create_app(context: Context, body_limit: int, *, without: tuple[str, ...] = ()) -> QuartTrio:
    """The service's app; ``without`` the routes served elsewhere (:func:`create_admin_app`)."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = body_limit
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    routes = tuple(r for r in ROUTES if r.path not in without)
    _add(app, (*routes, *FALLBACKS), bound, context)
    _add(app, console.ROUTES, console.bound, context)  # pages for people: refusals as pages
    app.before_request(_started)
    app.before_request(read_whole_body)
    app.after_request(_served)
    app.register_error_handler(Problem, _refused)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Unavailable, _database_unavailable)
    app.register_error_handler(Unopenable, _unopenable)
    return app


def create_admin_app(context: Context) -> QuartTrio:
    """The admin listener's app: /health, /ready and /metrics only, for the machines that
    watch the service, on an address callers do not reach."""
    app = QuartTrio(__name__ + ".admin")
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    probes_only = tuple(r for r in ROUTES if r.path in ("/health", *ADMIN))
    _add(app, probes_only, bound, context)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Unavailable, _database_unavailable)
    return app


#: Routes neither in the access log nor traced: the probes machines ask every few
#: seconds, and the console's static files.
UNLOGGED = ("/health", "/ready", "/metrics", "/console/assets/<version>/<path:name>")


async def _started() -> None:
    g.started = time.perf_counter()
    rule = request.url_rule.rule if request.url_rule is not None else None
    if rule not in UNLOGGED:
        g.serving = tracing.serving(request.method, rule, request.headers)


async def _served(response: Response) -> Response:
    """The access log's line of a request as answered, inside the request's span."""
    rule = request.url_rule.rule if request.url_rule is not None else "(no route)"
    if rule not in UNLOGGED:
        took = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        run = (request.view_args or {}).get("run_id")
        with serving().answered(response.status_code, run):
            logs.request(request.method, rule, response.status_code, g.get("caller"), run, took)
    return response


def _add(
    app: QuartTrio,
    routes: tuple[Route, ...],
    bind: Callable[[Handler, Context], Handler],
    context: Context,
) -> None:
    for each in routes:
        for method, handler in each.methods.items():
            view = bind(handler, context)
            app.add_url_rule(each.path, f"{method} {each.path}", view, methods=[method])


async def _refused(error: Problem) -> Response:
    return problem(error.status, error.code, error.detail, **error.extra)


async def _http_error(error: HTTPException) -> Response:
    status = error.code or 500
    code = {
        404: "route.not-found",
        405: "route.method-not-allowed",
        413: "request.too-large",
        500: "service.internal-error",
    }.get(status, "request.invalid")
    detail = {
        413: f"the body is larger than {current_app.config['MAX_CONTENT_LENGTH']} bytes",
        500: "the service failed to answer (a defect, logged with its cause); "
        "what the request changed, if anything, is in the run's history",
    }.get(status, error.description or "the request was refused")
    response = problem(status, code, detail)
    if status == 413:
        # The rest of the body is left unread: the connection cannot carry another
        # request, so tell the client to open a new one.
        response.headers["Connection"] = "close"
    return response


async def _unopenable(error: Unopenable) -> Response:
    log.error("answered %s %s with 500: %s", request.method, request.path, error)
    return await _refused(data_unopenable(error))


async def _database_unavailable(error: Unavailable) -> Response:
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
