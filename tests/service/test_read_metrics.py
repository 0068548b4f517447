"""/metrics of a live service for what operators' dashboards and alerts are built on: the
reads of wait-for results and reconcile's receipt lookups, timed by connection, catalog
operation and result; how long the run held longest has waited; each pool's size."""

from __future__ import annotations

from collections import Counter

from registry_coordinator.engine.database import sync_connection
from registry_coordinator.semantics.codes import RunState
from tests.harness import HANG_ONCE, Services, decide, delivery_request, wait_state
from tests.service.test_results import new_review
from tests.service.test_surface import metrics


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
    reviews = {"resultPoll": "PT1S", "webhookSecret": "env:STANDIN_WEBHOOK_SECRET"}
    notices = {"requestTimeout": "PT1S", "poolSize": 3}
    service, products = services.deploy(
        ["await-review", "notify"],
        {"reviews": ("casework", reviews), "notices": ("messaging", notices)},
    )
    before = metrics(service)
    assert before[("coordinator_held_runs_oldest_seconds", ())] == 0
    assert before[("coordinator_pool_size", (("connection", "notices"),))] == 3
    assert before[("coordinator_pool_size", (("connection", "reviews"),))] == 4  # the default

    # A result found by polling: decided before its run waits, and not found twice first.
    decided = products.decided_reviews(1, "application-review")[0]
    products.faults(
        "casework",
        {"match": "GET /v1/review-requests/", "mode": "status", "status": 404, "times": 2},
    )
    polled = service.start_run("await-review", {"requestId": decided})
    wait_state(dsn, polled, RunState.FINISHED)
    # A result delivered by a signed webhook once its run waits.
    review = new_review(products)
    delivered = service.start_run("await-review", {"requestId": review})
    wait_state(dsn, delivered, RunState.WAITING)
    decide(products, review)
    body = {"result": "review-decision", "key": review, "eventId": "evt-1"}
    assert service.http.post(**delivery_request(body)).status_code == 202
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
    assert classes["4xx"] == 2 and classes["2xx"] >= 2, reads  # each run's final read, at least
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
    receipts = products.requests("messaging", "GET", "/v1/messages/by-idempotency-key/")
    assert [r["status"] for r in receipts] == [202]
    assert after[("coordinator_held_runs", ())] == 1
    assert since <= after[("coordinator_held_runs_oldest_seconds", ())] <= until
    assert after[("coordinator_pool_size", (("connection", "notices"),))] == 3
    assert after[("coordinator_pool_size", (("connection", "reviews"),))] == 4
