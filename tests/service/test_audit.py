"""`coordinator audit verify` against a real service's database: counts when every history
holds, and the run and event where one was changed in SQL, with the exit codes."""

from __future__ import annotations

import uuid

from registry_coordinator.engine.database import sync_connection
from registry_coordinator.semantics.codes import RunState
from tests.harness import Services, coordinator, events, wait_state

NOTIFY: dict[str, tuple[str, dict[str, str]]] = {"notices": ("messaging", {})}


def test_audit_verify_counts_what_holds_and_names_what_was_changed(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(["notify"], NOTIFY)
    runs = [service.start_run("notify", {"email": f"{n}@example.org"}) for n in range(2)]
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    written = sum(len(events(dsn, run)) for run in runs)
    history = service.history(runs[0])
    assert service.status(runs[0])["head"] == history[-1]["hash"]  # the API shows the head
    assert len({event["hash"] for event in history}) == len(history)
    status = coordinator("runs", "status", runs[0], "--url", service.url)
    assert f"  head      {history[-1]['hash']} (its history's hash chain)" in status.stdout
    holds = coordinator("audit", "verify", "--config", service.config)
    assert holds.returncode == 0, holds.stderr
    assert holds.stdout == f"verified 2 runs, {written} events: every history holds its chain\n"

    with sync_connection(dsn) as conn:  # an administrator edits a row, triggers off
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE run_events SET actor = 'someone else' WHERE run_id = %s AND seq = 2",
            (runs[1],),
        )
    broken = coordinator("audit", "verify", "--config", service.config)
    assert broken.returncode == 1
    assert broken.stdout == f"run {runs[1]}: event 2: its hash does not match what it holds\n"
    assert "1 of 2 runs" in broken.stderr
    one = coordinator("audit", "verify", "--config", service.config, "--run", runs[0])
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith("verified 1 runs, ")
    nobody = coordinator("audit", "verify", "--config", service.config, "--run", str(uuid.uuid4()))
    assert nobody.returncode == 1
    assert "no run" in nobody.stderr
    bad = coordinator("audit", "verify", "--config", service.config, "--since", "yesterday")
    assert bad.returncode == 2
    assert "--since 'yesterday' is not an RFC 3339 instant" in bad.stderr
