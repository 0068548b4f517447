"""The route table: which (method, path) pairs the API answers, held against openapi.yaml.

The table in ``http.api`` is the one place a route is named, and ``openapi.yaml`` is what
callers and the API fuzzer read; a route in one and not the other is a defect either way.
The requests here never reach the database (they are refused, or dispatched to a handler
that refuses them, before any statement), so the app runs in-process, with no PostgreSQL,
through the same routing and error handlers a served request goes through.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
from quart.typing import TestClientProtocol as Client

from registry_coordinator.config import AuthConfig, ConsoleConfig
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.listener import Listener
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http import api
from registry_coordinator.http.auth import Authenticator
from registry_coordinator.http.console.issuer import Issuer
from registry_coordinator.http.routes.probes import openapi_document
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.store.database import Database

#: auth mode none: every caller is the local developer, an operator with every policy.
NO_AUTH = AuthConfig(
    "none", None, None, None, None, timedelta(hours=1), (), timedelta(minutes=5), timedelta(hours=1)
)
NO_CONSOLE = ConsoleConfig(None, None, ("openid",))


@asynccontextmanager
async def client() -> AsyncIterator[Client]:
    """The app over a pool that is never opened: a request that ran a statement would fail."""
    db = Database("postgresql://unused.invalid/none", 1)
    after = AfterCommit(Metrics())
    timer = Timer(
        db, timedelta(seconds=60), Sleepers(db, Workflows([]), "test", timedelta(seconds=30), after)
    )
    async with httpx.AsyncClient() as http:
        issuer = Issuer(NO_AUTH, NO_CONSOLE, http)
        auth = Authenticator(NO_AUTH, http)
        context = api.Context(
            db,
            Workflows([]),
            timer,
            {},
            Listener(db, timer),
            auth,
            after,
            issuer,
            HighWater(db, None),
        )
        yield api.create_app(context, 1 << 20).test_client()


async def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status
    assert response.content_type == "application/problem+json"
    body: dict[str, Any] = await response.get_json(force=True)
    assert (body["status"], body["code"]) == (status, code)
    return body


def _shape(path: str) -> str:
    """A path with its parameters unnamed: openapi's ``{id}`` and the table's ``<run_id>``."""
    return re.sub(r"\{[^}]+\}|<[^>]+>", "{}", path)


def test_the_route_table_and_the_openapi_document_name_the_same_routes() -> None:
    document = openapi_document()
    documented = {
        (method.upper(), _shape(path))
        for path, operations in document["paths"].items()
        for method in operations
    }
    routed = {
        (method.upper(), _shape(route.path)) for route in api.ROUTES for method in route.methods
    }
    assert routed == documented


def test_every_route_names_a_handler_once() -> None:
    """One handler per action: a handler serving two routes would be dispatching again."""
    handlers = [handler for route in api.ROUTES for handler in route.methods.values()]
    assert len(handlers) == len(set(handlers))


@pytest.mark.trio
@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/v1/runs/0b7e4d59-5e1c-4c69-9d8e-1f2a3b4c5d6e/bogus", "no run action bogus"),
        ("/v1/runs/any/history", "no run action history"),
        ("/v1/admission/bogus", "no admission action bogus"),
    ],
)
async def test_an_unknown_action_is_an_unknown_route(path: str, detail: str) -> None:
    async with client() as http:
        body = await problem(await http.post(path, json={"reason": "x"}), 404, "route.not-found")
    assert body["detail"] == detail


@pytest.mark.trio
@pytest.mark.parametrize(
    "path", ["/v1/runs/any/cancel", "/v1/runs/any/bogus", "/v1/admission/hold", "/v1/admission/x"]
)
async def test_an_action_read_with_get_is_a_method_not_allowed(path: str) -> None:
    async with client() as http:
        await problem(await http.get(path), 405, "route.method-not-allowed")


@pytest.mark.trio
@pytest.mark.parametrize("action", ["cancel", "retry-same", "reconcile"])
async def test_each_run_action_reaches_its_handler(action: str) -> None:
    """A run id that is not a UUID is no run: refused by the handler, before the database."""
    async with client() as http:
        response = await http.post(f"/v1/runs/not-a-run/{action}", json={"reason": "x"})
        body = await problem(response, 404, "run.not-found")
    assert body["detail"] == "no run not-a-run that you may see"


@pytest.mark.trio
@pytest.mark.parametrize("change", ["hold", "release"])
async def test_each_admission_change_reaches_its_handler(change: str) -> None:
    """Without a reason, hold and release are refused before the database."""
    async with client() as http:
        await problem(await http.post(f"/v1/admission/{change}"), 400, "request.reason-missing")


@pytest.mark.trio
async def test_the_probes_and_the_document_need_no_caller() -> None:
    async with client() as http:
        health = await http.get("/health")
        assert (health.status_code, await health.get_json()) == (200, {"status": "ok"})
        document = await http.get("/openapi.json")
        assert await document.get_json() == openapi_document()
