"""Restoring a backup: a database that went back in time is recognised against the
high-water mark kept outside it, its unfinished runs are held ``restored-review``, and
nothing it forgot is sent again until an operator attests what the product holds.

The rehearsal is the operator's own: ``pg_dump`` of the live database, a mutation sent
after it, ``pg_restore --clean`` of the dump, ``serve`` as usual.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.store.database import sync_connection
from tests.support import (
    Service,
    Services,
    coordinator,
    events,
    pg_dump,
    pg_restore,
    run_state,
    wait_state,
)

HELD_AT_CASEWORK = {"match": "POST /v1/review-requests", "mode": "hold", "seconds": 300}
CONNECTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "reviews": ("casework", {}),
    "notices": ("messaging", {}),
}


def mark_of(config: Path) -> Path:
    return Path(json.loads(config.read_text())["database"]["highWaterMark"])


def test_a_restored_backup_sends_nothing_again_until_an_operator_attests(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    service, products = services.deploy(["two-mutations"], CONNECTIONS)
    products.faults("casework", HELD_AT_CASEWORK)
    run = service.start_run("two-mutations", {"id": "applicant-1"})
    products.wait_in_flight("casework")
    backup = tmp_path / "backup.dump"
    pg_dump(dsn, backup)  # the run is at its first call, the message not yet sent
    products.faults("casework")  # released: the review is made, then the message sent
    wait_state(dsn, run, RunState.FINISHED)
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1
    assert service.stop() == 0

    pg_restore(dsn, backup)
    assert run_state(dsn, run)["state"] == RunState.RUNNING  # as the backup had it
    again = services.start(service.config, tmp_path / "restored.log")

    held = run_state(dsn, run)
    assert (held["state"], held["hold_code"]) == (RunState.HELD, HoldCode.RESTORED_REVIEW)
    kinds = [e["kind"] for e in events(dsn, run)]
    assert kinds[-2:] == ["call-lost", "held"], kinds  # the sending in the backup, settled
    assert "restored from a backup" in (tmp_path / "restored.log").read_text()
    ready = again.http.get("/ready")
    assert ready.status_code == 503 and not ready.json()["parts"]["recovery"]["ok"]
    refused = again.http.post(
        "/v1/runs",
        json={"workflow": "two-mutations", "input": {"id": "applicant-2"}},
        headers={"Idempotency-Key": "after-restore"},
    )
    assert (refused.status_code, refused.json()["code"]) == (503, "service.recovery-only")

    unattested = again.http.post(f"/v1/runs/{run}/retry-same", json={"reason": "checked"})
    assert (unattested.status_code, unattested.json()["code"]) == (
        400,
        "request.attestation-missing",
    )
    attested = again.http.post(
        f"/v1/runs/{run}/retry-same",
        json={"reason": "reviewed after the restore", "attestation": "Casework has the review"},
    )
    assert attested.status_code == 200, attested.text
    released = events(dsn, run)[-1]
    assert released["kind"] == "retry-same"
    assert released["detail"]["attestation"] == "Casework has the review"
    assert released["detail"]["held"] == HoldCode.RESTORED_REVIEW
    ended = coordinator("recovery", "end", "--config", str(service.config), "--reason", "done")
    assert ended.returncode == 0, ended.stderr
    assert "ended by local:" in ended.stdout
    assert again.stop() == 0

    # Nothing was sent while the service served operators only: one review, one message.
    assert len(products.requests("casework", "POST", "/v1/review-requests")) == 1
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT ended_by, reason FROM restores").fetchone()
    assert row is not None and row["reason"] == "done"

    services.start(service.config, tmp_path / "after.log")  # the recovery ended: it goes on
    wait_state(dsn, run, RunState.FINISHED)
    assert "restored from a backup" not in (tmp_path / "after.log").read_text()


def test_a_backup_taken_after_the_last_sending_is_no_restore(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    service, _ = services.deploy(["two-mutations"], CONNECTIONS)
    run = service.start_run("two-mutations", {"id": "applicant-1"})
    wait_state(dsn, run, RunState.FINISHED)
    assert service.stop() == 0
    backup = tmp_path / "backup.dump"
    pg_dump(dsn, backup)
    pg_restore(dsn, backup)
    services.start(service.config, tmp_path / "restored.log")
    assert "restored from a backup" not in (tmp_path / "restored.log").read_text()
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM restores").fetchone() == {"n": 0}


def test_a_mark_of_another_database_is_refused_in_one_line(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    config = services.configure(["chain"])
    other = {
        "format": "registry-coordinator.high-water/v1",
        "installation": str(uuid.uuid4()),
        "epoch": 3,
    }
    mark_of(config).write_text(json.dumps(other))
    refused = coordinator("serve", "--config", str(config))
    assert refused.returncode == 1
    assert "belongs to database" in refused.stderr and "Traceback" not in refused.stderr
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT epoch FROM timeline").fetchone() == {"epoch": 0}


def test_recovery_only_admits_nothing_and_says_why(services: Services) -> None:
    config = services.configure(["chain"])

    log = config.with_suffix(".log")
    service = Service(config, log, args=["--recovery-only"]).wait_listening()
    try:
        refused = service.http.post(
            "/v1/runs",
            json={"workflow": "chain", "input": {}},
            headers={"Idempotency-Key": "k"},
        )
        assert (refused.status_code, refused.json()["code"]) == (503, "service.recovery-only")
        assert "--recovery-only" in refused.json()["detail"]
        ready = service.http.get("/ready").json()["parts"]["recovery"]
        assert ready["ok"] is False and "--recovery-only" in ready["detail"]
    finally:
        assert service.stop() == 0


def test_killed_between_the_advance_and_the_mark_nothing_was_sent(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    unasked = {"verification": {"attempts": 0}}  # held at once, the product not asked
    service, products = services.deploy(["notify"], {"notices": ("messaging", unasked)})
    assert service.stop() == 0
    crashing = services.start(service.config, tmp_path / "crash.log", crash_at="mid-mark:1")
    run = crashing.start_run("notify", {"email": "a@example.org"})
    assert crashing.process.wait(30) == -9  # killed itself with the timeline advanced
    line = json.loads(mark_of(service.config).read_text())
    with sync_connection(dsn) as conn:
        epoch = conn.execute("SELECT epoch FROM timeline").fetchone()
    assert epoch is not None and epoch["epoch"] == line["epoch"] + 1  # the mark one behind
    assert products.requests("messaging", "POST", "/v1/messages") == []

    services.start(service.config, tmp_path / "after.log")
    wait_state(dsn, run, RunState.HELD)  # sealed, never sent: not resent on a guess
    assert run_state(dsn, run)["hold_code"] == HoldCode.DISPATCH_INTERRUPTED  # no restore
    assert products.requests("messaging", "POST", "/v1/messages") == []
