"""Casework's results as the tests bring them to a service: the connection that takes
signed webhooks or pushed completions, a signed delivery, and a pushed ``review.completed``
acknowledged as Casework's outbox expects."""

from __future__ import annotations

from typing import Any

import httpx

from tests.support.config import QUIET
from tests.support.processes import Service
from tests.support.tokens import WEBHOOK_SECRET, completion_request, delivery_request


def reviews(**settings: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """The one connection of a test of results: Casework, accepting webhooks the tests sign."""
    return {"reviews": ("casework", {"webhookSecret": "env:STANDIN_WEBHOOK_SECRET", **settings})}


def pushing(**settings: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """The one connection: Casework, taking its pushed completions with the tests' secret
    (pushed by the test, or by the stand-in when deployed with ``webhooks``), its feed
    and the slow poll quiet unless ``settings`` say otherwise."""
    completions = {"completions": {"secret": "env:STANDIN_WEBHOOK_SECRET"}}
    return {"reviews": ("casework", {**completions, **QUIET, **settings})}


def deliver(
    service: Service,
    body: dict[str, Any],
    *,
    connection_name: str = "reviews",
    secret: str = WEBHOOK_SECRET,
    at: float | None = None,
) -> httpx.Response:
    return service.http.post(**delivery_request(body, connection_name, secret=secret, at=at))


def push(service: Service, request_id: str, event_id: str) -> httpx.Response:
    """Casework's ``review.completed`` for ``request_id``, as its outbox pushes it; it is
    acknowledged with an empty 204 alone, whatever became of it."""
    response = service.http.post(**completion_request(request_id, event_id=event_id))
    assert (response.status_code, response.content) == (204, b""), response.text
    return response
