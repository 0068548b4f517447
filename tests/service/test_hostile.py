"""A hostile or slow product, and stored runs this build finds broken, against the real service.

What a product answers is outside Coordinator's control: JSON PostgreSQL cannot store,
results that stay pending under a stream of completions, a token endpoint that hangs, a
pool swamped by reads. Each case checks that every answer in hand is recorded, that
sends stay bounded, and that every hold names its true reason.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from registry_coordinator.authoring.canonical import canonical_bytes, digest_of
from registry_coordinator.store.database import sync_connection
from tests.support import (
    Service,
    Services,
    completion_request,
    decide,
    events,
    new_review,
    notify_with_oauth2,
    package,
    push,
    pushing,
    run_state,
    sendings,
    wait_for,
    wait_state,
)

REASON = {"reason": "OPS-31: the product was fixed"}


def record(record_id: str) -> bytes:
    """A record as BReg answers it, fitting read-record's response schema."""
    return (
        b'{"data": {"recordIdentifier": "%s", "revisionIdentifier": "1", '
        b'"domainData": {"status": "awaiting-review"}}, "meta": {"registryIdentifier": '
        b'"applications-registry", "datasetIdentifier": "applications", '
        b'"entityTypeIdentifier": "application"}}'
    ) % record_id.encode()


#: 2xx answers to a mutation that PostgreSQL could not store as they are.
UNSTORABLE = {
    "NaN": b'{"id": "m-1", "status": "accepted", "score": NaN}',
    "NUL": b'{"id": "m-\\u0000", "status": "accepted"}',
    "surrogate": b'{"id": "m-\\ud800", "status": "accepted"}',
    "deep": b'{"id": "m-1", "status": "accepted", "d": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
}


def kept_responses(dsn: str, run: str) -> list[bytes]:
    return [r["response"] or b"" for r in sendings(dsn, run)]


def test_a_mutation_answered_with_json_the_database_cannot_store_is_held_with_its_evidence(
    dsn: str, services: Services
) -> None:
    """Messaging applies the message and answers 202 with a body holding NaN, a NUL, a
    lone surrogate, or 50,000 levels of nesting. The run is held response-invalid (not
    dispatch-interrupted: the service never stopped), the body kept whole on the call's
    execution and its start shown escaped in the detail; retry-same clears the hold
    (the product answers the repeated key with its original answer)."""
    service, products = services.deploy(["notify"], {"notices": ("messaging", {})})
    for name, body in UNSTORABLE.items():
        products.faults(
            "messaging",
            {
                "match": "POST /v1/messages",
                "mode": "answer",
                "status": 202,
                "body": body.decode(),
                "times": 1,
            },
        )
        run = service.start_run("notify", {"email": f"{name}@example.org"})
        wait_state(dsn, run, "held")
        hold = service.status(run)["hold"]
        assert hold["code"] == "response-invalid", (name, hold)
        assert "answered 202 with a response that cannot be used" in hold["detail"]
        assert "\x00" not in hold["detail"] and len(hold["detail"]) <= 500
        assert kept_responses(dsn, run) == [body]
        retried = service.http.post(f"/v1/runs/{run}/retry-same", json=REASON)
        assert retried.status_code == 200, retried.text
        wait_state(dsn, run, "finished")
    posts = products.requests("messaging", "POST", "/v1/messages")
    applied = products.ledger("messaging")["applied"]
    assert len(posts) == 2 * len(UNSTORABLE)  # each sent, and resent once by an operator
    assert sorted(applied.values()) == [1] * len(UNSTORABLE)  # each applied once


def test_a_read_answered_with_json_the_database_cannot_store_is_read_again(
    dsn: str, services: Services
) -> None:
    """A read answered 200 with NaN, then with a NUL, is an invalid answer: read again
    after a backoff, as SPEC says for reads — not left to its lease and recorded as if
    the service had stopped mid-read."""
    service, products = services.deploy(["bench-four"], {"registry": ("breg", {})})
    for poison in (b"NaN", b'"\\u0000"'):
        record_id = str(uuid.uuid4())
        body = record(record_id).replace(b'"awaiting-review"', poison)
        products.faults(
            "breg",
            {
                "match": "GET /v1/records",
                "mode": "answer",
                "status": 200,
                "body": body.decode(),
                "times": 1,
            },
        )
        run = service.start_run("bench-four", {"recordId": record_id})
        wait_state(dsn, run, "finished")
        retries = [e for e in events(dsn, run) if e["kind"] == "retry-scheduled"]
        assert len(retries) == 1, events(dsn, run)
        assert "cannot be used" in retries[0]["detail"]["detail"]
        reads = products.requests("breg", "GET", f"/v1/records/applications/{record_id}")
        assert len(reads) == 2  # the unusable answer, then one more read


def test_one_completion_of_a_pending_result_is_followed_by_one_read(
    dsn: str, services: Services
) -> None:
    """Casework pushes review.completed, but the result still reads pending: Coordinator
    reads it once and waits for the next completion (or its poll). It used to read it
    again and again, some forty times in a second. (Before that: completions whose
    body holds NaN, a NUL or deep nesting are refused, and change nothing.)"""
    service, products = services.deploy(["await-review"], pushing())
    key = new_review(products)
    run = service.start_run("await-review", {"requestId": key})
    wait_state(dsn, run, "waiting")
    path = f"/v1/review-requests/{key}/result"
    # Completions whose body could not be stored are refused and change nothing.
    deep: Any = "x"
    for _ in range(100):
        deep = [deep]
    for extra, code in (
        (float("nan"), "request.malformed-json"),
        ({"note": "a\x00b"}, "request.unstorable-text"),
        (deep, "request.too-deep"),
    ):
        sent = completion_request(key, event_id="bad")
        refused = service.http.post(
            sent["url"],
            content=json.dumps({**sent["json"], "extra": extra}).encode(),
            headers={**sent["headers"], "Content-Type": "application/json"},
        )
        assert (refused.status_code, refused.json()["code"]) == (400, code)
    assert "result-delivered" not in [e["kind"] for e in events(dsn, run)]
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM deliveries").fetchone() == {"n": 0}
    for n in (1, 2):
        push(service, key, f"e{n}")
        wait_for(
            dsn,
            "SELECT count(*) FILTER (WHERE kind = 'result-delivered') FROM run_events",
            n,
        )
        deadline = time.monotonic() + 30
        while len(products.requests("casework", "GET", path)) < n:
            assert time.monotonic() < deadline, "the completion was not followed by a read"
            time.sleep(0.05)
        time.sleep(1.5)  # time enough for the dozens of reads it used to make
        assert len(products.requests("casework", "GET", path)) == n
        assert run_state(dsn, run)["state"] == "waiting"
    assert [r["status"] for r in products.requests("casework", "GET", path)] == [202, 202]
    decide(products, key)
    push(service, key, "e3")
    wait_state(dsn, run, "finished")
    assert len(products.requests("casework", "GET", path)) == 3


def test_result_reads_wait_in_their_connections_queue_like_calls(
    dsn: str, services: Services
) -> None:
    """150 runs waiting for reviews fall due together on a connection with a pool of one,
    whose reads take 40 ms. Reads queue like calls, in half the pool's queue: at most 8 are
    taken in at a time (the rest are left due for later), counted in coordinator_pool_queued,
    and a new run's mutation on that connection goes ahead while most reads are still to
    come. (Reads used to be taken in all at once, uncounted, with sends queued behind.)"""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {"poolSize": 1, "webhookSecret": "env:STANDIN_WEBHOOK_SECRET"}),
        "notices": ("messaging", {}),
    }
    service, products = services.deploy(["await-review", "two-mutations"], connections)
    products.faults(
        "casework", {"match": "GET /v1/review-requests", "mode": "delay", "seconds": 0.04}
    )
    put_to_wait(dsn, 150)
    leased, queued = 0, 0
    mutation = None
    with sync_connection(dsn) as conn:
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the reads did not drain"
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE lease_token IS NOT NULL) AS leased, "
                "count(*) FILTER (WHERE due_at <= now()) AS due "
                "FROM runs WHERE workflow_id = 'await-review'"
            ).fetchone()
            assert row is not None
            leased = max(leased, row["leased"])
            queued = max(queued, pool_queued(service))
            reads = len(products.requests("casework", "GET", "/v1/review-requests/"))
            if mutation is None and reads >= 10:
                mutation = service.start_run("two-mutations", {"id": "x"})
            if reads >= 150 and row["due"] == 0:
                break
            time.sleep(0.05)
    assert mutation is not None
    wait_state(dsn, mutation, "finished")
    sent = products.requests("casework", "POST", "/v1/review-requests")
    reads_before = [
        r
        for r in products.requests("casework", "GET", "/v1/review-requests/")
        if r["at"] < sent[0]["at"]
    ]
    print(
        f"most runs leased at once {leased}, most queued {queued}, reads before the send "
        f"{len(reads_before)} of 150"
    )
    assert 0 < queued <= 16
    assert leased <= 8 + 2  # reads' half of the queue, and a run in each worker's hands
    assert len(sent) == 1 and len(reads_before) < 50


def put_to_wait(dsn: str, count: int) -> None:
    """``count`` runs of await-review waiting for reviews the stand-in has none of (each
    read answers 404, concealed, which holds the run), all due now."""
    with sync_connection(dsn) as conn:
        conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, due_at, admitted_at, deadline_at,
                                  updated_at)
                SELECT gen_random_uuid(), d.digest, d.workflow_id, 'test', 'k' || n, 'x',
                       jsonb_build_object('requestId', 'rev-missing-' || n), 'waiting', 'wait',
                       2, now(), now(), now() + interval '1 hour', now()
                FROM definitions d, generate_series(1, %(count)s) AS n
                WHERE d.workflow_id = 'await-review'
                RETURNING id, input, admitted_at
            ), waiting AS (
                INSERT INTO waits (run_id, step, connection, result, key, since)
                SELECT id, 'wait', 'reviews', 'review-decision', input->>'requestId', admitted_at
                FROM made
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, s, admitted_at, k, 'wait', 'test', '{}'
            FROM made, (VALUES (1, 'admitted'), (2, 'waiting')) AS e (s, k)
            """,
            {"count": count},
        )


def pool_queued(service: Service) -> int:
    text = service.http.get("/metrics").text
    for line in text.splitlines():
        if line.startswith('coordinator_pool_queued{connection="reviews"}'):
            return int(float(line.split()[-1]))
    raise AssertionError("no coordinator_pool_queued for reviews in /metrics")


def test_a_slow_token_endpoint_and_a_shutdown_hold_nothing(
    dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token endpoint hangs while a mutation waits for its token, and the service is
    stopped. Nothing was sealed or sent, so nothing is held: after the restart the message
    is sent, once. (The token used to be fetched after the request was sealed, and the
    shutdown held a mutation that had never left.)"""
    service, products = notify_with_oauth2(services, monkeypatch, grace="PT1S")
    products.faults(
        "idp", {"match": "POST /oauth2/token", "mode": "delay", "seconds": 30, "times": 1}
    )
    run = service.start_run("notify", {"email": "slow@example.org"})
    products.wait_in_flight("idp")
    assert service.stop() == 0
    stopped = run_state(dsn, run)
    assert (stopped["state"], stopped["dispatched_at"]) == ("running", None)
    services.start(service.config, service.log)
    wait_state(dsn, run, "finished")
    posts = products.requests("messaging", "POST", "/v1/messages")
    assert len(posts) == 1
    assert "held" not in [e["kind"] for e in events(dsn, run)]


def store_definition(dsn: str, artifact: bytes, workflow_id: str) -> str:
    digest = digest_of(artifact)
    with sync_connection(dsn) as conn:
        conn.execute(
            "INSERT INTO definitions (digest, workflow_id, version, artifact) "
            "VALUES (%s, %s, 'old', %s)",
            (digest, workflow_id, artifact),
        )
    return digest


def admit_by_sql(dsn: str, digest: str, workflow_id: str, step: str, deadline: str) -> str:
    with sync_connection(dsn) as conn:
        row = conn.execute(
            """
            WITH made AS (
                INSERT INTO runs (id, digest, workflow_id, caller, start_key, start_digest,
                                  input, state, step, seq, due_at, admitted_at, deadline_at,
                                  updated_at)
                VALUES (gen_random_uuid(), %s, %s, 'test', gen_random_uuid()::text, 'x',
                        '{"n": 2}', 'running', %s, 1, now(), now() - interval '1 minute',
                        now() + %s::interval, now() - interval '1 minute')
                RETURNING id, admitted_at, step
            )
            INSERT INTO run_events (run_id, seq, at, kind, step, actor, detail)
            SELECT id, 1, admitted_at, 'admitted', step, 'test', '{}' FROM made
            RETURNING run_id
            """,
            (digest, workflow_id, step, deadline),
        ).fetchone()
    assert row is not None
    return str(row["run_id"])


def test_runs_of_a_definition_this_build_refuses_or_cannot_use(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """Three runs admitted under stored definitions: one this build's rules refuse (its
    deadline is over P366D, as an older build allowed) but can run — it finishes; one
    this build cannot use at all — held definition-unusable after three tries, not
    claimed every lease forever; and one of those past its deadline — it expires."""
    artifact, _ = package("chain", tmp_path / "artifacts")
    document = json.loads(artifact.read_bytes())
    document["workflow"]["deadline"] = "P400D"
    service, _ = services.deploy(["chain"], {}, lease="PT3S")
    refused_today = store_definition(dsn, canonical_bytes(document), "chain")
    unusable = store_definition(dsn, canonical_bytes({"format": "not-an-artifact"}), "chain")
    kept = admit_by_sql(dsn, refused_today, "chain", "now", "1 hour")
    broken = admit_by_sql(dsn, unusable, "chain", "now", "1 hour")
    late = admit_by_sql(dsn, unusable, "chain", "now", "-1 second")
    wait_state(dsn, kept, "finished")
    wait_state(dsn, broken, "held")
    wait_state(dsn, late, "expired")
    time.sleep(1)
    held = service.status(broken)
    tries = run_state(dsn, broken)["defects"]
    assert held["hold"]["code"] == "definition-unusable"
    assert (
        "its definition: not a registry-coordinator.artifact/v1 document" in held["hold"]["detail"]
    )
    assert tries == 3
    assert [e["kind"] for e in events(dsn, broken)] == ["admitted", "held"]
    # An operator can see it and is told why reconcile cannot judge it, in the API and the
    # console, whose pages show the run without the graph the definition would give.
    reconcile = service.http.post(f"/v1/runs/{broken}/reconcile", json={"reason": "look"})
    assert reconcile.status_code == 409
    assert reconcile.json()["code"] == "run.definition-unusable"
    assert f'id="held-{broken}"' in service.http.get("/console/").text
    page = service.http.get(f"/console/runs/{broken}")
    assert page.status_code == 200
    assert "cannot be loaded by this build" in page.text
    assert [e["kind"] for e in events(dsn, late)] == ["admitted", "expired"]
    assert run_state(dsn, kept)["outcome"] == "even"
