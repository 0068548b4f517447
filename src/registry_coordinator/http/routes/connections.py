"""Connections, as operators see and pause them (``store.pauses``): ``GET
/v1/connections`` lists the configured connections, each with its product and, if it is
paused, since when, by whom and why; ``POST /v1/connections/{name}/pause`` and
``.../resume`` take a reason, for operators only. While a connection is paused no call
is sent over it: runs that come to one wait, nothing is held, and resuming lets them go.
"""

from __future__ import annotations

from quart import Response

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.http.context import Context
from registry_coordinator.http.operations import require_reason
from registry_coordinator.http.problems import Problem
from registry_coordinator.http.requests import authenticated, body_json, instant, json_response
from registry_coordinator.store import pauses


def known(context: Context, name: str) -> None:
    """Refuse (404) a connection ``name`` this service does not configure."""
    if name not in context.products:
        raise Problem(
            404,
            "connection.unknown",
            f"no connection {name}: the configured ones are "
            f"{', '.join(sorted(context.products)) or 'none'}",
        )


async def paused_by_name(context: Context) -> list[tuple[str, str, pauses.Pause | None]]:
    """Every configured connection by name, its product, and its pause if it is paused:
    as the API lists them and the console shows them."""
    paused = {pause.connection: pause for pause in await pauses.paused(context.db)}
    return [(n, p.config.product, paused.get(n)) for n, p in sorted(context.products.items())]


async def listing(context: Context) -> Response:
    """Every configured connection, its product, and its pause if it is paused."""
    who = await authenticated(context)
    who.require_operator()
    listed: list[JSON] = []
    for name, product, pause in await paused_by_name(context):
        listed.append(
            {
                "name": name,
                "product": product,
                "paused": None
                if pause is None
                else {"since": instant(pause.since), "by": pause.actor, "reason": pause.reason},
            }
        )
    return json_response({"connections": listed})


async def _asked(context: Context, name: str) -> tuple[str, str]:
    """Who asks to pause or resume connection ``name`` (an operator), and why."""
    who = await authenticated(context)
    who.require_operator()
    reason = require_reason(await body_json())
    known(context, name)
    return who.actor, reason


async def pause(context: Context, name: str) -> Response:
    """Pause the connection: no call is sent over it until it is resumed."""
    actor, reason = await _asked(context, name)
    paused = await pauses.pause(context.db, name, actor, reason)
    return json_response(
        {
            "name": name,
            "paused": {"since": instant(paused.since), "by": actor, "reason": reason},
        }
    )


async def resume(context: Context, name: str) -> Response:
    """Resume the connection: the runs that waited for it go on at once."""
    resumed = await pauses.resume(context.db, name, *await _asked(context, name))
    return json_response(
        {
            "name": name,
            "wasPaused": resumed.was_paused,
            "pausedSince": None if resumed.since is None else instant(resumed.since),
            "runs": resumed.runs,
        }
    )


async def unknown_action(context: Context, name: str, action: str) -> Response:
    """Any other POST under a connection: no such route, said before asking who calls."""
    raise Problem(404, "route.not-found", f"no connection action {action}: pause or resume")
