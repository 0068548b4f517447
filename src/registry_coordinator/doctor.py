"""``coordinator doctor --config FILE``: everything a start needs, looked at, one line each.

It reads the configuration (and so every secret it names), the pinned artifacts and their
bindings, saying every problem of each at once as ``coordinator serve`` would refuse them,
whether spans can be sent where tracing says, and the listen address; then reaches the
database (its server version and the schema), each connection's product (its base URL
answering, over valid TLS, and its service identity getting a token) and the issuer's key
set, and the high-water mark against the database (a database restored from a backup, a
recovery still open). Nothing is changed anywhere: no migration runs, no request a product
could act on is sent (a product is asked with a GET of its base URL, whatever it answers),
and the embedded database is only started and stopped. What the file points at is looked
at as far as its sections parse, whatever else is wrong with it, so one pass says every
problem; a file refused anyway starts nothing (not the embedded database). Each line is
``ok``, ``WARN`` with advice (not a failure), or ``FAIL`` with the repair; the exit code is
0 when none failed, 1 when something is refused
(fix the configuration, an artifact, the schema, a credential, the DSN), and 3 when
something is only unreachable now.

``serve`` refusing a file says what :func:`add_unreachable` finds with the rest, from the
same probes as these lines.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio

from registry_coordinator import store
from registry_coordinator.addresses import PortInUse, require_free
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.config import (
    AuthConfig,
    Config,
    ConfigReading,
    ConnectionConfig,
    CustodyConfig,
    DatabaseConfig,
)
from registry_coordinator.custody import Unopenable
from registry_coordinator.engine import destinations
from registry_coordinator.engine.calls import open_products
from registry_coordinator.engine.high_water import MarkUnusable, read_mark
from registry_coordinator.engine.identity import IdentityRefused, IdentityUnavailable
from registry_coordinator.engine.workflows import read_service
from registry_coordinator.errors import CoordinatorError, ExitCode
from registry_coordinator.http.auth import KeySet
from registry_coordinator.observability.tracing import OTLP_EXPORTER
from registry_coordinator.service import open_database_unchecked
from registry_coordinator.store import keys, poolers, roles, timeline
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

    def warn(self, what: str, advice: str) -> None:
        """Something a start does not need but an operator must know: not a failure."""
        self._say(f"WARN  {what}: {advice}")

    def _say(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def exit_code(self) -> int:
        if self.refused:
            return ExitCode.INVALID
        return ExitCode.UNAVAILABLE if self.unavailable else ExitCode.OK


def _offline(path: Path, found: Findings) -> ConfigReading:
    """The configuration, the pinned artifacts and their bindings, every problem of each
    (as far as the structure lets each be looked at)."""
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
    return reading


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


def listen_taken(host: str, port: int) -> PortInUse | None:
    """Why the listen address cannot be listened on, if another process holds it."""
    try:
        require_free(host, port, "listen.host, listen.port", "give listen.port another port")
    except PortInUse as busy:
        return busy
    return None


def _listen(host: str, port: int, found: Findings) -> None:
    busy = listen_taken(host, port)
    if port == 0:
        found.ok(f"listen {host}, port 0: a free port is picked at each start")
    elif busy is None:
        found.ok(f"{host}:{port} is free to listen on")
    else:
        found.unreachable(f"listen address: {busy.what}", busy.repair)


def database_repair(exc: CoordinatorError) -> str:
    """What to do about a database that could not be opened: an outage passes, a refused
    connection (no such database or role, a wrong password) needs the DSN changed."""
    if exc.exit_code == ExitCode.UNAVAILABLE:
        return "start it, or correct database.dsn"
    return "correct database.dsn, or create what it names"


async def _database(
    database: DatabaseConfig,
    connections: dict[str, ConnectionConfig],
    custody: CustodyConfig | None,
    found: Findings,
) -> None:
    try:
        async with open_database_unchecked(database, "coordinator/doctor", size=1) as db:
            if await _schema(db, found):
                if database.embedded is None:
                    await _pooler(db, database, found)
                    await _role(db, found)
                await _timeline(db, database, found)
                if custody is None or await _custody(db, custody, found):
                    await _bindings(db, connections, found)
    except CoordinatorError as exc:
        say = found.unreachable if exc.exit_code == ExitCode.UNAVAILABLE else found.refuse
        say(f"database: {exc.line()}", database_repair(exc))


def add_unreachable(reading: ConfigReading) -> None:
    """Add to the problems of a start refused anyway what the file points at and cannot be
    reached now: the listen address another process holds, a database that cannot be
    reached or refuses. The embedded database is not started for it: ``serve`` starts
    it itself."""
    problems = reading.problems
    if reading.listen is not None and (busy := listen_taken(*reading.listen)) is not None:
        problems.report("reach", "config.listen-in-use", busy.what, busy.repair, ("listen", "port"))
    database = reading.database
    if database is None or database.embedded is not None:
        return

    async def reach() -> CoordinatorError | None:
        try:
            async with open_database_unchecked(database, "coordinator/serve", size=1):
                return None
        except CoordinatorError as exc:
            return exc

    if (failed := trio.run(reach)) is not None:
        problems.report(
            "reach",
            "config.database-unreachable",
            f"database.dsn: {failed.line()}",
            database_repair(failed),
            ("database", "dsn"),
        )


async def _schema(db: Database, found: Findings) -> bool:
    """Whether the database has this build's schema, said."""
    try:
        version = await check_server(db)
        found.ok(f"database: PostgreSQL {version}")
        missing = await pending(db)
    except CoordinatorError as exc:
        found.refuse(f"database: {exc}", "see docs/operations.md, 'The database schema'")
        return False
    if missing:
        found.refuse(
            f"schema: at version {missing[0].version - 1}, this build needs {known()[-1].version}",
            "run coordinator migrate --config FILE",
        )
        return False
    found.ok(f"schema: version {known()[-1].version}, this build's")
    return True


async def _bindings(
    db: Database, connections: dict[str, ConnectionConfig], found: Findings
) -> None:
    """Unfinished runs whose requests were sealed under a binding the file no longer gives
    their connection: a resend would go where it was sealed to."""
    current = {name: connection.binding() for name, connection in connections.items()}
    changed = await store.changed_bindings(db, current)
    if not changed:
        found.ok("every unfinished run's sealed request has its connection's binding")
        return
    first = changed[0]
    now = current.get(str(first.binding["connection"]))
    found.warn(
        f"{len(changed)} unfinished runs hold requests sealed under a binding since changed "
        f"(run {first.id}: sealed to {first.binding['baseUrl']} over "
        f"{first.binding['connection']}, now "
        f"{now['baseUrl'] if now else 'not configured'})",
        "a resend goes where it was sealed to; retry-same of a held one asks which "
        '({"binding": "sealed"} or "current")',
    )


async def _custody(db: Database, custody: CustodyConfig, found: Findings) -> bool:
    """The database's data keys held against the configured KEKs, as ``serve`` will
    unwrap them, and keys left under a version other than the active one; whether they
    opened (``db`` can then read sealed requests, and makes no key)."""
    try:
        counts = await keys.versions(db, custody)
        db.sealer = await keys.open_custody(db, custody, make=False)
    except Unopenable as exc:
        found.refuse(
            f"custody: {exc}",
            "list every key-encryption key that wraps a data key under custody.keys "
            "(docs/operations.md, 'Personal data at rest')",
        )
        return False
    if custody.active is None:
        found.warn(
            "custody is not configured: runs' inputs and outputs are stored in clear",
            "make a key-encryption key (coordinator keys generate) and give custody: "
            '{keys: {"1": file:/path}, active: 1}',
        )
        return True
    others = {v: n for v, n in counts.items() if v != custody.active}
    if others:
        found.warn(
            f"{keys.counted(sum(others.values()))} wrapped under key-encryption key "
            f"{', '.join(map(str, sorted(others)))}, not the active {custody.active}",
            "run coordinator keys rotate --config FILE",
        )
        return True
    held = counts.get(custody.active, 0)
    found.ok(
        f"custody: {keys.counted(held)}, all under key-encryption key {custody.active}"
        if held
        else f"custody: no data key yet; serve makes one under key-encryption key {custody.active}"
    )
    return True


async def _pooler(db: Database, database: DatabaseConfig, found: Findings) -> None:
    """What stands between serve and PostgreSQL, held against what the file declares."""
    try:
        found.ok(await poolers.judge(db, database))
    except poolers.PoolerRefused as exc:
        found.refuse(exc.what, exc.repair)


async def _role(db: Database, found: Findings) -> None:
    """The role serve connects as, held against what it needs and must not have."""
    judged = await roles.judge(db)
    where = "docs/operations.md, 'Database roles'"
    if judged.owner:
        found.warn(
            f"serve connects as {judged.role}, which owns the schema or is a superuser: it "
            "could change the schema and rewrite history",
            f"give serve a runtime role, and migrate database.migrationDsn ({where})",
        )
        return
    if judged.missing:
        found.refuse(
            f"serve's role {judged.role} lacks {', '.join(judged.missing)}",
            f"run coordinator migrate with database.migrationDsn set, or the GRANTs of {where}",
        )
    if judged.excess:
        found.warn(
            f"serve's role {judged.role} may also {', '.join(judged.excess)}",
            "revoke them: serve needs none, and history must not be changed",
        )
    if not judged.missing and not judged.excess:
        found.ok(f"serve's role {judged.role} has what it needs and cannot change history")


async def _timeline(db: Database, database: DatabaseConfig, found: Findings) -> None:
    """The high-water mark held against the database, as ``serve`` will hold it (without
    writing either), and a restored database's recovery still open."""
    path = database.high_water
    line = await timeline.timeline(db)
    if path is None:
        if database.embedded is None:
            found.warn(
                "database.highWaterMark is not set",
                "a database restored from a backup cannot be recognised, and runs it forgot "
                "the progress of would send again; set it to a file off the database's disks",
            )
    else:
        try:
            mark = await trio.to_thread.run_sync(read_mark, path)
        except MarkUnusable as exc:
            found.refuse(f"high-water mark: {exc}", "see docs/operations.md, 'Restoring a backup'")
            return
        if mark is None:
            found.ok(f"high-water mark: none yet at {path}; serve makes it at epoch {line.epoch}")
        elif mark.installation != line.installation:
            found.refuse(
                f"high-water mark {path} belongs to database {mark.installation}, and this "
                f"database is {line.installation}",
                "point database.highWaterMark at this database's own mark",
            )
        elif mark.epoch > line.epoch:
            found.warn(
                f"the database was restored from a backup: its timeline is at {line.epoch}, "
                f"the high-water mark {path} at {mark.epoch}",
                "serve will hold its unfinished runs restored-review and serve operators only "
                "(docs/operations.md, 'Restoring a backup')",
            )
        else:
            found.ok(f"high-water mark {path}: epoch {mark.epoch}, the database's {line.epoch}")
    restore = await timeline.open_restore(db)
    if restore is not None:
        found.warn(
            f"recovery {restore.number} is open since {restore.detected_at.isoformat()}: "
            f"{restore.still_held} of {restore.held} runs still held restored-review",
            "serve serves operators only until coordinator recovery end --reason ...",
        )


async def _products(
    connections: dict[str, ConnectionConfig], auth: AuthConfig | None, found: Findings
) -> None:
    async with open_products(connections) as (products, client):
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
        if auth is not None and auth.mode == "jwt":
            keys = await KeySet(auth, client).check()
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
    reading = _offline(path, found)
    config = reading.config
    if config is not None:
        _tracing(config, found)
    # What the file points at is looked at as far as its sections parsed, whatever else
    # is wrong with it: every problem in one pass. A file refused anyway starts nothing
    # (not the embedded database, which would make its data directory), and only the
    # connections bound to a product kind there is are asked.
    if reading.listen is not None:
        _listen(*reading.listen, found)
    database = reading.database
    if config is None and database is not None and database.embedded is not None:
        database = None
    kinds = builtin_catalog().products
    connections = {n: c for n, c in reading.connections.items() if c.product in kinds}

    async def online() -> None:
        if database is not None:
            custody = config.custody if config is not None else None
            await _database(database, reading.connections, custody, found)
        auth = config.auth if config is not None else None
        await _products(connections, auth, found)

    trio.run(online)
    summary = (
        "everything a start needs is in place"
        if found.exit_code() == ExitCode.OK
        else f"{found.refused + found.unavailable} of {len(found.lines)} checks failed"
    )
    print(summary, file=sys.stderr)
    return found.exit_code()
