"""An external read's connection goes only where its host resolves now and may go.

The call pool of an external connection connects through :class:`destinations.Pinned`:
the host is resolved once more as the connection opens, every address judged, and the
connection made to one of exactly those addresses. A name the test resolves itself
(``directory.invalid``, which no DNS answers) reaches the stand-in directory only if
the pool really connects through the pinned backend; resolved to where cloud metadata
answers, it reaches nothing at all.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from typing import Any

import pytest
import trio

from registry_coordinator.config import EXTERNAL, ConnectionConfig
from registry_coordinator.devtools.standins import Tokens
from registry_coordinator.devtools.standins.directory import PREFIX, Directory
from registry_coordinator.engine import destinations
from registry_coordinator.engine.calls import open_products
from registry_coordinator.semantics.external import Reviewed
from registry_coordinator.semantics.steps import ReplyKind, Request
from tests.support import STANDIN_TOKEN, free_port

HOST = "directory.invalid"


def reviewed_connection(port: int) -> ConnectionConfig:
    return ConnectionConfig(
        "directory",
        EXTERNAL,
        f"http://{HOST}:{port}{PREFIX}",
        None,
        None,
        2,
        timedelta(seconds=2),
        timedelta(seconds=2),
        65536,
        timedelta(minutes=10),
        ("connections", "directory"),
        external=Reviewed(frozenset({"offices"}), frozenset({"district"}), {}),
    )


async def read_offices(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> tuple[Any, list[dict[str, Any]], list[str]]:
    """One read of the directory's offices through an external connection's pool, with
    ``HOST`` resolving to ``address``; the reply, what the directory received, and the
    names the pool asked to have resolved."""
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[destinations.Address]:
        asked.append(host)
        return [ipaddress.ip_address(address)]

    monkeypatch.setattr(destinations, "resolve", resolver)
    port = free_port()
    directory = Directory(Tokens(STANDIN_TOKEN))
    async with trio.open_nursery() as nursery:
        await nursery.start(directory.serve, "127.0.0.1", port)
        config = reviewed_connection(port)
        async with open_products({"directory": config}) as (products, _):
            product = products["directory"]
            request = Request("GET", "/offices?district=north", None, None)
            reply = await product.send(request, product.url(request.target), "")
        nursery.cancel_scope.cancel()
    return reply, directory.ledger.requests, asked


@pytest.mark.trio
async def test_the_pool_connects_to_the_address_it_judged(monkeypatch: pytest.MonkeyPatch) -> None:
    reply, received, asked = await read_offices(monkeypatch, "127.0.0.1")
    assert (reply.kind, reply.status) == (ReplyKind.RESPONSE, 200), reply.detail
    assert [r["path"] for r in received] == [f"{PREFIX}/offices"]
    assert asked == [HOST]


@pytest.mark.trio
@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "::ffff:169.254.1.1"])
async def test_a_host_resolving_where_metadata_answers_is_never_connected(
    monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    """Resolved there only as the connection opens (after the first look passed): the read
    is not sent, and its next attempt's first look refuses it for good."""
    reply, received, _ = await read_offices(monkeypatch, address)
    assert reply.kind is ReplyKind.NOT_SENT
    assert f"resolves to {ipaddress.ip_address(address)}" in reply.detail
    assert received == []
    said = await destinations.refusal(f"http://{HOST}:1/directory")
    assert (
        said == f"{HOST} resolves to {ipaddress.ip_address(address)}, where no external read may go"
    )
