"""Upgrading a database of the previous schema version with runs in every state.

The previous release's code cannot run here, so its database is made the only way left:
the real service brings runs to waiting, running (killed with a call in flight, the claim
still its) and held, and then SQL takes the database back to schema 8, undoing each later
migration by the reversal kept below. The result is shown to be a schema-8 database (its
catalog equals that of a database migrated only to 8), ``coordinator migrate`` upgrades it,
and the restarted service carries every run on: no run is lost, no mutation is sent again
without an operator asking, and ``coordinator audit verify`` finds every history chained,
events from before the upgrade by the migration and those after by the trigger.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from registry_coordinator.semantics.codes import HoldCode, RunState
from registry_coordinator.store import migrations
from registry_coordinator.store.database import sync_connection
from tests.support import (
    HANG_ONCE,
    STANDIN_TOKEN,
    Cluster,
    Services,
    StandIns,
    coordinator,
    database,
    decide,
    deliver,
    events,
    new_review,
    reviews,
    run_state,
    until,
    wait_state,
)

#: The schema version before the one this upgrade is about.
PREVIOUS = 8


def defined(version: int, function: str) -> str:
    """The statement of migration ``version`` that creates ``function``: a reversal that
    puts back a function's earlier body takes it from where it was written."""
    sql = next(m.sql for m in migrations.known() if m.version == version)
    start = sql.index(f"CREATE FUNCTION {function}(")
    return sql[start : sql.index("$$;", sql.index("$$", start) + 2) + 3]


#: How to take a database back from each migration after :data:`PREVIOUS` to the one
#: before it, newest first when applied; each ends by unrecording its version as
#: ``migrations.migrate`` records it (a row of ``coordinator_migrations``). Objects are
#: dropped without CASCADE, so a dependency the reversal does not know of stops it.
REVERSALS: dict[int, str] = {
    9: """
        DROP TRIGGER run_events_chained ON run_events;
        DROP FUNCTION chain_event();
        ALTER TABLE run_events DROP COLUMN hash;
        DROP FUNCTION event_hash(bytea, uuid, integer, timestamptz, text, text, text, jsonb);
        DROP FUNCTION canonical_json(jsonb);
        DELETE FROM coordinator_migrations WHERE version = 9;
    """,
    # Signed checkpoints and the archive; run_events_append_only back on refuse_change.
    10: """
        DROP TRIGGER run_events_append_only ON run_events;
        CREATE TRIGGER run_events_append_only BEFORE UPDATE OR DELETE ON run_events
            FOR EACH ROW EXECUTE FUNCTION refuse_change();
        DROP FUNCTION history_leaves();
        DROP FUNCTION hold_new_runs();
        DROP INDEX runs_ended;
        DROP INDEX runs_by_update;
        DROP TABLE archived_runs;
        DROP TABLE audit_leaves;
        DROP TABLE audit_checkpoints;
        DELETE FROM coordinator_migrations WHERE version = 10;
    """,
    11: """
        ALTER TABLE runs DROP COLUMN traceparent;
        DELETE FROM coordinator_migrations WHERE version = 11;
    """,
    # The products' contracts: sealed headers and preparations, checks, feed cursors.
    12: """
        DROP TABLE feed_cursors;
        ALTER TABLE runs DROP COLUMN checks;
        ALTER TABLE executions DROP COLUMN prepared;
        ALTER TABLE executions DROP COLUMN headers;
        DELETE FROM coordinator_migrations WHERE version = 12;
    """,
    # The timeline a restored database is recognised by, and its restores.
    13: """
        DROP TABLE restores;
        DROP TABLE timeline;
        DELETE FROM coordinator_migrations WHERE version = 13;
    """,
    # Runs leave the hot tables through a function with the owner's rights.
    14: """
        DROP FUNCTION remove_archived(uuid[]);
        DELETE FROM coordinator_migrations WHERE version = 14;
    """,
    # The binding each sending went over, and an operator's rebinding.
    15: """
        ALTER TABLE runs DROP COLUMN rebind;
        ALTER TABLE executions DROP COLUMN binding;
        DELETE FROM coordinator_migrations WHERE version = 15;
    """,
    # Data keys, and the key a run's personal data is sealed under.
    16: """
        ALTER TABLE runs DROP COLUMN data_key;
        DROP TABLE data_keys;
        DELETE FROM coordinator_migrations WHERE version = 16;
    """,
    17: """
        DROP INDEX archived_runs_by_data_key;
        ALTER TABLE archived_runs DROP COLUMN data_key;
        DROP INDEX runs_by_data_key;
        ALTER TABLE data_keys DROP COLUMN erased_by, DROP COLUMN erase_reason,
            DROP CONSTRAINT data_keys_shared_kept;
        DROP INDEX data_keys_by_subject;
        ALTER TABLE data_keys ADD CONSTRAINT data_keys_subject_key UNIQUE (subject);
        DELETE FROM coordinator_migrations WHERE version = 17;
    """,
    18: """
        DROP FUNCTION forget_deliveries(bigint);
        DROP TRIGGER deliveries_append_only ON deliveries;
        CREATE TRIGGER deliveries_append_only BEFORE UPDATE OR DELETE ON deliveries
            FOR EACH ROW EXECUTE FUNCTION refuse_change();
        DROP FUNCTION deliveries_forget_only();
        DELETE FROM coordinator_migrations WHERE version = 18;
    """,
    19: """
        ALTER TABLE admission_events DROP COLUMN data_key;
        ALTER TABLE admission DROP COLUMN data_key;
        DELETE FROM coordinator_migrations WHERE version = 19;
    """,
    20: """
        ALTER TABLE runs DROP COLUMN sealed_from;
        DELETE FROM coordinator_migrations WHERE version = 20;
    """,
    21: f"""
        DROP FUNCTION remove_archived(uuid[]);
        DROP FUNCTION forget_deliveries(bigint);
        DROP FUNCTION waited_for(uuid[]);
        {defined(14, "remove_archived")}
        REVOKE ALL ON FUNCTION remove_archived(uuid[]) FROM PUBLIC;
        {defined(18, "forget_deliveries")}
        REVOKE ALL ON FUNCTION forget_deliveries(bigint) FROM PUBLIC;
        DELETE FROM coordinator_migrations WHERE version = 21;
    """,
    22: """
        DROP INDEX runs_one_live_per_key;
        ALTER TABLE runs DROP COLUMN concurrency_key;
        DELETE FROM coordinator_migrations WHERE version = 22;
    """,
    23: """
        DROP INDEX runs_paused_for;
        ALTER TABLE runs DROP COLUMN paused_for;
        DROP TABLE connection_pause_events;
        DROP TABLE connection_pauses;
        DELETE FROM coordinator_migrations WHERE version = 23;
    """,
    24: """
        DROP TABLE run_search;
        DELETE FROM coordinator_migrations WHERE version = 24;
    """,
    25: """
        DROP TABLE bulk_job_events;
        DROP TABLE bulk_job_runs;
        DROP TABLE bulk_jobs;
        DELETE FROM coordinator_migrations WHERE version = 25;
    """,
    26: """
        DROP TABLE approvals;
        DELETE FROM coordinator_migrations WHERE version = 26;
    """,
    27: """
        ALTER TABLE admission_events DROP COLUMN workflow_id;
        DROP TABLE workflow_holds;
        DELETE FROM coordinator_migrations WHERE version = 27;
    """,
}

#: The schema, read from PostgreSQL's catalogs in an order that does not depend on when
#: or in which database each object was made. A column's position is its rank among the
#: table's columns, not its attribute number: a column dropped and added again keeps its
#: place but not its number.
CATALOG = {
    "relations": """
        SELECT c.relname, c.relkind, c.relpersistence, c.relrowsecurity
        FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
        ORDER BY c.relname COLLATE "C"
    """,
    "columns": """
        SELECT table_name, column_name,
               row_number() OVER (PARTITION BY table_name ORDER BY ordinal_position) AS place,
               data_type, udt_name, is_nullable, column_default, character_maximum_length,
               numeric_precision, numeric_scale, collation_name, is_identity, is_generated,
               generation_expression
        FROM information_schema.columns WHERE table_schema = 'public'
        ORDER BY table_name COLLATE "C", place
    """,
    "constraints": """
        SELECT conrelid::regclass::text AS relation, conname, contype, condeferrable,
               condeferred, convalidated, pg_get_constraintdef(oid, true) AS definition
        FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        ORDER BY conrelid::regclass::text COLLATE "C", conname COLLATE "C"
    """,
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
        ORDER BY tablename COLLATE "C", indexname COLLATE "C"
    """,
    "triggers": """
        SELECT tgrelid::regclass::text AS relation, tgname, tgenabled,
               pg_get_triggerdef(oid, true) AS definition
        FROM pg_trigger WHERE NOT tgisinternal
          AND tgrelid IN (SELECT oid FROM pg_class WHERE relnamespace = 'public'::regnamespace)
        ORDER BY tgrelid::regclass::text COLLATE "C", tgname COLLATE "C"
    """,
    "functions": """
        SELECT proname, pg_get_function_identity_arguments(oid) AS arguments,
               pg_get_functiondef(oid) AS definition
        FROM pg_proc WHERE pronamespace = 'public'::regnamespace
        ORDER BY proname COLLATE "C", pg_get_function_identity_arguments(oid) COLLATE "C"
    """,
    "types": """
        SELECT typname, typtype FROM pg_type WHERE typnamespace = 'public'::regnamespace
        ORDER BY typname COLLATE "C"
    """,
    "views": """
        SELECT viewname, definition FROM pg_views WHERE schemaname = 'public'
        ORDER BY viewname COLLATE "C"
    """,
    "extensions": 'SELECT extname, extversion FROM pg_extension ORDER BY extname COLLATE "C"',
    "migrations": "SELECT version, name, checksum FROM coordinator_migrations ORDER BY version",
}

#: The engine asks no product what became of a mutation whose outcome is unknown: such a
#: run is held at once, and stays held across the upgrade until an operator acts.
ASKS_NOTHING = {"verification": {"attempts": 0}}
#: Each workflow's connection, bound to its stand-in product. The notices time out after
#: a second, so the notice whose answer Messaging keeps (HANG_ONCE) is held. Casework's
#: feed is read only as each service starts: the review's wake-up is the test's webhook.
CONNECTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "notices": ("messaging", {"requestTimeout": "PT1S", **ASKS_NOTHING}),
    "records": ("breg", {}),
    "registry": ("breg", ASKS_NOTHING),
    **reviews(feedPoll="PT10M", resultPoll="PT10M"),
}
WORKFLOWS = ["notify", "await-review", "lookup", "act", "timed-choice"]

#: BReg applies the action and keeps its answer, and holds record reads back: both calls
#: are in flight when the service is killed (the reads that prepare the action, of the
#: registry's metadata and the target's condition, are answered).
IN_FLIGHT = [
    {"match": "POST /v1/actions/mark-reviewed$", "mode": "hang-after-apply", "seconds": 60},
    {"match": "GET /v1/records/", "mode": "delay", "seconds": 60},
]

REASON = {"reason": "UPG-9: checked after the upgrade"}
ACTION = "/v1/actions/mark-reviewed"  # act's invocation
AUTH = {"Authorization": f"Bearer {STANDIN_TOKEN}"}


def after_previous() -> list[migrations.Migration]:
    """This build's migrations after :data:`PREVIOUS`."""
    return [m for m in migrations.known() if m.version > PREVIOUS]


def test_every_migration_after_the_previous_version_has_its_reversal() -> None:
    """Without its reversal, a new migration would leave the upgrade test on a database
    that is not the previous version's."""
    missing = [m.version for m in after_previous() if m.version not in REVERSALS]
    assert not missing, f"add the reversal of migrations {missing} to REVERSALS"
    assert sorted(REVERSALS) == [m.version for m in after_previous()]


def catalog(dsn: str) -> dict[str, list[dict[str, Any]]]:
    """What a schema version is made of, comparable between databases."""
    with sync_connection(dsn) as conn:
        return {part: conn.execute(sql).fetchall() for part, sql in CATALOG.items()}


def migrated_only_to(dsn: str, version: int) -> None:
    """Migrate ``dsn`` with the migrations up to ``version`` only, as a build of that
    version would."""
    every = migrations.known()

    async def apply() -> None:
        async with database(dsn):  # migrates on opening
            pass

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(migrations, "known", lambda: every[:version])
        trio.run(apply)


def take_back_to_previous(dsn: str) -> None:
    """Undo every migration after :data:`PREVIOUS`, newest first, in one transaction."""
    with sync_connection(dsn) as conn, conn.transaction():
        for migration in reversed(after_previous()):
            conn.execute(REVERSALS[migration.version])


def hashes(dsn: str) -> dict[tuple[str, int], bytes]:
    """Every event's hash by (run, seq): the chain as it stands."""
    with sync_connection(dsn) as conn:
        rows = conn.execute("SELECT run_id::text AS run, seq, hash FROM run_events").fetchall()
    return {(r["run"], r["seq"]): bytes(r["hash"]) for r in rows}


def mutations(products: StandIns, product: str, path: str) -> list[tuple[str, str]]:
    """The (idempotency key, body digest) of each request Coordinator sent ``product`` at
    ``path`` under a key of its own (``coordinator:RUN:STEP``), in the order received: the
    test's own requests, a review requested and decided at Casework, are not Coordinator's."""
    sent = [r for r in products.requests(product, "POST", path) if r["path"] == path]
    return [
        (r["key"], r["bodySha256"]) for r in sent if (r["key"] or "").startswith("coordinator:")
    ]


def test_runs_waiting_running_and_held_go_on_across_the_upgrade(
    cluster: Cluster, dsn: str, services: Services
) -> None:
    # The previous version sealed nothing: its runs' data is as they were given.
    service, products = services.deploy(WORKFLOWS, CONNECTIONS, extra={"custody": {}})
    products.faults("messaging", HANG_ONCE)
    products.faults("breg", *IN_FLIGHT)
    notice = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, notice, RunState.HELD)
    review = new_review(products)
    awaiting = service.start_run("await-review", {"requestId": review})
    wait_state(dsn, awaiting, RunState.WAITING)
    reading = service.start_run("lookup", {"recordId": str(uuid.uuid4())})
    acting = service.start_run("act", {"recordId": str(uuid.uuid4())})
    products.wait_in_flight("breg", 2)
    # Due 2 s after its admission: while the service is down, so the restart finds it late.
    sleeping = service.start_run("timed-choice", {"answer": "yes"})
    wait_state(dsn, sleeping, RunState.WAITING)
    service.kill()
    runs = [notice, awaiting, reading, acting, sleeping]

    at_kill = {run: run_state(dsn, run) for run in runs}
    assert {run: row["state"] for run, row in at_kill.items()} == {
        notice: "held",
        awaiting: "waiting",
        reading: "running",
        acting: "running",
        sleeping: "waiting",
    }
    assert at_kill[notice]["hold_code"] == HoldCode.OUTCOME_UNKNOWN
    for run in (reading, acting):  # still claimed by the dead process, mid-call
        assert at_kill[run]["lease_token"] is not None
        assert at_kill[run]["dispatched_at"] is not None
    before = {run: events(dsn, run) for run in runs}
    chained = hashes(dsn)
    current = catalog(dsn)

    take_back_to_previous(dsn)
    # The previous build kept no high-water mark: the one this build made goes with it.
    Path(json.loads(service.config.read_text())["database"]["highWaterMark"]).unlink()
    previous = cluster.create_database()
    migrated_only_to(previous, PREVIOUS)
    assert catalog(dsn) == catalog(previous) != current
    assert {run: events(dsn, run) for run in runs} == before  # the runs are as they were

    upgraded = coordinator("migrate", "--config", service.config)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.splitlines() == [
        f"applied {m.version:04d} {m.name}" for m in after_previous()
    ]
    assert catalog(dsn) == current  # the same schema as a database made at this version
    assert hashes(dsn) == chained  # the migration chains the old events as the trigger did

    products.faults("breg")  # the reads and actions from now on are answered at once
    feed_reads = len(products.requests("casework", "GET", "/v1/review-results"))
    again = services.start(service.config)
    until(  # its first pass over Casework's feed, before the review is decided
        lambda: len(products.requests("casework", "GET", "/v1/review-results")) > feed_reads,
        "the restarted service's first read of Casework's feed",
    )
    wait_state(dsn, acting, RunState.HELD)  # a mutation cut off by the kill: never resent
    assert run_state(dsn, acting)["hold_code"] == HoldCode.DISPATCH_INTERRUPTED
    for run in (reading, sleeping):
        wait_state(dsn, run, RunState.FINISHED)
    decide(products, review)
    woken = deliver(again, {"result": "review-decision", "key": review, "eventId": "evt-up"})
    assert (woken.status_code, woken.json()["woke"]) == (202, 1)
    wait_state(dsn, awaiting, RunState.FINISHED)
    assert run_state(dsn, notice)["state"] == RunState.HELD  # it waits for an operator
    actions = mutations(products, "breg", ACTION)
    notices = mutations(products, "messaging", "/v1/messages")
    assert [key for key, _ in actions] == [f"coordinator:{acting}:invoke"]
    assert [key for key, _ in notices] == [f"coordinator:{notice}:send"]

    reconciled = again.http.post(f"/v1/runs/{notice}/reconcile", json=REASON)
    assert reconciled.status_code == 200, reconciled.text
    retried = again.http.post(f"/v1/runs/{acting}/retry-same", json=REASON)
    assert retried.status_code == 200, retried.text
    for run in (notice, acting):
        wait_state(dsn, run, RunState.FINISHED)
    statuses = {run: again.status(run) for run in runs}
    assert {run: status["outcome"] for run, status in statuses.items()} == {
        notice: "sent",
        awaiting: "decided",
        reading: "found",
        acting: "acted",
        sleeping: "yes",
    }
    # The receipt's: the message Messaging accepted, as Messaging shows it.
    message = statuses[notice]["output"]["messageId"]
    shown = httpx.get(f"{products.url('messaging')}/v1/messages/{message}", headers=AUTH)
    assert shown.status_code == 200 and shown.json()["id"] == message, shown.text
    assert statuses[awaiting]["output"] == {"decision": "approved"}
    # Each mutation reached its product once, and the action once more only when an
    # operator asked, with the same key and bytes; each product applied each once.
    assert mutations(products, "messaging", "/v1/messages") == notices
    assert mutations(products, "breg", ACTION) == actions * 2
    assert products.ledger("messaging")["applied"] == {notices[0][0]: 1}
    assert products.ledger("breg")["applied"] == {actions[0][0]: 1}
    # The reconcile asked Messaging for its receipt once, resending the original key and
    # body to the receipt route (a read); Casework got no request under a key of ours.
    assert mutations(products, "messaging", "/v1/messages/receipt") == notices
    assert not [
        r
        for r in products.ledger("casework")["requests"]
        if (r["key"] or "").startswith("coordinator:")
    ]

    # Each history goes on from where it was, gap-free, with what the engine's rules say:
    # the read cut off by the kill read again; the action cut off held until an operator
    # resent it; the notice held until the operator's reconcile found its receipt.
    after = {
        notice: ["reconciled", "finished"],
        awaiting: ["result-delivered", "result-read", "step-completed", "finished"],
        reading: [
            *("call-lost", "retry-scheduled"),
            *("call-dispatched", "call-answered", "step-completed", "finished"),
        ],
        acting: [
            *("call-lost", "held", "retry-same"),
            *("call-dispatched", "call-answered", "step-completed", "finished"),
        ],
        sleeping: ["step-completed", "step-completed", "finished"],
    }
    total = 0
    for run in runs:
        history = events(dsn, run)
        total += len(history)
        assert history[: len(before[run])] == before[run]
        assert [e["kind"] for e in history[len(before[run]) :]] == after[run], history
        assert [e["seq"] for e in history] == list(range(1, len(history) + 1))
    verified = coordinator("audit", "verify", "--config", service.config)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.startswith(f"verified 5 runs, {total} events"), verified.stdout
