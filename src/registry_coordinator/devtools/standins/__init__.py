"""Stand-in Registry Stack products: small, real HTTP servers for the demo and the tests.

Each stand-in serves its product's routes on its own port, as the product's published
contract says it answers them (:mod:`.server` holds what they share), keeps its state
in memory, checks the bearer token Coordinator presents, and keeps a ledger of what it
was sent. BReg (:mod:`.breg`) serves records and immediate actions; Casework
(:mod:`.casework`) review requests decided by staff, their results and feed, and pushes
``review.completed`` to its destination; Messaging (:mod:`.messaging`) accepts messages
and lets them be read, sending nothing; Scheduling (:mod:`.scheduling`) offers slots and
books them; and a token endpoint (:mod:`.idp`) issues the tokens they accept. Beside
the products, an office directory (:mod:`.directory`) stands in for an external service
an ``external-http`` connection reads.
"""

from __future__ import annotations

import trio

from registry_coordinator.devtools.standins.breg import BReg
from registry_coordinator.devtools.standins.casework import Casework
from registry_coordinator.devtools.standins.directory import Directory
from registry_coordinator.devtools.standins.idp import IdP
from registry_coordinator.devtools.standins.messaging import Messaging
from registry_coordinator.devtools.standins.scheduling import Scheduling
from registry_coordinator.devtools.standins.server import (
    Client,
    Fault,
    Ledger,
    StandIn,
    Tokens,
    Webhook,
    serve_app,
)

PRODUCTS = ("breg", "casework", "messaging", "scheduling", "external-http")
#: Not a catalog product: an OAuth 2 token endpoint the product stand-ins trust.
IDP = "idp"
#: The products that push what they complete somewhere (a destination URL).
PUSHING = ("casework",)

__all__ = [
    "IDP",
    "PRODUCTS",
    "PUSHING",
    "Client",
    "Fault",
    "Ledger",
    "StandIn",
    "Tokens",
    "Webhook",
    "serve_app",
    "serve_stand_ins",
    "stand_in",
]


def stand_in(
    product: str,
    tokens: Tokens,
    webhook: Webhook | None = None,
    client: Client | None = None,
    delivery_delay: float = 0.5,
) -> StandIn:
    """The stand-in of ``product`` (or of the token endpoint, :data:`IDP`)."""
    match product:
        case "breg":
            return BReg(tokens)
        case "casework":
            return Casework(tokens, webhook)
        case "messaging":
            return Messaging(tokens, delivery_delay)
        case "scheduling":
            return Scheduling(tokens)
        case "external-http":
            return Directory(tokens)
        case "idp":
            return IdP(tokens, client)
    raise ValueError(f"no stand-in for {product!r}: one of {', '.join((*PRODUCTS, IDP))}")


async def serve_stand_ins(
    ports: dict[str, int],
    tokens: Tokens,
    webhooks: dict[str, Webhook],
    host: str = "127.0.0.1",
    client: Client | None = None,
    delivery_delay: float = 0.5,
    *,
    task_status: trio.TaskStatus[dict[str, str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the named products (and the IdP), each on its own port; reports their URLs."""
    async with trio.open_nursery() as nursery:
        urls = {}
        for product, port in ports.items():
            served = stand_in(product, tokens, webhooks.get(product), client, delivery_delay)
            urls[product] = await nursery.start(served.serve, host, port)
        task_status.started(urls)
