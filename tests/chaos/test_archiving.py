"""Retention killed at every point of archiving loses no run: at each kill, every run is
whole in the database or in a verified bundle (and ``archived_runs``), never neither and
never both; restarted, the service archives the rest, and the API and the listing say
where each run went."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import httpx

from registry_coordinator.semantics import bundles
from registry_coordinator.semantics.chain import Event, first_break, parse
from registry_coordinator.semantics.checkpoints import public_key
from registry_coordinator.store.database import QUERIES, sync_connection
from tests.support import ADMISSION_WAITING, Services, coordinator, signing, wait_for

RUNS = 7
BATCH = 3


def _event(r: dict[str, Any]) -> Event:
    detail, digest = parse(r["detail"]), bytes(r["hash"])
    return Event(r["run"], r["seq"], r["at"], r["kind"], r["step"], r["actor"], detail, digest)


def _where_each_run_is(dsn: str, archive: Path, key_file: Path, admitted: list[str]) -> int:
    """Check each admitted run is in exactly one place, whole; how many are archived."""
    key = public_key(key_file.read_bytes())
    archived = 0
    with sync_connection(dsn) as conn:
        for run in admitted:
            hot = conn.execute("SELECT seq FROM runs WHERE id = %s", (run,)).fetchone()
            gone = conn.execute(
                "SELECT bundle, sha256, seq FROM archived_runs WHERE id = %s", (run,)
            ).fetchone()
            assert (hot is None) != (gone is None), f"run {run}: hot {hot}, archived {gone}"
            if hot is not None:  # whole: every event there, chained
                rows = conn.execute(
                    "SELECT run_id::text AS run, seq, rfc3339(at) AS at, kind, step, actor, "
                    "detail::text AS detail, hash FROM run_events WHERE run_id = %s ORDER BY seq",
                    (run,),
                ).fetchall()
                history = [_event(r) for r in rows]
                assert first_break(run, history, hot["seq"]) is None, run
                continue
            archived += 1
            assert gone is not None
            data = (archive / gone["bundle"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == gone["sha256"]
            proven = bundles.check(data, key)
            assert (proven.run, proven.events, proven.last) == (run, gone["seq"], "finished")
            for table in ("run_events", "executions", "waits"):
                left = conn.execute(f"SELECT count(*) AS n FROM {table} WHERE run_id = %s", (run,))
                assert (left.fetchone() or {})["n"] == 0, f"run {run} left rows in {table}"
    return archived


def test_archiving_killed_at_every_point_loses_no_run(dsn: str, services: Services) -> None:
    keys = services.directory / "keys"
    archive = services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "batch": BATCH, "every": "PT1S"}
    config = services.configure(
        ["chain"], lease="PT2S", extra={**signing(keys), "retention": retention}
    )
    first = services.start(config, crash_at="archive-written:1")
    admitted = [first.start_run("chain", {"n": n}, key=f"start-{n}") for n in range(RUNS)]
    assert first.process.wait(60) == -9, "archiving never reached archive-written"
    assert _where_each_run_is(dsn, archive, keys / "audit-key.pub", admitted) == 0
    assert len(list(archive.rglob("*.bundle.json"))) == BATCH  # written, not yet recorded

    inside = services.start(config, crash_at="archive-recorded:1")
    assert inside.process.wait(60) == -9, "archiving never reached archive-recorded"
    assert _where_each_run_is(dsn, archive, keys / "audit-key.pub", admitted) == 0

    after = services.start(config, crash_at="archive-committed:1")
    assert after.process.wait(60) == -9, "archiving never reached archive-committed"
    assert _where_each_run_is(dsn, archive, keys / "audit-key.pub", admitted) == BATCH

    service = services.start(config)
    wait_for(dsn, "SELECT count(*) FROM archived_runs", RUNS, timeout=60)
    assert _where_each_run_is(dsn, archive, keys / "audit-key.pub", admitted) == RUNS

    gone = service.http.get(f"/v1/runs/{admitted[0]}")
    assert gone.status_code == 410, gone.text
    problem: dict[str, Any] = gone.json()
    assert problem["code"] == "run.archived"
    bundle = archive / problem["archived"]["bundle"]
    assert problem["archived"]["bundle"] in problem["detail"]
    assert service.http.get(f"/v1/runs/{admitted[0]}/history").status_code == 410
    listed = service.http.get("/v1/runs", params={"archived": "true", "limit": 100}).json()
    assert sorted(r["id"] for r in listed["runs"]) == sorted(admitted)
    assert all(r["archived"]["sha256"] for r in listed["runs"])
    assert service.http.get("/v1/runs").json()["runs"] == []
    assert service.http.get("/v1/runs", params={"archived": "maybe"}).status_code == 400
    again = service.http.post(  # a start retried after its run was archived: not started again
        "/v1/runs",
        json={"workflow": "chain", "input": {"n": 0}},
        headers={"Idempotency-Key": "start-0"},
    )
    assert (again.status_code, again.json()["code"]) == (410, "run.archived"), again.text
    assert again.json()["archived"] == problem["archived"]
    other = service.http.post(
        "/v1/runs",
        json={"workflow": "chain", "input": {"n": 9}},
        headers={"Idempotency-Key": "start-0"},
    )
    assert (other.status_code, other.json()["code"]) == (409, "run.key-reused"), other.text
    assert other.json()["run"] == admitted[0]
    with sync_connection(dsn) as conn:
        assert (conn.execute("SELECT count(*) AS n FROM runs").fetchone() or {})["n"] == 0

    metrics = service.http.get("/metrics").text
    archived_here = RUNS - BATCH  # the killed process archived the first batch
    assert f"coordinator_runs_archived_total {archived_here}.0" in metrics, metrics
    remote = coordinator("runs", "list", "--archived", "--url", service.url)
    assert remote.returncode == 0, remote.stderr
    assert f"{admitted[0]}  finished   chain  ended " in remote.stdout
    assert f"archived to {problem['archived']['bundle']}" in remote.stdout
    status = coordinator("runs", "status", admitted[0], "--url", service.url)
    assert status.returncode == 1
    assert problem["archived"]["bundle"] in status.stderr
    offline = coordinator(
        "audit", "verify", "--bundle", bundle, "--public-key", keys / "audit-key.pub"
    )
    assert offline.returncode == 0, offline.stdout + offline.stderr
    whole = coordinator("audit", "verify", "--config", config)
    assert whole.returncode == 0, whole.stdout + whole.stderr  # the checkpoints still hold
    assert f"{RUNS} archived runs ({RUNS} bundles read)" in whole.stdout
    exported = coordinator(
        "audit", "export", "--config", config, "--run", admitted[0], "--out", bundle.with_name("x")
    )
    assert exported.returncode == 1
    assert f"to the bundle {problem['archived']['bundle']}" in exported.stderr
    assert json.loads(bundle.read_bytes())["run"] == admitted[0]

    other = archive / listed["runs"][1]["archived"]["bundle"]  # an administrator swaps one
    bundle.write_bytes(other.read_bytes())
    other.unlink()  # and removes another
    swapped = coordinator("audit", "verify", "--config", config)
    assert swapped.returncode == 1
    said = sorted(swapped.stdout.splitlines())
    assert len(said) == 2, said
    assert any(f"its bundle {bundle} is not the one recorded" in line for line in said), said
    assert any(f"its bundle {other} cannot be read" in line for line in said), said


def test_a_start_retried_while_its_run_is_archived_is_not_started_again(
    dsn: str, services: Services
) -> None:
    """The archiver's own transaction, held open by the test: a start retried with the
    run's key meanwhile waits, and then finds the run archived (410), and no second run is
    made. Without the transaction's lock on new runs, the retry's snapshot predates the
    archived record while its key check sees the run already gone."""
    service = services(["chain"])
    run = service.start_run("chain", {"n": 1}, key="retried")
    wait_for(dsn, "SELECT count(*) FROM runs WHERE ended_at IS NOT NULL", 1)
    answers: list[httpx.Response] = []
    with sync_connection(dsn) as conn:
        seq = (conn.execute("SELECT seq FROM runs WHERE id = %s", (run,)).fetchone() or {})["seq"]
        conn.execute("BEGIN")
        conn.execute(QUERIES["retention_hold_starts"])
        args = {"runs": [run], "seqs": [seq], "bundles": ["b.json"], "sha256s": ["0" * 64]}
        assert len(conn.execute(QUERIES["retention_record"], args).fetchall()) == 1
        conn.execute(QUERIES["retention_remove"], {"runs": [run]})
        retry = threading.Thread(
            target=lambda: answers.append(
                service.http.post(
                    "/v1/runs",
                    json={"workflow": "chain", "input": {"n": 1}},
                    headers={"Idempotency-Key": "retried"},
                )
            )
        )
        retry.start()
        # Until the retry's admission waits on the lock (without it, the retry starts a run
        # meanwhile, and this wait times out: the test fails either way). The service's
        # workers may wait on it too, claiming: only the admission's insert is counted.
        wait_for(dsn, ADMISSION_WAITING, 1)
        conn.execute("COMMIT")
    retry.join(30)
    [answer] = answers
    assert answer.status_code == 410, answer.text  # 201: a second run of the same start
    assert answer.json()["code"] == "run.archived"
    with sync_connection(dsn) as conn:
        assert (conn.execute("SELECT count(*) AS n FROM runs").fetchone() or {})["n"] == 0
