"""/metrics of a live service for what operators' dashboards and alerts are built on: the
reads of wait-for results and reconcile's receipt lookups, timed by connection, catalog
operation and result; how long the run held longest has waited; each pool's size."""

from __future__ import annotations

from collections import Counter

from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import HANG_ONCE, QUIET, Services, decide, metrics, new_review, push, wait_state


def held_for(dsn: str, run: str) -> float:
    """Seconds since the run's latest hold, by the database's clock."""
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM clock_timestamp() - max(at))::float8 AS seconds "
            "FROM run_events WHERE run_id = %s AND kind = 'held'",
            (run,),
        ).fetchone()
    assert row is not None
    return float(row["seconds"])


def test_reads_lookups_the_longest_hold_and_pool_sizes_are_on_metrics(
    dsn: str, services: Services
) -> None:
    completions = {"secret": "env:STANDIN_WEBHOOK_SECRET"}
    reviews = {**QUIET, "resultPoll": "PT1S", "completions": completions}
    # Held at once, Messaging not asked for a receipt until an operator reconciles.
    notices = {"requestTimeout": "PT1S", "poolSize": 3, "verification": {"attempts": 0}}
    service, products = services.deploy(
        ["await-review", "notify"],
        {"reviews": ("casework", reviews), "notices": ("messaging", notices)},
    )
    before = metrics(service)
    assert before[("coordinator_held_runs_oldest_seconds", ())] == 0
    assert before[("coordinator_pool_size", (("connection", "notices"),))] == 3
    assert before[("coordinator_pool_size", (("connection", "reviews"),))] == 4  # the default

    # A result found by polling: decided before its run waits (after the feed's first
    # read, so that only the run's polls find it), and not ready twice first: Casework
    # busy, then the result still pending.
    products.feed_read()
    decided = products.decided_reviews(1, "application-review")[0]
    result = "GET /v1/review-requests/"
    products.faults(
        "casework",
        {"match": result, "mode": "status", "status": 503, "retryAfter": 1, "times": 1},
        {"match": result, "mode": "answer", "status": 202, "body": "", "times": 1},
    )
    polled = service.start_run("await-review", {"requestId": decided})
    wait_state(dsn, polled, RunState.FINISHED)
    # A result Casework pushed the completion of once its run waits.
    review = new_review(products)
    delivered = service.start_run("await-review", {"requestId": review})
    wait_state(dsn, delivered, RunState.WAITING)
    decide(products, review)
    push(service, review, "evt-1")
    wait_state(dsn, delivered, RunState.FINISHED)

    # Two notices held outcome-unknown; reconcile completes the first on its receipt.
    held = []
    for email in ("a@example.org", "b@example.org"):
        products.faults("messaging", HANG_ONCE)
        held.append(service.start_run("notify", {"email": email}))
        wait_state(dsn, held[-1], RunState.HELD)
    answer = service.http.post(f"/v1/runs/{held[0]}/reconcile", json={"reason": "OPS-9: receipt"})
    assert answer.status_code == 200, answer.text
    wait_state(dsn, held[0], RunState.FINISHED)

    since = held_for(dsn, held[1])
    after = metrics(service)
    until = held_for(dsn, held[1])
    reads = products.requests("casework", "GET", "/v1/review-requests/")
    classes = Counter(f"{r['status'] // 100}xx" for r in reads)
    # The busy answer; the pending one and each run's final read, at least.
    assert classes["5xx"] == 1 and classes["2xx"] >= 3, reads
    fetches = "coordinator_result_fetch_duration_seconds_count"
    fetched = {
        labels: value for (name, labels), value in after.items() if name == fetches and value
    }
    assert fetched == {
        (("connection", "reviews"), ("operation", "read-review-result"), ("result", result)): n
        for result, n in classes.items()
    }
    lookups = "coordinator_receipt_lookup_duration_seconds_count"
    looked_up = {labels: value for (name, labels), value in after.items() if name == lookups}
    assert looked_up == {
        (("connection", "notices"), ("operation", "submit-message"), ("result", "2xx")): 1
    }
    receipts = products.requests("messaging", "POST", "/v1/messages/receipt")
    assert [r["status"] for r in receipts] == [200]
    assert after[("coordinator_held_runs", ())] == 1
    assert since <= after[("coordinator_held_runs_oldest_seconds", ())] <= until
    assert after[("coordinator_pool_size", (("connection", "notices"),))] == 3
    assert after[("coordinator_pool_size", (("connection", "reviews"),))] == 4
