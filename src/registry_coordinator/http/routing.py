"""Routes as data: a path and the top-level handler of each method it takes.

A handler is a function of the shared :class:`Context` and the route's path parameters;
:func:`bound` makes it the view Quart calls. The API's table (``api.ROUTES``) and the
console's (``console.routes.ROUTES``) are both lists of :class:`Route`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from quart import Response

from registry_coordinator.http.context import Context

#: A route's handler: the shared state and the route's path parameters, to a response.
Handler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    """One path of the API and the handler of each method it takes (the Rust coordinator's
    ``.route("/v1/runs", post(start).get(list))``)."""

    path: str  # werkzeug's syntax: <name> is a path parameter, passed to the handler by name
    methods: Mapping[str, Handler]  # by HTTP method, upper case


def route(path: str, **methods: Handler) -> Route:
    """One path and a handler for each method it takes: ``route(path, post=..., get=...)``."""
    return Route(path, {method.upper(): handler for method, handler in methods.items()})


def bound(handler: Handler, context: Context) -> Handler:
    """The view Quart calls with a route's path parameters: ``handler`` given the context."""

    async def view(**parameters: str) -> Response:
        return await handler(context, **parameters)

    return view
