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

A process serves in one of two seats (:class:`Seat`). Alone, it binds ``listen.host`` and
``listen.port`` itself and is the lease holder ``host:port``. As process ``k`` of
``coordinator serve --processes N`` (:mod:`registry_coordinator.processes`), it serves
the sockets its supervisor bound and passed down (hypercorn's ``fd://N``), is the lease
holder ``host:port/k``, and shuts down as on SIGTERM when the supervisor is gone: it never
serves on unsupervised.

Tracing, when on, is set up before anything else (a missing exporter is refused in one
line, before PostgreSQL starts) and flushed last, once every task that makes spans has
ended: the spans of the steps and calls that finished during the shutdown are sent.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import httpx
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from opentelemetry.sdk.trace.export import SpanExporter

from registry_coordinator import store
from registry_coordinator.audit.checkpointer import Checkpointer
from registry_coordinator.audit.retention import Archiver
from registry_coordinator.config import Config, DatabaseConfig
from registry_coordinator.engine import feeds, high_water
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.calls import Product, open_products, read_pauses
from registry_coordinator.engine.listener import Listener
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.worker import Engine
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.http.api import ADMIN, Context, create_admin_app, create_app
from registry_coordinator.http.auth import Authenticator
from registry_coordinator.http.bulk_runner import BulkRunner
from registry_coordinator.http.console.issuer import Issuer
from registry_coordinator.observability import tracing
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.observability.systemd import Notifier
from registry_coordinator.store import faults, keys, poolers
from registry_coordinator.store import timeline as store_timeline
from registry_coordinator.store.database import Database
from registry_coordinator.store.embedded import EmbeddedPostgres
from registry_coordinator.store.migrations import check_server, migrate, require_current

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Seat:
    """Where one service process listens, and who it is as a lease holder."""

    holder: str  # the lease holder's name (``store.Holder``), recorded as its events' actor
    binds: tuple[str, ...]  # hypercorn's: ``host:port``, or ``fd://N`` for a socket passed down
    supervisor: int | None = None  # a pipe's read end whose write end the supervisor holds

    @classmethod
    def alone(cls, config: Config) -> Seat:
        """``coordinator serve`` by itself: it binds its address."""
        return cls(f"{socket.gethostname()}:{config.port}", (f"{config.host}:{config.port}",))

    @classmethod
    def child(cls, index: int, listen: int, supervisor: int, process: int | None) -> Seat:
        """Process ``index`` of a supervisor, on the listening socket ``listen`` it passed
        down (and ``process``, the socket of the port that reaches this process alone). The
        holder is named by the port actually bound, which ``listen.port: 0`` leaves to the
        kernel: every process of one supervisor names the same one."""
        with socket.socket(fileno=os.dup(listen)) as shared:
            port = shared.getsockname()[1]
        extra = () if process is None else (f"fd://{process}",)
        return cls(f"{socket.gethostname()}:{port}/{index}", (f"fd://{listen}", *extra), supervisor)


@asynccontextmanager
async def open_database_unchecked(
    database: DatabaseConfig,
    application_name: str = "registry-coordinator",
    size: int | None = None,
) -> AsyncIterator[Database]:
    """Connect to the configured database, starting the embedded one if asked, with a
    pool of ``size`` connections (the configured ``poolSize`` unless given)."""
    embedded = None
    dsn = database.dsn
    if database.embedded is not None:
        embedded = EmbeddedPostgres(database.embedded)
        dsn = await trio.to_thread.run_sync(embedded.start)
    assert dsn is not None
    try:
        db = await Database(
            dsn,
            size or database.pool_size,
            application_name,
            pooler=database.pooler,
            listen_dsn=database.session_dsn,
        ).open()
        try:
            yield db
        finally:
            await db.close()
    finally:
        if embedded is not None:
            await trio.to_thread.run_sync(embedded.stop)


@asynccontextmanager
async def open_database(
    config: Config, application_name: str, size: int | None = None, *, serving: bool = False
) -> AsyncIterator[Database]:
    """The configured database, checked to be PostgreSQL 17+ with this build's schema
    (which the embedded database is migrated to by itself), behind no pooler in
    transaction mode that the file does not declare (``store.poolers``), with its custody
    keys open (made first by a ``serving`` process, which seals new runs under them)."""
    async with open_database_unchecked(config.database, application_name, size) as db:
        version = await check_server(db)
        pooler = await poolers.judge(db, config.database)
        if config.database.embedded is not None:
            for migration in await migrate(db):
                log.info("applied schema migration %04d %s", migration.version, migration.name)
        await require_current(db)
        db.sealer = await keys.open_custody(db, config.custody, make=serving)
        log.info("database ready: PostgreSQL %s; %s", version, pooler)
        yield db


async def serve(
    config: Config,
    workflows: Workflows,
    seat: Seat | None = None,
    *,
    spans: SpanExporter | None = None,
    recovery_only: bool = False,
) -> None:
    """The service in ``seat`` (alone unless given), until SIGTERM or SIGINT (or, as a
    supervisor's process, until the supervisor is gone); ``spans`` takes its spans instead
    of the configured exporter (the tests' in-memory one), if tracing is on. With
    ``recovery_only``, or while a restored database's recovery is open, it serves
    operators only: nothing is dispatched, no run is admitted."""
    seat = seat or Seat.alone(config)
    holder = store.Holder(seat.holder)
    async with (
        tracing.started(config.tracing, spans),
        open_database(config, holder.session, serving=True) as db,
    ):
        await workflows.store(db)
        restore = await high_water.judge(db, config.database.high_water, holder.name)
        recovery = _recovery(restore, recovery_only)
        taken = await store.take_over(db, holder)
        if taken:
            log.info("took over %d claims left by the previous process on %s", taken, holder.name)
        metrics = Metrics()
        async with open_products(config.connections, metrics) as (products, client):
            await _supervise(config, workflows, db, seat, products, client, metrics, recovery)
    log.info("stopped")


def _recovery(restore: store_timeline.Restore | None, recovery_only: bool) -> str | None:
    """Why this process serves operators only, or None if it serves everyone."""
    if restore is not None:
        return (
            f"the database was restored from a backup (recognised at "
            f"{restore.detected_at.isoformat()}): {restore.still_held} of {restore.held} runs "
            "held restored-review are still to be reviewed; end the recovery with "
            "coordinator recovery end --reason ..., then restart"
        )
    if recovery_only:
        return "started with --recovery-only: restart without it to dispatch and admit"
    return None


async def _supervise(
    config: Config,
    workflows: Workflows,
    db: Database,
    seat: Seat,
    products: dict[str, Product],
    client: httpx.AsyncClient,
    metrics: Metrics,
    recovery: str | None,
) -> None:
    """The nursery: timer, listener, call pools, engine workers, lease keeper, the
    high-water mark, feeds, bulk jobs, checkpointer, archiver, HTTP — without the timer,
    the engine, the mark, the feeds and bulk jobs while ``recovery`` says why this process
    serves operators only. Longer than most (about 80 lines) on purpose: the order tasks
    start in and the order the service stops in are read, and changed, side by side."""
    owner = seat.holder
    audit = config.audit
    checkpointer = Checkpointer(db, audit.signing_key, audit.checkpoint_every, metrics)
    # Every commit is followed by the same (metrics, logs, spans); a run's end also nudges
    # the checkpointer, so ended runs' heads are signed soon after.
    after = AfterCommit(metrics, ended=checkpointer.nudge)
    sleepers = Sleepers(db, workflows, owner, config.engine.lease, after)
    timer = Timer(db, config.engine.sweep_interval, sleepers)
    holdings = store.Holdings()
    mark = high_water.HighWater(db, config.database.high_water)
    engine = Engine(
        db, workflows, timer, products, config.engine, after.telling(timer), holdings, owner, mark
    )
    listener = Listener(db, timer, partial(read_pauses, db, products))
    auth = Authenticator(config.auth, client)
    issuer = Issuer(config.auth, config.console, client)
    context = Context(db, workflows, timer, products, listener, auth, after, issuer, mark)
    context.recovery = recovery
    context.signing_key = config.audit.signing_key
    context.archive = config.retention.directory
    bulk = BulkRunner(context, owner)
    context.bulk_started = listener.bulk = bulk.tell
    app = create_app(context, config.request_body_limit, without=ADMIN if config.admin else ())
    systemd = Notifier()
    systemd.status("starting")
    http = _public_listener(config, seat)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            if recovery is None:
                await nursery.start(timer.run)
                await nursery.start(mark.run)
                await nursery.start(engine.calls.run)
                await nursery.start(engine.keep_leases)
                await nursery.start(engine.run)
                for follower in feeds.followers(db, products, timer):
                    await nursery.start(follower.run)
                await nursery.start(bulk.run)
            else:
                log.warning("serving operators only: %s", recovery)
            await nursery.start(checkpointer.run)
            await nursery.start(Archiver(db, config.retention, checkpointer, metrics).run)
            await nursery.start(auth.run)  # the key set is read once before callers are served
            bound = await nursery.start(hypercorn_serve, app, http)
            log.info("listening on %s", " ".join(bound))
            if config.admin is not None:
                admin = _listener([f"{config.admin[0]}:{config.admin[1]}"])
                served = await nursery.start(hypercorn_serve, create_admin_app(context), admin)
                log.info("serving /health, /ready and /metrics on %s", " ".join(served))
            # What startup made (modules, schemas, compiled expressions) lives as long as
            # the process: kept out of the cyclic collector's full passes, which paused the
            # event loop 55-75 ms each (about 5 ms after; docs/performance.md).
            gc.freeze()
            await nursery.start(systemd.watchdog)
            if faults.STALL_SECONDS:
                await nursery.start(faults.stall_on_signal)
            if not listener.connected:
                systemd.status("waiting for the database listener")
                await listener.first_connected.wait()
            serving = (
                f"{config.engine.workers} workers, {len(workflows.pinned)} workflows"
                if recovery is None
                else "operators only (recovery)"
            )
            systemd.send("READY=1", f"STATUS=ready: {' '.join(bound)}, {serving}")
            stop = trio.Event()
            nursery.start_soon(_until_signalled, signals, stop)
            if seat.supervisor is not None:
                nursery.start_soon(_until_orphaned, seat.supervisor, stop)
            await stop.wait()
            context.stopping.set()  # no new runs are admitted (503 service.stopping)
            systemd.send("STOPPING=1", "STATUS=stopping: finishing calls in flight")
            if recovery is None:
                await _drain(engine, config.engine.shutdown_grace)
            nursery.cancel_scope.cancel()
    systemd.close()


def _listener(binds: list[str]) -> HypercornConfig:
    """A hypercorn listener on ``binds``: its errors in our log, no access log of its own
    (``registry_coordinator.access`` has one line per request)."""
    listener = HypercornConfig()
    listener.bind = binds
    listener.accesslog = None
    listener.errorlog = logging.getLogger("hypercorn.error")
    return listener


def _public_listener(config: Config, seat: Seat) -> HypercornConfig:
    """The API's listener on the seat's binds, HTTPS on each with ``listen.tls``, giving
    requests in progress the shutdown grace."""
    http = _listener(list(seat.binds))
    if config.tls is not None:  # every bind serves HTTPS (hypercorn wraps each socket)
        http.certfile, http.keyfile = str(config.tls.certificate), str(config.tls.key)
    http.graceful_timeout = config.engine.shutdown_grace.total_seconds()
    return http


async def _drain(engine: Engine, grace: timedelta) -> None:
    """Stop claiming; workers finish the step they are on. Calls in flight get the grace
    period, then are cancelled and recorded as uncertain."""
    engine.stop()
    with trio.move_on_after(grace.total_seconds()):
        await engine.stopped.wait()
    await engine.calls.drain(grace)


async def _until_signalled(signals: AsyncIterator[int], stop: trio.Event) -> None:
    async for received in signals:
        log.info("received %s: shutting down", signal.Signals(received).name)
        stop.set()
        return


async def _until_orphaned(pipe: int, stop: trio.Event) -> None:
    """Until the supervisor is gone: it writes nothing to the pipe, and the end of the pipe
    comes when the one write end, the supervisor's, is closed as it exits however it exits
    (SIGKILL included). Its processes then shut down as on SIGTERM."""
    async with trio.lowlevel.FdStream(pipe) as stream:
        while await stream.receive_some():
            pass
    log.warning("the supervisor is gone: shutting down")
    stop.set()
