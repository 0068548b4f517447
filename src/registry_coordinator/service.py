"""``coordinator serve``: one Trio nursery supervising the whole service.

Startup is ordered so that nothing is served before it can be trusted: the
configuration and every pinned artifact are verified offline first; then the
database is reached, its server version and schema checked (embedded mode
migrates itself); then the timer, the engine workers and the HTTP front end
start, each reporting readiness through ``task_status.started()``.

SIGTERM or SIGINT starts the graceful shutdown: new starts are refused (503
service.stopping), workers stop claiming and finish the step they are on, calls
in flight get the configured grace period and are then cancelled (recorded as
uncertain), and the rest of the nursery is cancelled. No task outlives it.

Tracing, when on, is set up before anything else (a missing exporter is refused in one
line, before PostgreSQL starts) and flushed last, once every task that makes spans has
ended: the spans of the steps and calls that finished during the shutdown are sent.
"""

from __future__ import annotations

import errno
import logging
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import trio
import trio_asyncio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from opentelemetry.sdk.trace.export import SpanExporter

from registry_coordinator.engine import faults, store, tracing
from registry_coordinator.engine.calls import Product, open_products
from registry_coordinator.engine.checkpoints import Checkpointer
from registry_coordinator.engine.config import Config
from registry_coordinator.engine.database import Database
from registry_coordinator.engine.embedded import EmbeddedPostgres
from registry_coordinator.engine.listener import Listener
from registry_coordinator.engine.metrics import Metrics
from registry_coordinator.engine.migrations import check_server, migrate, require_current
from registry_coordinator.engine.retention import Archiver
from registry_coordinator.engine.systemd import Notifier
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.worker import Engine
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.http.api import Context, create_app
from registry_coordinator.http.auth import Authenticator
from registry_coordinator.http.console.issuer import Issuer

log = logging.getLogger(__name__)


class PortInUse(CoordinatorError):
    """An address to listen on is taken by another process."""

    exit_code = ExitCode.UNAVAILABLE


def require_free(host: str, port: int, given: str, repair: str) -> None:
    """Refuse, in one line, an address another process listens on, before anything is
    started: a bind from the nursery would fail only after PostgreSQL started, and in an
    exception group. (Taken between this check and that bind, it still fails there.)
    Like hypercorn's, the probe reuses an address left in TIME_WAIT."""
    if port == 0:
        return
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortInUse(
                f"{host}:{port} is in use by another process ({given}): stop it, or {repair}"
            ) from None


@asynccontextmanager
async def open_database_unchecked(
    config: Config, application_name: str = "registry-coordinator"
) -> AsyncIterator[Database]:
    """Connect to the configured database, starting the embedded one if asked."""
    embedded = None
    dsn = config.database.dsn
    if config.database.embedded is not None:
        embedded = EmbeddedPostgres(config.database.embedded)
        dsn = await trio.to_thread.run_sync(embedded.start)
    assert dsn is not None
    try:
        db = await Database.open(dsn, config.database.pool_size, application_name)
        try:
            yield db
        finally:
            await db.close()
    finally:
        if embedded is not None:
            await trio.to_thread.run_sync(embedded.stop)


@asynccontextmanager
async def open_database(config: Config, application_name: str) -> AsyncIterator[Database]:
    """The configured database, checked to be PostgreSQL 17+ with this build's schema
    (which the embedded database is migrated to by itself)."""
    async with open_database_unchecked(config, application_name) as db:
        version = await check_server(db)
        if config.database.embedded is not None:
            for migration in await migrate(db):
                log.info("applied schema migration %04d %s", migration.version, migration.name)
        await require_current(db)
        log.info("database ready: PostgreSQL %s", version)
        yield db


async def serve(config: Config, workflows: Workflows, *, spans: SpanExporter | None = None) -> None:
    """The service, until SIGTERM or SIGINT; ``spans`` takes its spans instead of the
    configured exporter (the tests' in-memory one), if tracing is on."""
    holder = store.Holder(f"{socket.gethostname()}:{config.port}")
    async with (
        tracing.started(config.tracing, spans),
        trio_asyncio.open_loop(),
        open_database(config, holder.session) as db,
    ):
        await workflows.store(db)
        taken = await store.take_over(db, holder)
        if taken:
            log.info("took over %d claims left by the previous process on %s", taken, holder.name)
        metrics = Metrics()
        async with open_products(config.connections, metrics) as (products, client):
            await _supervise(config, workflows, db, holder.name, products, client, metrics)
    log.info("stopped")


async def _supervise(
    config: Config,
    workflows: Workflows,
    db: Database,
    owner: str,
    products: dict[str, Product],
    client: httpx.AsyncClient,
    metrics: Metrics,
) -> None:
    """The nursery: timer, listener, call pools, engine workers, lease keeper,
    checkpointer, archiver, HTTP."""
    audit = config.audit
    checkpointer = Checkpointer(db, audit.signing_key, audit.checkpoint_every, metrics)
    metrics.on_end = checkpointer.nudge
    timer = Timer(db, config.engine.sweep_interval, store.actor(owner), metrics)
    holdings = store.Holdings()
    engine = Engine(db, workflows, timer, products, config.engine, metrics, holdings, owner)
    listener = Listener(db, timer)
    auth = Authenticator(config.auth, client)
    issuer = Issuer(config.auth, config.console, client)
    context = Context(db, workflows, timer, products, listener, auth, metrics, issuer)
    app = create_app(context, config.request_body_limit)
    systemd = Notifier()
    systemd.status("starting")
    http = HypercornConfig()
    http.bind = [f"{config.host}:{config.port}"]
    http.accesslog = None
    http.errorlog = logging.getLogger("hypercorn.error")
    http.graceful_timeout = config.engine.shutdown_grace.total_seconds()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(timer.run)
            await nursery.start(listener.run)
            await nursery.start(engine.calls.run)
            await nursery.start(engine.keep_leases)
            await nursery.start(engine.run)
            await nursery.start(checkpointer.run)
            await nursery.start(Archiver(db, config.retention, checkpointer, metrics).run)
            await nursery.start(auth.run)  # the key set is read once before callers are served
            bound = await nursery.start(hypercorn_serve, app, http)
            log.info("listening on %s", " ".join(bound))
            await nursery.start(systemd.watchdog)
            if faults.STALL_SECONDS:
                await nursery.start(faults.stall_on_signal)
            if not listener.connected:
                systemd.status("waiting for the database listener")
                await listener.first_connected.wait()
            systemd.send(
                "READY=1",
                f"STATUS=ready: {' '.join(bound)}, "
                f"{config.engine.workers} workers, {len(workflows.pinned)} workflows",
            )
            async for received in signals:
                log.info("received %s: shutting down", signal.Signals(received).name)
                break
            context.stopping.set()  # no new runs are admitted (503 service.stopping)
            systemd.send("STOPPING=1", "STATUS=stopping: finishing calls in flight")
            # Stop claiming; workers finish the step they are on. Calls in flight get
            # the grace period, then are cancelled and recorded as uncertain.
            engine.stop()
            grace = config.engine.shutdown_grace
            with trio.move_on_after(grace.total_seconds()):
                await engine.stopped.wait()
            await engine.calls.drain(grace)
            nursery.cancel_scope.cancel()
    systemd.close()
