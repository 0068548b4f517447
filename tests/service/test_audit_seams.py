"""What ``coordinator audit`` must see beyond each chain, tried as a database superuser
would: an event appended after a run's signed end (correctly chained, triggers off), a
run archived and then asked for by id, and a run removed from the database with the
leaves that signed it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import Service, Services, coordinator, signing, wait_for, wait_state

NOTIFY: dict[str, tuple[str, dict[str, str]]] = {"notices": ("messaging", {})}

#: Mallory's cancel of an ended run: one event chained to its last one (the schema's own
#: ``event_hash``), and the run row moved to match.
FORGED_CANCEL = """
INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail, hash)
SELECT run_id, seq + 1, at + interval '1 second', 'cancelled', step, 'operator:mallory',
       '{{"reason": "forged"}}'::jsonb,
       event_hash(hash, run_id, seq + 1, at + interval '1 second', 'cancelled', step,
                  'operator:mallory', '{{"reason": "forged"}}'::jsonb)
FROM run_events WHERE run_id = '{run}' ORDER BY seq DESC LIMIT 1;
UPDATE runs SET seq = seq + 1, state = 'cancelled', updated_at = now() WHERE id = '{run}';
"""


def _as_superuser(dsn: str, statements: str) -> None:
    with sync_connection(dsn) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(statements)


def _signed_seq(dsn: str, run: str) -> int:
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(max(seq), 0) AS seq FROM audit_leaves WHERE run_id = %s", (run,)
        ).fetchone()
    assert row is not None
    return int(row["seq"])


def _finished(
    dsn: str, services: Services, count: int, extra: dict[str, object] | None = None
) -> tuple[Service, list[str]]:
    service, _ = services.deploy(["notify"], NOTIFY, extra=extra or {})
    runs = [service.start_run("notify", {"email": f"{n}@example.org"}) for n in range(count)]
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    return service, runs


def _finished_then_stopped(dsn: str, services: Services, count: int) -> tuple[Path, list[str]]:
    """``count`` runs of a service that signs nothing itself, finished; the service stopped."""
    service, runs = _finished(dsn, services, count)
    assert service.stop() == 0
    return service.config, runs


def _with_key(config: Path, keys: Path) -> Path:
    """The service's configuration with a signing key: ``audit checkpoint`` signs with it."""
    signed = config.with_name("signed.json")
    signed.write_text(json.dumps({**json.loads(config.read_text()), **signing(keys)}))
    return signed


def test_an_event_after_a_signed_end_is_refused_and_never_signed(
    dsn: str, services: Services
) -> None:
    config, [victim, other] = _finished_then_stopped(dsn, services, 2)
    config = _with_key(config, services.directory / "keys")
    signed = coordinator("audit", "checkpoint", "--config", config)
    assert signed.returncode == 0, signed.stderr
    end = _signed_seq(dsn, victim)

    _as_superuser(dsn, FORGED_CANCEL.format(run=victim))
    looked = coordinator("audit", "verify", "--config", config)
    assert looked.returncode == 1, looked.stdout
    assert looked.stdout == (
        f"run {victim}: event {end + 1}: it follows the run's end, event {end} (finished): "
        "nothing is written after a run ends\n"
    )
    assert "the history does not hold" in looked.stderr

    again = coordinator("audit", "checkpoint", "--config", config)  # the forged head is not signed
    assert again.returncode == 0, again.stderr
    assert _signed_seq(dsn, victim) == end
    out = services.directory / "forged.json"
    exported = coordinator("audit", "export", "--config", config, "--run", victim, "--out", out)
    assert exported.returncode == 1
    assert (
        f"coordinator: run {victim} is not exported: event {end + 1}: "
        f"it follows the run's end, event {end} (finished)"
    ) in exported.stderr, exported.stderr
    assert not out.exists()
    assert _signed_seq(dsn, victim) == end
    alone = coordinator("audit", "verify", "--config", config, "--run", other)
    assert alone.returncode == 0, alone.stdout


def test_an_archived_run_asked_for_says_where_it_went(dsn: str, services: Services) -> None:
    keys, archive = services.directory / "keys", services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    service, [run] = _finished(dsn, services, 1, {**signing(keys), "retention": retention})
    wait_for(dsn, "SELECT count(*) FROM archived_runs WHERE id = %s", 1, params=(run,))
    assert service.stop() == 0
    config = service.config
    looked = coordinator("audit", "verify", "--config", config, "--run", run)
    assert looked.returncode == 0, looked.stdout + looked.stderr
    with sync_connection(dsn) as conn:
        gone = conn.execute(
            "SELECT bundle, seq FROM archived_runs WHERE id = %s", (run,)
        ).fetchone()
    assert gone is not None
    assert looked.stdout == (
        f"run {run} is archived, to the bundle {archive / gone['bundle']}: its record holds "
        f"the head a checkpoint signed (event {gone['seq']}) and its bundle holds; check the "
        "bundle offline with coordinator audit verify --bundle FILE --public-key KEY\n"
    )


def test_a_run_removed_with_its_leaves_is_named_by_where_it_stood(
    dsn: str, services: Services
) -> None:
    config, runs = _finished_then_stopped(dsn, services, 3)
    config = _with_key(config, services.directory / "keys")
    signed = coordinator("audit", "checkpoint", "--config", config)  # one checkpoint, 3 leaves
    assert signed.returncode == 0, signed.stderr
    first, victim, last = sorted(runs)  # leaves are in run id order
    seq = _signed_seq(dsn, victim)

    tables = ("run_events", "executions", "waits", "runs")
    _as_superuser(dsn, ";".join(f"DELETE FROM {t} WHERE {_id(t)} = '{victim}'" for t in tables))
    named = coordinator("audit", "verify", "--config", config)
    assert named.returncode == 1
    assert named.stdout == (
        f"run {victim}: event {seq}: the run is gone: checkpoint 1 signed this event, and "
        "the run is neither in the database nor archived\n"
    )
    alone = coordinator("audit", "verify", "--config", config, "--run", victim)
    assert alone.returncode == 1
    assert alone.stdout == named.stdout

    _as_superuser(dsn, f"DELETE FROM audit_leaves WHERE run_id = '{victim}'")
    placed = coordinator("audit", "verify", "--config", config)
    assert placed.returncode == 1
    assert placed.stdout == (
        "checkpoint 1: 1 of its 3 leaves is missing: position 1, between the runs "
        f"{first} and {last} (in id order); the run it signed was removed with its leaves: "
        "look for a run id in that range in the service's log and in backups\n"
    ), placed.stdout
    assert re.search("its leaves do not give its signed root", placed.stdout) is None


def _id(table: str) -> str:
    return "id" if table == "runs" else "run_id"
