"""``coordinator doctor --config FILE``: everything a start needs, looked at, one line each.

It reads the configuration (and so every secret it names), the pinned artifacts and their
bindings, saying every problem of each at once as ``coordinator serve`` would refuse them,
whether spans can be sent where tracing says, and the listen address; then reaches the
database (its server version and the schema), each connection's product (its base URL
answering, over valid TLS, and its service identity getting a token) and the issuer's key
set. Nothing is changed anywhere: no migration runs, no request a product could act on is
sent (a product is asked with a GET of its base URL, whatever it answers), and the embedded
database is only started and stopped. Each line is ``ok``, or ``FAIL`` with the repair; the
exit code is 0 when all are ok, 1 when something is refused (fix the configuration, an
artifact, the schema, a credential), and 3 when something is only unreachable now.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from registry_coordinator.addresses import PortInUse, require_free
from registry_coordinator.config import Config
from registry_coordinator.engine import destinations
from registry_coordinator.engine.calls import open_products
from registry_coordinator.engine.identity import IdentityRefused, IdentityUnavailable
from registry_coordinator.engine.workflows import read_service
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.http.auth import KeySet
from registry_coordinator.observability.tracing import OTLP_EXPORTER
from registry_coordinator.service import open_database_unchecked
from registry_coordinator.store.database import Database
from registry_coordinator.store.migrations import check_server, known, pending


@dataclass
class Findings:
    """The lines said so far, and the worst of them."""

    refused: int = 0
    unavailable: int = 0
    lines: list[str] = field(default_factory=list)

    def ok(self, what: str) -> None:
        self._say(f"ok    {what}")

    def refuse(self, what: str, repair: str) -> None:
        self.refused += 1
        self._say(f"FAIL  {what}: {repair}")

    def unreachable(self, what: str, repair: str) -> None:
        self.unavailable += 1
        self._say(f"FAIL  {what}: {repair}")

    def _say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def exit_code(self) -> int:
        if self.refused:
            return ExitCode.INVALID
        return ExitCode.UNAVAILABLE if self.unavailable else ExitCode.OK


def _offline(path: Path, found: Findings) -> Config | None:
    """The configuration, the pinned artifacts and their bindings, every problem of each
    (as far as the structure lets each be looked at); the Config when its structure holds."""
    reading, workflows = read_service(path)
    problems = reading.problems
    for d in problems.of("configuration"):
        found.refuse(f"configuration: {d.as_text().splitlines()[0]}", d.repair)
    if reading.config is not None:
        found.ok(f"configuration {reading.config.file} (secrets it names are readable)")
    for d in problems.of("workflows"):
        found.refuse(f"workflows: {d.as_text().splitlines()[0]}", d.repair)
    for pin in workflows.pinned:
        definition = pin.definition
        found.ok(f"workflow {definition.id} {definition.version}: {pin.digest}")
    for d in problems.of("connections"):
        found.refuse(f"connections: {d.as_text().splitlines()[0]}", d.repair)
    if reading.config is not None and not problems.of("connections"):
        bound = len(reading.config.connections)
        found.ok(f"every workflow's connections are bound ({bound} bound)")
    return reading.config


def _tracing(config: Config, found: Findings) -> None:
    """Spans can be sent where the configuration says: the OTLP exporter, an optional extra,
    is installed (``serve`` would refuse to start without it)."""
    endpoint = config.tracing.otlp_endpoint
    if not config.tracing.enabled:
        return
    if endpoint is None:
        found.ok("tracing: spans are made, for logs and products, and sent nowhere")
    elif not _installed(OTLP_EXPORTER):
        found.refuse(
            f"tracing: spans go to {endpoint}, but the OTLP exporter is not installed",
            "pip install 'registry-coordinator[otlp]'",
        )
    else:
        found.ok(f"tracing: spans go to {endpoint} over OTLP/HTTP")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _listen(config: Config, found: Findings) -> None:
    try:
        require_free(config.host, config.port, "listen.host, listen.port", "another port")
        found.ok(f"{config.host}:{config.port} is free to listen on")
    except PortInUse as busy:
        found.unreachable(f"listen address: {busy}", "stop what holds it, or change listen")


async def _database(config: Config, found: Findings) -> None:
    try:
        async with open_database_unchecked(config, "coordinator/doctor") as db:
            await _schema(db, found)
    except CoordinatorError as exc:
        found.unreachable(f"database: {exc.line()}", "start it, or correct database.dsn")


async def _schema(db: Database, found: Findings) -> None:
    try:
        version = await check_server(db)
        found.ok(f"database: PostgreSQL {version}")
        missing = await pending(db)
    except CoordinatorError as exc:
        found.refuse(f"database: {exc}", "see docs/operations.md, 'The database schema'")
        return
    if missing:
        found.refuse(
            f"schema: at version {missing[0].version - 1}, this build needs {known()[-1].version}",
            "run coordinator migrate --config FILE",
        )
    else:
        found.ok(f"schema: version {known()[-1].version}, this build's")


async def _products(config: Config, found: Findings) -> None:
    async with open_products(config.connections) as (products, client):
        for name, product in sorted(products.items()):
            where = f"connection {name} ({product.config.product}, {product.config.base_url})"
            if product.config.external is not None:
                # Nothing but a reviewed path is ever read from an external service: its
                # host is only resolved and judged, as before each read.
                if not await _destination(product.config.base_url, where, found):
                    continue
            else:
                try:
                    answer = await product.client.get(product.config.base_url + "/")
                    found.ok(f"{where}: reachable (HTTP {answer.status_code})")
                except httpx.HTTPError as exc:
                    repair = "is it up, is baseUrl right, and is its TLS certificate valid?"
                    found.unreachable(f"{where}: {type(exc).__name__}: {exc}", repair)
                    continue
            if product.config.identity is None:
                found.ok(f"connection {name}: a public read, with no identity")
                continue
            identities = [("identity", product.credentials)]
            if product.observer is not product.credentials:
                identities.append(("observationIdentity", product.observer))
            for what, credentials in identities:
                try:
                    await credentials.authorization()
                    found.ok(f"connection {name}: its {what} has a token")
                except IdentityRefused as exc:
                    found.refuse(
                        f"connection {name}: {what} refused: {exc}", "check its credentials"
                    )
                except IdentityUnavailable as exc:
                    found.unreachable(f"connection {name}: no token: {exc}", "is the issuer up?")
        if config.auth.mode == "jwt":
            keys = await KeySet(config.auth, client).check()
            if keys["ok"]:
                found.ok(f"auth: {keys['detail']}")
            else:
                found.unreachable(f"auth: {keys['detail']}", "check auth.jwksFile or jwksUrl")


async def _destination(url: str, where: str, found: Findings) -> bool:
    """Whether an external connection's host resolves where reads may go."""
    try:
        refused = await destinations.refusal(url)
    except destinations.Unresolved as exc:
        found.unreachable(f"{where}: {exc}", "is baseUrl's host name right, and is DNS up?")
        return False
    if refused is not None:
        found.refuse(f"{where}: {refused}", "point baseUrl at the reviewed service's address")
        return False
    found.ok(f"{where}: resolves where external reads may go")
    return True


def doctor(path: Path) -> int:
    """Look at everything ``coordinator serve --config path`` needs; the exit code."""
    found = Findings()
    config = _offline(path, found)
    if config is None:  # nothing to reach without a configuration that holds
        print(f"{found.refused} of {len(found.lines)} checks failed", file=sys.stderr)
        return found.exit_code()
    _tracing(config, found)
    _listen(config, found)

    async def online() -> None:
        await _database(config, found)
        await _products(config, found)

    trio.run(online)
    summary = (
        "everything a start needs is in place"
        if found.exit_code() == ExitCode.OK
        else f"{found.refused + found.unavailable} of {len(found.lines)} checks failed"
    )
    print(summary, file=sys.stderr)
    return found.exit_code()
