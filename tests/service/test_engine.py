"""The run engine against a real PostgreSQL: steps, timers, deadlines, admission."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from registry_coordinator.store.database import QUERIES, sync_connection
from registry_coordinator.store.migrations import known
from tests.support import Cluster, Services, migrate, old_postgres, wait_state, write_config


def instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_run_waits_chooses_and_finishes(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    run = service.start_run("timed-choice", {"answer": "yes"})
    assert service.status(run)["state"] in ("running", "waiting")
    wait_state(dsn, run, "finished")
    status = service.status(run)
    history = service.history(run)
    assert status["outcome"] == "yes"
    assert status["step"] == "said_yes"
    assert [(e["seq"], e["kind"], e["step"]) for e in history] == [
        (1, "admitted", "pause"),
        (2, "waiting", "pause"),
        (3, "step-completed", "pause"),
        (4, "step-completed", "route"),
        (5, "finished", "said_yes"),
    ]
    assert history[3]["detail"] == {"via": "case 1", "next": "said_yes"}
    assert status["output"]["admitted"] == status["admittedAt"]
    assert status["output"]["paused"] == history[2]["at"]


def test_a_wait_until_fires_at_its_instant_not_at_the_next_sweep(
    dsn: str, services: Services
) -> None:
    """The timer sleeps until the earliest instant: each wait-until fires after it, never
    before, and long before the sweep (a minute here) would have found it. How late it is
    is a benchmark's figure (``./run bench timers``), printed here."""
    service = services(["timed-choice"], sweep="PT60S")
    runs = [service.start_run("timed-choice", {"answer": "no"}) for _ in range(5)]
    for run in runs:
        wait_state(dsn, run, "finished")
    lateness = []
    for run in runs:
        history = service.history(run)
        due = instant(history[0]["at"]) + timedelta(seconds=2)
        fired = instant(history[2]["at"])
        lateness.append((fired - due).total_seconds())
    print(
        f"wait-until lateness over {len(runs)} runs: "
        + ", ".join(f"{1000 * s:.1f} ms" for s in sorted(lateness))
    )
    assert all(0 <= s < 30 for s in lateness), lateness


def test_the_deadline_expires_a_waiting_run(dsn: str, services: Services) -> None:
    """At its deadline, not before it, nor at the next sweep (a minute here)."""
    service = services(["deadline"], sweep="PT60S")
    run = service.start_run("deadline", {})
    wait_state(dsn, run, "expired")
    status = service.status(run)
    history = service.history(run)
    assert status["failure"]["code"] == "deadline-reached"
    assert [e["kind"] for e in history] == ["admitted", "waiting", "expired"]
    late = instant(history[2]["at"]) - instant(status["deadlineAt"])
    assert timedelta(0) <= late < timedelta(seconds=30), late
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT due_at FROM runs").fetchone() == {"due_at": None}


def test_the_same_start_key_returns_the_same_run(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    body = {"workflow": "timed-choice", "input": {"answer": "yes"}}
    first = service.http.post("/v1/runs", json=body, headers={"Idempotency-Key": "case-17"})
    again = service.http.post("/v1/runs", json=body, headers={"Idempotency-Key": "case-17"})
    other = service.http.post(
        "/v1/runs",
        json={**body, "input": {"answer": "no"}},
        headers={"Idempotency-Key": "case-17"},
    )
    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    assert other.json()["code"] == "run.key-reused"
    assert other.json()["run"] == first.json()["id"]
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM runs").fetchone() == {"n": 1}


def test_bad_starts_get_a_clear_4xx_and_change_nothing(dsn: str, services: Services) -> None:
    service = services(["timed-choice"], extra={"limits": {"requestBody": 4096}})
    key = {"Idempotency-Key": "k"}
    cases: list[tuple[dict[str, str], bytes, int, str]] = [
        (
            {},
            b'{"workflow": "timed-choice", "input": {"answer": "y"}}',
            400,
            "request.idempotency-key-missing",
        ),
        (
            {"Idempotency-Key": "has space"},
            b'{"workflow": "timed-choice", "input": {}}',
            400,
            "request.idempotency-key-invalid",
        ),
        (key, b"{not json", 400, "request.malformed-json"),
        (key, b"\xff\xfe", 400, "request.malformed-json"),
        (key, b"[1, 2]", 400, "request.invalid"),
        (key, b'{"workflow": "timed-choice"}', 400, "request.invalid"),
        (key, b'{"workflow": "timed-choice", "input": {}, "extra": 1}', 400, "request.invalid"),
        (key, b'{"workflow": 7, "input": {}}', 400, "request.invalid"),
        (key, b'{"workflow": "nope", "input": {}}', 404, "workflow.not-pinned"),
        (
            key,
            b'{"workflow": "timed-choice", "version": "9", "input": {}}',
            404,
            "workflow.not-pinned",
        ),
        (key, b'{"workflow": "timed-choice", "input": {"answer": 5}}', 422, "input.invalid"),
        (
            key,
            b'{"workflow": "timed-choice", "input": {"answer": "a\\u0000b"}}',
            400,
            "request.unstorable-text",
        ),
        (
            key,
            b'{"workflow": "timed-choice", "input": {"answer": ' + b"[" * 65 + b"]" * 65 + b"}}",
            400,
            "request.too-deep",
        ),
        (key, b"[" * 1500 + b"]" * 1500, 400, "request.too-deep"),  # too deep to parse
        (
            key,
            b'{"workflow": "timed-choice", "input": {"answer": "' + b"x" * 5000 + b'"}}',
            413,
            "request.too-large",
        ),
    ]
    for headers, body, status, code in cases:
        sent = {**headers, "Content-Type": "application/json"}
        response = service.http.post("/v1/runs", content=body, headers=sent)
        assert response.status_code == status, (body[:60], response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == code
        assert problem["status"] == status
        assert problem["detail"]
    assert service.http.get("/v1/runs/not-a-uuid").json()["code"] == "run.not-found"
    missing = service.http.get("/v1/runs/00000000-0000-4000-8000-000000000000")
    assert missing.status_code == 404
    assert service.http.delete("/v1/runs").status_code == 405
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM runs").fetchone() == {"n": 0}
        assert conn.execute("SELECT count(*) AS n FROM run_events").fetchone() == {"n": 0}


def serve_once(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line_refusal(result: subprocess.CompletedProcess[str], code: int, words: str) -> None:
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    reasons = [
        line for line in result.stderr.strip().splitlines() if not line.startswith("  repair:")
    ]
    assert len(reasons) == 1, reasons
    assert words in reasons[0], reasons


def test_startup_refuses_a_digest_mismatch(dsn: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, dsn, ["timed-choice"])
    text = config.read_text()
    digest = text.split('"digest": "')[1].split('"')[0]
    config.write_text(text.replace(digest, "sha256:" + "0" * 64))
    result = serve_once(config)
    one_line_refusal(result, 1, "config.digest-mismatch")
    assert "sha256:" + "0" * 64 in result.stderr


def test_startup_refuses_an_unreachable_database(tmp_path: Path) -> None:
    config = write_config(
        tmp_path, "postgresql://postgres@/coordinator?host=/nonexistent", ["timed-choice"]
    )
    one_line_refusal(serve_once(config), 3, "database unavailable")


def test_startup_refuses_a_schema_that_is_not_this_builds(empty_dsn: str, tmp_path: Path) -> None:
    dsn = empty_dsn
    config = write_config(tmp_path, dsn, ["timed-choice"])
    one_line_refusal(serve_once(config), 1, "run `coordinator migrate --config FILE`")
    migrate(config)
    with sync_connection(dsn) as conn:
        conn.execute("UPDATE coordinator_migrations SET checksum = 'edited' WHERE version = 1")
    one_line_refusal(serve_once(config), 1, "differs from this build's file")
    latest = known()[-1].version
    with sync_connection(dsn) as conn:  # a newer build's three migrations applied after ours
        conn.execute(
            "UPDATE coordinator_migrations SET checksum = %s WHERE version = 1",
            (known()[0].checksum,),
        )
        for version in (latest + 1, latest + 2, latest + 3):
            conn.execute(f"INSERT INTO coordinator_migrations VALUES ({version}, 'future', 'x')")
    one_line_refusal(
        serve_once(config),
        1,
        f"the database has schema version {latest + 3}, newer than this build's {latest}",
    )


def test_migrate_is_idempotent(empty_dsn: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, empty_dsn, ["timed-choice"])
    first = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "migrate", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    second = subprocess.run(
        [sys.executable, "-m", "registry_coordinator", "migrate", "--config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert first.returncode == second.returncode == 0
    assert "applied 0001 runs" in first.stdout
    assert "the schema is current" in second.stdout


def test_history_is_append_only(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    run = service.start_run("timed-choice", {"answer": "no"})
    with sync_connection(dsn) as conn:
        for statement in ("UPDATE run_events SET kind = 'x'", "DELETE FROM run_events"):
            with pytest.raises(Exception, match="append-only"):
                conn.execute(statement)
        count = conn.execute("SELECT count(*) AS n FROM run_events WHERE run_id = %s", (run,))
        assert (count.fetchone() or {})["n"] >= 1


def test_a_http_client_sees_json_status(services: Services) -> None:
    service = services(["timed-choice"])
    run = service.start_run("timed-choice", {"answer": "no"})
    response = httpx.get(f"{service.url}/v1/runs/{run}")
    assert response.headers["content-type"] == "application/json"
    assert response.json()["workflow"]["id"] == "timed-choice"


def test_startup_refuses_postgresql_older_than_17(tmp_path: Path) -> None:
    with old_postgres() as old:
        config = write_config(tmp_path, old, ["timed-choice"])
        one_line_refusal(serve_once(config), 1, "needs 17 or newer")


def test_claiming_and_timing_stay_index_scans_with_many_runs(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    service.start_run("timed-choice", {"answer": "no"})
    service.stop()  # the one real run; no service takes up the rows written next
    with sync_connection(dsn) as conn:
        # 50,000 ended runs and 2,000 waiting ones (half of them asleep at a wait-until)
        # beside the one real run: enough that a sequential scan would be the planner's
        # choice for any query that has no index to use.
        conn.execute(
            """
            INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest, input,
                              state, step, seq, timer_at, wakes_to, due_at, admitted_at,
                              deadline_at, updated_at, ended_at)
            SELECT gen_random_uuid(), digest, workflow_id, 'bulk', 'k' || n, 'x', '{}',
                   CASE WHEN n <= 2000 THEN 'waiting' ELSE 'finished' END, step, 1,
                   CASE WHEN n <= 1000 THEN now() + interval '1 day' END,
                   CASE WHEN n <= 1000 THEN 'route' END,
                   CASE WHEN n <= 2000 THEN now() + interval '1 day' END,
                   now(), now() + interval '2 days', now(),
                   CASE WHEN n > 2000 THEN now() END
            FROM runs, generate_series(1, 52000) AS n
            """
        )
        conn.execute("ANALYZE runs")
        for query, params, indexes in (
            ("claim_run", {"owner": "x", "lease": timedelta(seconds=5)}, ["runs_due"]),
            ("next_due", {}, ["runs_due", "runs_sleeping"]),
            ("due_sleepers", {"owner": "x", "limit": 500}, ["runs_sleeping"]),
        ):
            plan = "\n".join(
                row["QUERY PLAN"]
                for row in conn.execute("EXPLAIN " + QUERIES[query], params).fetchall()
            )
            assert all(index in plan for index in indexes), plan
            assert "Seq Scan on runs" not in plan, plan


def test_an_idle_service_stops_promptly_on_sigterm(services: Services) -> None:
    """Parked workers and an idle timer do not hold up a shutdown: the service exits long
    before its grace period (a minute here) would have run out."""
    config = services.configure(["timed-choice"], workers=4, grace="PT60S")
    for _ in range(2):
        service = services.start(config)
        time.sleep(0.2)  # every worker parked, idle
        assert service.stop() == 0  # within the harness's 20 s, a third of the grace


def test_an_idle_service_outlives_a_database_outage(
    cluster: Cluster, dsn: str, services: Services
) -> None:
    """The database refuses this service's connections for longer than the timer's sweep
    and across a run's wait-until: the service reports not ready, stays up, and when the
    database is back the run goes on."""
    service = services(["timed-choice"], sweep="PT1S")
    run = service.start_run("timed-choice", {"answer": "no"})
    wait_state(dsn, run, "waiting")
    with cluster.refusing(dsn):
        time.sleep(4)  # two seconds past the wait-until; four sweeps
        assert service.process.poll() is None, "the service ended in the outage"
        assert service.http.get("/ready").status_code == 503
    wait_state(dsn, run, "finished")
    wait_for_ready = time.monotonic() + 30
    while service.http.get("/ready").status_code != 200:
        assert time.monotonic() < wait_for_ready, "not ready again after the outage"
        time.sleep(0.1)
    assert service.process.poll() is None
