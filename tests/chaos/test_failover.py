"""A failover as one ``coordinator serve`` sees it: PostgreSQL goes away under load and
comes back on the same DSN. Three times, on one service start:

1. stopped and started (``pg_ctl -m fast``: every session cut, the server down for
   seconds) with calls in flight at a product, wait-untils coming due and starts sent;
2. crashed (a server process killed: PostgreSQL ends every other session at once, as
   ``-m immediate`` does, replays its WAL and takes connections again on the same
   socket) with calls in flight, the workers busy and a caller starting runs;
3. every session of the service cut while it sits idle, the server up all along (what
   a proxy failing over does).

The service rides through: it never exits and logs no error; ``/ready`` is 503 while the
database is away and 200 once it is back; a start sent meanwhile is answered 503
(``service.unavailable``, with Retry-After) at once, and the same start sent again admits
its run once. Every run finishes as it would have without the outages, or after its
product was asked about a dispatch an outage cut off (Casework by the identical request,
Messaging for a receipt) and confirmed it, or is held for an operator as a dispatch cut
off before anything was sent, which no asking could confirm; none is lost, no mutation
takes effect twice or is sent again on a guess. A pooled connection the server closed is
replaced before a statement is sent on it. The listener reconnects once for each
outage, so a delivery recorded by another process (here, the test's own SQL) wakes its
run at once, not when the timer next looks (the sweep, the fallback, is minutes away);
the timer wakes the wait-untils that came due during an outage, and the new ones after.

Figures (how long each outage and recovery took) are printed, never asserted. The module
restarts the session's shared cluster, as test_chaos does: the tests of one xdist worker
run one at a time, and none holds a session from one test to the next.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import httpx
import psycopg

from registry_coordinator.store.database import sync_connection
from tests.support import (
    ASKING,
    CASEWORK_POOL,
    QUIET,
    SLEPT,
    Cluster,
    Service,
    Services,
    StandIns,
    called_or_asked,
    final_states,
    mutations_seen,
    put_to_sleep,
    start_runs,
    summary,
    unanswered,
    wait_answered,
    wait_for,
    wait_ready,
    wait_state,
)

#: The service's pool (write_config's poolSize: workers + 3) and its listener's session.
POOL = 4 + 3
#: Runs of two mutations started before the stop, and by the caller around the crash.
BEFORE_STOP, AROUND_CRASH = 40, 60
#: Wait-untils put to sleep before the stop, to come due while the server is down.
SLEEPERS = 40
#: Wait-untils due at once just before the crash, to keep the workers busy when it lands.
BURST = 200


def test_service_rides_through_a_restart_a_crash_and_cut_sessions(
    cluster: Cluster, dsn: str, services: Services
) -> None:
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {**ASKING, **QUIET}),
        "notices": ("messaging", ASKING),
    }
    # The lease (10 s) outlasts each outage, so no claim on a call in flight lapses; the
    # sweep (10 min) outlasts the test, so only a notification wakes a run another
    # process made due while this one's workers are idle (woken_by_another_process).
    # Casework's feed, which lists the reviews decided below, is read at the start and
    # then only after ten minutes, so it wakes none of the runs waiting for them.
    service, products = services.deploy(
        ["two-mutations", "await-review", "timed-choice"],
        connections,
        workers=4,
        lease="PT10S",
        sweep="PT10M",
    )
    products.feed_read()
    reviews = products.decided_reviews(3, "application-review")
    waiting = {key: service.start_run("await-review", {"requestId": key}) for key in reviews}
    wait_for(dsn, "SELECT count(*) FROM waits", len(reviews))
    admitted = len(reviews)
    started: list[str] = []  # keys of the starts the test sent alone

    # 1. Stopped and started.
    products.faults(
        "casework", {"match": "POST /v1/review-requests", "mode": "delay", "seconds": 3}
    )
    admitted += start_runs(service, BEFORE_STOP, "stop")
    products.wait_in_flight("casework", CASEWORK_POOL)
    in_flight = set(unanswered(products))  # at once: each is answered 3 s after it came
    assert len(in_flight) == CASEWORK_POOL
    put_to_sleep(dsn, SLEEPERS, timedelta(seconds=0.5), prefix="stop")
    admitted += SLEEPERS
    stopped = time.monotonic()
    with cluster.down():
        wait_ready(service, 503)
        parts = service.http.get("/ready").json()["parts"]
        assert not parts["database"]["ok"] and not parts["listener"]["ok"], parts
        for n in range(5):
            started.append(refused_start(service, f"refused-{n}"))
        wait_answered(products, in_flight)  # answers in hand while the database is down
        time.sleep(max(0.0, stopped + 1 - time.monotonic()))  # the sleepers are due
    back = time.monotonic()
    products.faults("casework")
    wait_for_reconnects(service, 1)
    ready = time.monotonic()
    for key in started:  # sent again, as the 503 said: admitted now
        service.start_run("two-mutations", {"id": key}, key=key)
    admitted += len(started)
    settled_except_waits(dsn)
    print(
        f"\nstop: down {back - stopped:.1f} s; ready {ready - back:.1f} s and every run "
        f"settled {time.monotonic() - back:.1f} s after the server was back"
    )
    assert_sessions_bounded(dsn)
    woken_by_another_process(service, dsn, reviews[0], waiting[reviews[0]])
    admitted += 1

    # 2. Crashed, with calls in flight, a caller starting runs, and the workers busy with
    # a burst of wait-untils come due at once.
    products.faults(
        "casework", {"match": "POST /v1/review-requests", "mode": "delay", "seconds": 1}
    )
    caller = Caller(service, [f"crash-{n}" for n in range(AROUND_CRASH)])
    caller.thread.start()
    products.wait_in_flight("casework", CASEWORK_POOL)
    put_to_sleep(dsn, BURST, timedelta(0), prefix="burst")
    admitted += BURST
    mark = service.log.stat().st_size
    workers_busy(dsn, "burst")
    crashed = time.monotonic()
    recovered = crash(dsn)
    wait_for_reconnects(service, 2)
    ready = time.monotonic()
    products.faults("casework")
    caller.thread.join(60)
    assert not caller.thread.is_alive()
    assert caller.unexpected == [], caller.unexpected
    admitted += AROUND_CRASH
    settled_except_waits(dsn)
    print(
        f"crash: PostgreSQL recovered in {recovered:.1f} s; ready {ready - crashed:.1f} s "
        "and every run settled "
        f"{time.monotonic() - crashed:.1f} s after it; the caller's starts were refused "
        f"{caller.refused} times, {caller.found} found the run an earlier try started"
    )
    # Workers had statements in flight (a claim, a step's commit): each went on after it.
    assert any(r["logger"].endswith(".worker") for r in records_since(service, mark))
    assert_sessions_bounded(dsn)
    woken_by_another_process(service, dsn, reviews[1], waiting[reviews[1]])
    admitted += 1

    # 3. Sessions cut while idle, the server up all along: each pooled connection is found
    # closed at checkout and replaced before use, so no statement fails.
    mark = service.log.stat().st_size
    cut_sessions(dsn)
    for n in range(POOL + 1):  # more statements than the pool has connections
        key = f"after-cut-{n}"
        service.start_run("two-mutations", {"id": key}, key=key)
        started.append(key)
    admitted += POOL + 1
    wait_for_reconnects(service, 3)
    settled_except_waits(dsn)
    assert warnings_since(service, mark) == []
    woken_by_another_process(service, dsn, reviews[2], waiting[reviews[2]])
    admitted += 1

    assert service.process.poll() is None  # it rode through all three
    assert errors_since(service, 0) == []  # and never failed on a defect of its own
    check_outcomes(dsn, products, admitted, caller.keys + started)


def refused_start(service: Service, key: str) -> str:
    """A start sent while the database is down: refused at once, saying to send it again."""
    answer = service.http.post(
        "/v1/runs",
        json={"workflow": "two-mutations", "input": {"id": key}},
        headers={"Idempotency-Key": key},
    )
    assert answer.status_code == 503, answer.text
    assert answer.json()["code"] == "service.unavailable"
    assert int(answer.headers["Retry-After"]) > 0
    return key


class Caller:
    """A caller starting runs of two mutations one after another in a thread, sending a
    start refused with 503 again with the same Idempotency-Key, as the answer says (sooner
    than its Retry-After, to keep the test short). Anything but 200, 201 or 503
    ``service.unavailable`` is unexpected, and so is no answer within 30 s (a hang)."""

    def __init__(self, service: Service, keys: list[str]) -> None:
        self.url = service.url
        self.keys = keys
        self.refused = 0  # 503s
        self.found = 0  # 200s: a start refused, or unanswered, had admitted its run
        self.unexpected: list[str] = []
        self.thread = threading.Thread(target=self._start_all, daemon=True)

    def _start_all(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            for key in self.keys:
                while True:
                    try:
                        answer = http.post(
                            "/v1/runs",
                            json={"workflow": "two-mutations", "input": {"id": key}},
                            headers={"Idempotency-Key": key},
                        )
                    except httpx.HTTPError as exc:
                        self.unexpected.append(f"{key}: {exc!r}")
                        return
                    if answer.status_code in (200, 201):
                        self.found += answer.status_code == 200
                        break
                    if answer.status_code != 503 or answer.json()["code"] != "service.unavailable":
                        self.unexpected.append(f"{key}: {answer.status_code} {answer.text}")
                        return
                    self.refused += 1
                    time.sleep(0.1)


def workers_busy(dsn: str, prefix: str, timeout: float = 30) -> None:
    """Until the wait-untils whose start keys begin with ``prefix`` are being taken on: some
    have finished. How many are left by then is load's to say (the timer takes up to 500
    in one statement), so it is not asserted: the crash that follows must lose nothing
    whether it finds the burst half done or done."""
    deadline = time.monotonic() + timeout
    with sync_connection(dsn) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE ended_at IS NOT NULL) AS ended FROM runs "
                "WHERE start_key LIKE %s",
                (prefix + "%",),
            ).fetchone()
            assert row is not None
            if row["ended"]:
                return
            assert time.monotonic() < deadline, row
            time.sleep(0.01)


def crash(dsn: str, timeout: float = 60) -> float:
    """Kill one PostgreSQL server process: the postmaster ends every other session at once
    (with the immediate shutdown's signal), reinitialises, replays its WAL and takes
    connections again on the same socket, as a crashed primary restarted in place does.
    Returns once it does, with the seconds that took (a test failing meanwhile would stop
    the cluster mid-recovery, which PostgreSQL 18 was seen never to finish)."""
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT pg_backend_pid() AS pid").fetchone()
        assert row is not None
        os.kill(row["pid"], signal.SIGKILL)
    crashed = time.monotonic()
    while True:
        try:
            with sync_connection(dsn) as conn:
                conn.execute("SELECT 1")
            return time.monotonic() - crashed
        except psycopg.OperationalError:
            assert time.monotonic() < crashed + timeout, "PostgreSQL did not recover"
            time.sleep(0.05)


def cut_sessions(dsn: str) -> None:
    """End every session of the service, waiting until each has ended."""
    with sync_connection(dsn) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'coordinator/%%'"
        )


def wait_for_reconnects(service: Service, count: int, timeout: float = 30) -> None:
    """Until /ready is 200 with the listener reconnected ``count`` times in all (once for
    each outage: it never reconnects twice for one)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = service.http.get("/ready")
        reconnects = answer.json()["parts"]["listener"]["reconnects"]
        if answer.status_code == 200 and reconnects == count:
            return
        assert reconnects <= count, answer.text
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)


def settled_except_waits(dsn: str, timeout: float = 60) -> None:
    """Until every run has ended or is held, but those waiting for a review decision."""
    wait_for(
        dsn,
        "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held' "
        "AND workflow_id <> 'await-review'",
        0,
        timeout,
    )


def assert_sessions_bounded(dsn: str) -> None:
    """The service holds no more sessions than its pool and its listener: each broken
    connection was closed when it was replaced, none left behind."""
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'coordinator/%%'"
        ).fetchone()
    assert row is not None and 0 < row["n"] <= POOL + 1, row


def woken_by_another_process(service: Service, dsn: str, key: str, run: str) -> None:
    """A webhook delivery recorded as another process records one, its NOTIFY included,
    wakes ``run``: this service's listener hears it, and the run reads its result before
    a wait-until admitted just before, due 2 s after its admission, is woken. Were the
    notification missed, the run would be taken up only when the timer next looked at
    the database: at that wait-until's instant, after waking it (the sweep is minutes
    away)."""
    sleeper = service.start_run("timed-choice", {"answer": "no"})
    wait_state(dsn, sleeper, "waiting")
    with sync_connection(dsn) as conn:
        woke = conn.execute(
            "SELECT woke FROM record_delivery('reviews', %s, 'review-decision', %s, '{}')",
            (uuid.uuid4().hex, key),
        ).fetchone()
    assert woke == {"woke": 1}
    wait_state(dsn, run, "finished")
    wait_state(dsn, sleeper, "finished")
    with sync_connection(dsn) as conn:
        at = {
            r["kind"]: r["at"]
            for r in conn.execute(
                "SELECT kind, min(at) AS at FROM run_events WHERE run_id = %s "
                "AND kind IN ('result-delivered', 'result-read') GROUP BY kind "
                "UNION ALL SELECT 'sleeper-woken', min(at) FROM run_events "
                "WHERE run_id = %s AND kind = 'step-completed'",
                (run, sleeper),
            ).fetchall()
        }
    print(
        f"  a delivery by another process was read "
        f"{(at['result-read'] - at['result-delivered']).total_seconds() * 1000:.0f} ms later"
    )
    assert at["result-delivered"] < at["result-read"] < at["sleeper-woken"], at


def records_since(service: Service, mark: int) -> list[dict[str, Any]]:
    """The service's log records since ``mark``, a size of its log."""
    text = service.log.read_bytes()[mark:].decode()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def warnings_since(service: Service, mark: int) -> list[str]:
    """What the service warned of since ``mark``, but its listener's loss of its own
    connection, which it is right to log."""
    return [
        r["message"]
        for r in records_since(service, mark)
        if r["level"] != "info" and not r["logger"].endswith(".listener")
    ]


def errors_since(service: Service, mark: int) -> list[str]:
    """The errors the service logged since ``mark`` (a traceback is logged as one)."""
    return [
        r["message"] for r in records_since(service, mark) if r["level"] in ("error", "critical")
    ]


def check_outcomes(dsn: str, products: StandIns, admitted: int, started: list[str]) -> None:
    """Nothing lost, nothing sent twice, each start admitted; every run finished with the
    history it would have had without the outages (or with its products asked about a
    dispatch cut off, and confirming it), or held as a dispatch cut off unsent, with its
    reason."""
    row = summary("restart, crash, cut sessions", dsn, admitted, 3, products)
    received, applied = mutations_seen(products)
    with sync_connection(dsn) as conn:
        keys = {r["start_key"] for r in conn.execute("SELECT start_key FROM runs").fetchall()}
        held = conn.execute(
            "SELECT id::text AS id, step, detail FROM runs WHERE state = 'held'"
        ).fetchall()
    assert set(started) <= keys, set(started) - keys
    assert set(row["holds"]) <= {"dispatch-interrupted", "outcome-unknown"}, row["holds"]
    for run in held:
        assert received[f"coordinator:{run['id']}:{run['step']}"] == 0, run
        assert applied[f"coordinator:{run['id']}:{run['step']}"] == 0, run
        assert run["detail"], run
    for run_id, (state, outcome, kinds) in final_states(dsn).items():
        if (state, outcome) == ("finished", "no"):
            assert kinds == SLEPT, (run_id, kinds)
        elif (state, outcome) == ("finished", "done"):
            assert called_or_asked(kinds), (run_id, kinds)
            for step in ("ask", "tell"):
                assert received[f"coordinator:{run_id}:{step}"] == 1, (run_id, step)
                assert applied[f"coordinator:{run_id}:{step}"] == 1, (run_id, step)
    print(f"{len(held)} runs held, their dispatch cut off; {dict(row['states'])}")
