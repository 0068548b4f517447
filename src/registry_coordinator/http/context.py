"""The shared state every handler is given: the service's parts, built once before it serves.

Handlers are top-level functions of this and their path parameters (``http.api`` binds
them to it in the route table); they keep no state of their own between requests, so what
a request can reach is exactly what is here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.calls import Product
from registry_coordinator.engine.high_water import HighWater
from registry_coordinator.engine.listener import Listener
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.auth import Authenticator
from registry_coordinator.http.console.issuer import Issuer
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.store.database import Database


@dataclass
class Context:
    """What the handlers work with; built by the service before it serves."""

    db: Database
    workflows: Workflows
    timer: Timer
    products: dict[str, Product]
    listener: Listener
    auth: Authenticator
    after: AfterCommit  # told of what the handlers commit: an operator's cancel
    issuer: Issuer  # where the console's people sign in
    high_water: HighWater  # whose failures /ready reports
    stopping: trio.Event = field(default_factory=trio.Event)  # set when shutdown begins
    #: Why this process serves operators only (no run admitted, nothing dispatched), or None.
    recovery: str | None = None
    #: The audit key subject reports are signed with (None: none is configured).
    signing_key: Ed25519PrivateKey | None = None
    #: Where archived runs' bundles are (``retention.directory``; None: not configured).
    archive: Path | None = None
    #: Tells this process's bulk runner that a job was started or resumed.
    bulk_started: Callable[[], None] = field(default=lambda: None)  # (none: nothing to tell)

    @property
    def metrics(self) -> Metrics:
        return self.after.metrics
