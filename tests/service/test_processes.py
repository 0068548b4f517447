"""``coordinator serve --processes 2``: two service processes on one port under a supervisor.

Real processes and signals: the supervisor binds the port once and its two children serve
it, each its own lease holder (``host:port/0`` and ``host:port/1``); the test acts as
systemd on a notify socket of its own. One start covers the whole life: starts through
the one port, the work shared, a child SIGKILLed mid-load (nothing lost, no mutation
applied twice, the child started again and taking over its predecessor's claims), a
child whose event loop is stuck killed for its silent watchdog and started again, and
SIGTERM stopping everything with exit 0. The refusals a supervisor makes before any child
starts, and its giving up on children that keep failing at startup, cost no service start.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from registry_coordinator import store
from registry_coordinator.store.database import sync_connection
from tests.support import (
    Cluster,
    Services,
    connection,
    coordinator,
    coordinator_process,
    free_port,
    process_env,
    stand_ins,
    wait_for,
)

READ_DELAY = 0.5  # seconds BReg holds each read: claims are held long enough to be seen
STALL = 6.0  # seconds a child's event loop is blocked
WATCHDOG = 2.0  # the watchdog interval systemd would give (children ping every half)
FIRST_BATCH, SECOND_BATCH = 40, 20


def consecutive_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (``--process-ports`` wants them so)."""
    while True:
        ports = [free_port() for _ in range(count)]
        if ports == list(range(ports[0], ports[0] + count)):
            return ports[0]


def started_counts(first: int, count: int) -> list[float]:
    """Each child's ``coordinator_runs_started_total``, read from its own port."""
    found = []
    for k in range(count):
        text = httpx.get(f"http://127.0.0.1:{first + k}/metrics", timeout=10).text
        found.append(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                if family.name == "coordinator_runs_started"
                for sample in family.samples
                if sample.name == "coordinator_runs_started_total"
            )
        )
    return found


class Systemd:
    """The test acting as systemd: a datagram socket the supervisor notifies, read on a
    thread of its own all along (unread, its queue would fill with watchdog pings and a
    later line be dropped)."""

    def __init__(self, address: Path) -> None:
        self.address = address
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(address))
        self.lines: list[str] = []
        self._said = threading.Condition()  # notified by the reader at every message
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError):  # closed
            while message := self.socket.recv(4096):
                with self._said:
                    self.lines += message.decode().splitlines()
                    self._said.notify_all()

    def until(self, line: str, timeout: float = 120) -> None:
        """Until the supervisor has said ``line`` (``timeout``: a hang guard only)."""
        with self._said:
            said = self._said.wait_for(lambda: line in self.lines, timeout)
        assert said, f"no {line} within {timeout}s: {self.lines}"

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)
        self.socket.close()
        self._reader.join(10)


class Supervised:
    """``coordinator serve --processes N`` and what its log says of its children."""

    def __init__(self, config: Path, log: Path, count: int, env: dict[str, str]) -> None:
        self.log = log
        self.count = count
        self.process_ports = consecutive_ports(count)
        args = ["serve", "--config", str(config), "--processes", str(count)]
        args += ["--process-ports", str(self.process_ports)]
        self.process = coordinator_process(args, log, env)
        self.url = f"http://127.0.0.1:{json.loads(config.read_text())['listen']['port']}"

    def lines(self) -> list[dict[str, Any]]:
        """The JSON lines the supervisor and its children wrote to their shared stderr."""
        lines = self.log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def messages(self) -> list[str]:
        return [line["message"] for line in self.lines()]

    def pids(self) -> dict[int, list[int]]:
        """Every process each child seat had, in order, from the supervisor's log."""
        found: dict[int, list[int]] = {k: [] for k in range(self.count)}
        for message in self.messages():
            if message.startswith("process ") and " started: pid " in message:
                index, pid = message.removeprefix("process ").split(" started: pid ")
                found[int(index)].append(int(pid))
        return found

    def wait_log(self, predicate: Any, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.messages()):
            assert self.process.poll() is None, f"the supervisor exited:\n{self.log.read_text()}"
            assert time.monotonic() < deadline, f"{what}:\n{self.log.read_text()}"
            time.sleep(0.1)

    def ready_count(self, index: int) -> int:
        return sum(m.startswith(f"process {index} ready") for m in self.messages())


def test_two_processes_share_one_port_and_the_work_and_lose_nothing_to_kills(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    breg = free_port()
    bound = {"registry": connection("breg", breg)}
    # A long lease: a killed child's claims stay its own until its successor takes them over.
    config = services.configure(["bench-four"], connections=bound, workers=2, lease="PT60S")
    port = json.loads(config.read_text())["listen"]["port"]
    holders = [f"{socket.gethostname()}:{port}/{k}" for k in range(2)]
    systemd = Systemd(tmp_path / "notify.sock")
    environment = {
        "NOTIFY_SOCKET": str(systemd.address),
        "WATCHDOG_USEC": str(int(WATCHDOG * 1_000_000)),
        "COORDINATOR_STALL_ON_USR1": str(STALL),
    }
    with stand_ins(tmp_path / "standins.log", {"breg": breg}) as products:
        products.faults(
            "breg", {"match": "GET /v1/records", "mode": "delay", "seconds": READ_DELAY}
        )
        supervised = Supervised(config, tmp_path / "service.log", 2, environment)
        callers = httpx.Client(  # a connection per start: each is accepted anew
            base_url=supervised.url, limits=httpx.Limits(max_keepalive_connections=0)
        )
        try:
            systemd.until("READY=1")
            for k in range(2):  # READY=1 came once every child was ready, each on its port
                probe = f"http://127.0.0.1:{supervised.process_ports + k}/ready"
                assert httpx.get(probe, timeout=10).status_code == 200
            first = {k: pids[0] for k, pids in supervised.pids().items()}
            # On the stderr they share, each child's lines name it and the supervisor's none.
            lines = supervised.lines()
            ready = [line for line in lines if "database ready" in line["message"]]
            assert sorted(line.get("process", -1) for line in ready) == [-1, 0, 1], ready
            started = [line for line in lines if " started: pid " in line["message"]]
            assert len(started) == 2 and not any("process" in line for line in started)
            assert sorted(first.values()) == sorted(
                c.pid for c in psutil.Process(supervised.process.pid).children()
            )

            runs = [start(callers, str(uuid.uuid4())) for _ in range(FIRST_BATCH)]
            # Every start through the one port was admitted by one child or the other.
            assert sum(started_counts(supervised.process_ports, 2)) == FIRST_BATCH

            # Child 1 is killed while it holds a claim whose call is in flight.
            wait_for(
                dsn,
                "SELECT count(*) > 0 FROM runs WHERE lease_owner = %s "
                "AND lease_token IS NOT NULL AND dispatched_at IS NOT NULL",
                True,
                params=(holders[1],),
            )
            psutil.Process(first[1]).send_signal(signal.SIGKILL)
            # Starts go on through the port while child 1 is dead or starting again.
            runs += [start(callers, str(uuid.uuid4())) for _ in range(SECOND_BATCH)]
            supervised.wait_log(lambda _: supervised.ready_count(1) == 2, "child 1 not back")
            messages = supervised.messages()
            assert "process 1 was killed by SIGKILL; starting it again in 1 s" in messages
            taken = [m for m in messages if m.startswith("took over ")]
            assert taken and taken[0].endswith(f"left by the previous process on {holders[1]}")

            resolve_held(dsn, supervised.url)
            with sync_connection(dsn) as conn:
                states = conn.execute(
                    "SELECT state, outcome, count(*) AS n FROM runs GROUP BY 1, 2"
                ).fetchall()
                actors = {r["actor"] for r in conn.execute("SELECT DISTINCT actor FROM run_events")}
            assert states == [{"state": "finished", "outcome": "acted", "n": len(runs)}]
            assert {f"coordinator:{h}" for h in holders} <= actors, actors  # both did work
            # No mutation applied twice: one invoke-action per run took effect.
            applied = products.ledger("breg")["applied"]
            assert applied == {f"coordinator:{run}:act": 1 for run in runs}
            invocations = [
                r for r in products.requests("breg", "POST", "/v1/actions/") if r["key"]
            ]  # the invocations, not the reads that prepared them (they carry no key)
            sent = Counter(r["key"] for r in invocations)
            resent = {key for key, times in sent.items() if times > 1}
            # Sent again only as an operator asked, or as the engine asked BReg what became
            # of a call cut off by the kill: by the identical request, under its key.
            assert resent <= retried_keys(dsn) | verified_keys(dsn), resent
            bodies = {(r["key"], r["bodySha256"]) for r in invocations if r["key"] in resent}
            assert len(bodies) == len(resent), bodies

            # A child whose event loop is stuck stops pinging: it is killed, started again.
            psutil.Process(first[0]).send_signal(signal.SIGUSR1)
            supervised.wait_log(lambda _: supervised.ready_count(0) == 2, "child 0 not back")
            assert any(
                m.startswith("process 0 sent no watchdog ping") for m in supervised.messages()
            )
            assert systemd.lines.count("READY=1") == 1, systemd.lines  # the service's, once

            supervised.process.send_signal(signal.SIGTERM)
            assert supervised.process.wait(60) == 0
        finally:
            if supervised.process.poll() is None:
                supervised.process.kill()
                supervised.process.wait(10)
            callers.close()
        systemd.until("STOPPING=1")
        systemd.close()
        every = [pid for pids in supervised.pids().values() for pid in pids]
        assert len(every) == 4, supervised.pids()
        assert not [pid for pid in every if psutil.pid_exists(pid)]  # no child left
        stopped = supervised.messages()
        stopped = stopped[stopped.index("received SIGTERM: stopping 2 processes") :]
        assert stopped.count("received SIGTERM: shutting down") == 2, stopped  # forwarded
        assert {"process 0 exited 0", "process 1 exited 0"} <= set(stopped), stopped  # drained
        assert stopped[-1] == "stopped"


def start(callers: httpx.Client, record: str) -> str:
    response = callers.post(
        "/v1/runs",
        json={"workflow": "bench-four", "input": {"recordId": record}},
        headers={"Idempotency-Key": record},
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def resolve_held(dsn: str, url: str) -> None:
    """Until every run has finished, resolving as an operator would each run held because
    its call was in flight when its process was killed: ``retry-same`` sends the sealed
    request again with its original key, and the product's idempotency decides."""
    unsettled = "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held'"
    wait_for(dsn, unsettled, 0, timeout=120)
    with sync_connection(dsn) as conn:
        held = conn.execute("SELECT id, hold_code FROM runs WHERE state = 'held'").fetchall()
    assert {r["hold_code"] for r in held} <= {"dispatch-interrupted"}, held
    for row in held:
        response = httpx.post(
            f"{url}/v1/runs/{row['id']}/retry-same",
            json={"reason": "the process holding it was killed"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
    wait_for(dsn, "SELECT count(*) FROM runs WHERE ended_at IS NULL", 0, timeout=120)


def verified_keys(dsn: str) -> set[str]:
    """The idempotency keys of the calls the engine asked about by sending them again
    (``verify-scheduled``: BReg answers the identical request with the original answer)."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT x.idempotency_key FROM run_events e JOIN executions x "
            "ON x.run_id = e.run_id AND x.step = e.step WHERE e.kind = 'verify-scheduled'"
        ).fetchall()
    return {r["idempotency_key"] for r in rows}


def retried_keys(dsn: str) -> set[str]:
    """The idempotency keys of the calls an operator had sent again (``retry-same``)."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT x.idempotency_key FROM run_events e JOIN executions x "
            "ON x.run_id = e.run_id AND x.step = e.step WHERE e.kind = 'retry-same'"
        ).fetchall()
    return {r["idempotency_key"] for r in rows}


def test_a_supervisor_refuses_before_any_child_starts(
    cluster: Cluster, dsn: str, services: Services, tmp_path: Path
) -> None:
    """What would fail in every child is refused once, by the parent, in one line with its
    exit code: a configuration problem (1), an unreachable database (3); and what a
    supervisor cannot run (2): the embedded database, which is one process's, and ports per
    process without processes. (The four commands run at once.)"""
    broken = tmp_path / "broken.yaml"
    broken.write_text(json.dumps({"database": {"dsn": dsn}, "listen": {"port": "x"}}))
    config = services.configure([])
    settings = json.loads(config.read_text())
    settings["database"] = {"embedded": {"dataDirectory": str(tmp_path / "pg")}}
    embedded = tmp_path / "embedded.yaml"
    embedded.write_text(json.dumps(settings))
    commands: dict[str, list[str | Path]] = {
        "broken": [broken, "--processes", "2"],
        "unreachable": [config, "--processes", "2"],
        "embedded": [embedded, "--processes", "2"],
        "alone": [config, "--process-ports", str(free_port())],
    }
    with cluster.refusing(dsn):
        running = {
            name: subprocess.Popen(
                [sys.executable, "-m", "registry_coordinator", "serve", "--config", *args],
                stderr=subprocess.PIPE,
                text=True,
                env=process_env(),
            )
            for name, args in commands.items()
        }
        ended = {name: (p.wait(120), p.communicate()[1]) for name, p in running.items()}
    codes = {name: code for name, (code, _) in ended.items()}
    last = {name: stderr.splitlines()[-1] for name, (_, stderr) in ended.items()}
    assert codes == {"broken": 1, "unreachable": 3, "embedded": 2, "alone": 2}, last
    assert last["unreachable"].startswith("coordinator: database unavailable"), last
    assert "--processes 2 needs database.dsn" in last["embedded"], last
    assert not (tmp_path / "pg").exists()  # refused before the embedded server was started
    assert "--process-ports is for --processes 2 or more" in last["alone"], last
    assert not any("process 0 started" in stderr for _, stderr in ended.values())


def test_children_that_keep_failing_at_startup_stop_the_supervisor(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    """The database answers the supervisor's check and child 0, then refuses what child 1
    does first (storing its pinned definitions), as a database that cannot take its
    connections now would: child 1 fails at startup and is started again after a pause,
    until the supervisor gives up, stops child 0 (ready, and drained) and exits 3."""
    config = services.configure(["timed-choice"])
    port = json.loads(config.read_text())["listen"]["port"]
    family = store.Holder(f"{socket.gethostname()}:{port}/1").family  # its sessions' names
    with sync_connection(dsn) as conn:
        conn.execute(
            f"""
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF starts_with(current_setting('application_name'), '{family}') THEN
                    RAISE EXCEPTION 'not now' USING ERRCODE = 'cannot_connect_now';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON definitions
            FOR EACH ROW EXECUTE FUNCTION refuse();
            """
        )
    failing = coordinator("serve", "--config", config, "--processes", "2")
    assert failing.returncode == 3, failing.stderr
    lines = [
        json.loads(line)["message"] if line.startswith("{") else line
        for line in failing.stderr.splitlines()
    ]
    assert lines.count("coordinator: database unavailable: not now") == 3, lines
    assert "process 1 exited 3 before it was ready; starting it again in 1 s" in lines
    assert "process 1 exited 3 before it was ready; starting it again in 2 s" in lines
    assert "process 0 exited 0" in lines  # stopped as on SIGTERM
    assert lines[-1].startswith(
        "coordinator: process 1 died before it was ready 3 times in a row (last exited 3"
    ), lines[-1]

    # Once the database takes them they start; and should the supervisor itself be killed,
    # they stop rather than serve on unsupervised.
    with sync_connection(dsn) as conn:
        conn.execute("DROP TRIGGER refuse ON definitions")
    supervised = Supervised(config, tmp_path / "service.log", 2, {})
    try:
        supervised.wait_log(lambda m: any(x.endswith("processes ready") for x in m), "no start")
        children = psutil.Process(supervised.process.pid).children()
        supervised.process.kill()
        _, alive = psutil.wait_procs(children, timeout=60)
        assert alive == []
    finally:
        supervised.process.kill()
        supervised.process.wait(10)
    orphaned = supervised.messages()
    assert orphaned.count("the supervisor is gone: shutting down") == 2, orphaned
    assert orphaned.count("stopped") == 2, orphaned  # each drained as on SIGTERM
