"""Fault injection: the promise that nothing is lost and nothing is sent twice on a guess.

Each scenario prints one row of the summary table: faults injected, runs, finished,
held (and why), lost (must be 0) and duplicate sends (must be 0). Duplicate sends
are counted from the stand-in products' own ledgers: a mutation's idempotency key
received more than once, when no operator asked for a resend.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry_coordinator.database import sync_connection

from .harness import (
    Cluster,
    Service,
    StandIns,
    delivery_request,
    deployment,
    free_port,
    migrate,
    run_state,
    stand_ins,
    wait_for,
    write_config,
)
from .test_operations import oauth2
from .test_results import decide

MUTATIONS = (("casework", "/v1/review-requests"), ("messaging", "/v1/messages"))
HEADER = (
    f"{'scenario':<28} {'faults':>6} {'runs':>5} {'finished':>8} {'held':>22} "
    f"{'lost':>4} {'dup sends':>9}"
)


def summary(
    name: str,
    dsn: str,
    admitted: int,
    faults: int,
    products: StandIns | None = None,
    ended: frozenset[str] = frozenset({"finished", "held"}),
) -> dict[str, Any]:
    """One row of the table, with the invariants every scenario must keep: nothing lost,
    nothing sent twice, gap-free histories, and every run in one of the ``ended`` states."""
    with sync_connection(dsn) as conn:
        states = Counter(
            {
                r["state"]: r["n"]
                for r in conn.execute(
                    "SELECT state, count(*) AS n FROM runs GROUP BY state"
                ).fetchall()
            }
        )
        holds = Counter(
            {
                r["hold_code"]: r["n"]
                for r in conn.execute(
                    "SELECT hold_code, count(*) AS n FROM runs WHERE state = 'held' GROUP BY 1"
                ).fetchall()
            }
        )
        gaps = conn.execute(
            "SELECT count(*) AS n FROM (SELECT run_id, max(seq) AS top, count(*) AS events "
            "FROM run_events GROUP BY run_id) h WHERE top <> events"
        ).fetchone()
        backwards = conn.execute(
            "SELECT count(*) AS n FROM (SELECT at < lag(at) OVER (PARTITION BY run_id "
            "ORDER BY seq) AS earlier FROM run_events) e WHERE earlier"
        ).fetchone()
    duplicates = 0
    if products is not None:
        for product, path in MUTATIONS:
            if product in products.ports:
                duplicates += resent_on_a_guess(products.requests(product, "POST", path))
    total = sum(states.values())
    lost = admitted - total
    held = ", ".join(f"{n} {code}" for code, n in holds.items()) or "0"
    print(
        f"{name:<28} {faults:>6} {total:>5} {states['finished']:>8} {held:>22} {lost:>4} "
        f"{duplicates:>9}"
    )
    assert lost == 0
    assert duplicates == 0
    assert gaps == {"n": 0}  # every history is gap-free
    assert backwards == {"n": 0}  # and never dated before the event before
    assert set(states) <= ended, states
    return {"states": states, "holds": holds}


def resent_on_a_guess(requests: list[dict[str, Any]]) -> int:
    """Mutations received again after an earlier sending that may have taken effect.

    A key may come again only after answers that say the product did not act (429 or
    503); anything else before a resend is a command sent twice on a guess.
    """
    resent = 0
    acted: set[str] = set()
    for request in requests:  # in the order the product received them
        if request["key"] is None:  # not Coordinator's (a caseworker deciding a review)
            continue
        if request["key"] in acted:
            resent += 1
        if request.get("status") not in (429, 503):
            acted.add(request["key"])
    return resent


def start_runs(service: Service, count: int, prefix: str) -> int:
    for n in range(count):
        service.start_run("two-mutations", {"id": f"{prefix}-{n}"}, key=f"{prefix}-{n}")
    return count


def wait_settled(dsn: str, timeout: float = 90) -> None:
    """Until every run has ended or is held for an operator."""
    wait_for(
        dsn, "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held'", 0, timeout
    )


def test_crash_loop_twenty_kills_two_mutations(dsn: str, tmp_path: Path) -> None:
    print("\n" + HEADER)
    casework, messaging = free_port(), free_port()
    connections = {
        "reviews": {
            "product": "casework",
            "baseUrl": f"http://127.0.0.1:{casework}",
            "identity": {"bearer": "env:STANDIN_TOKEN"},
        },
        "notices": {
            "product": "messaging",
            "baseUrl": f"http://127.0.0.1:{messaging}",
            "identity": {"bearer": "env:STANDIN_TOKEN"},
        },
    }
    config = write_config(
        tmp_path, dsn, ["two-mutations"], lease="PT2S", workers=4, connections=connections
    )
    migrate(config)
    log = tmp_path / "service.log"
    chance = random.Random(20261129)
    with stand_ins(
        tmp_path / "standins.log", {"casework": casework, "messaging": messaging}
    ) as products:
        service = Service(config, log).wait_listening()
        admitted = start_runs(service, 200, "crash")
        for _ in range(20):
            time.sleep(chance.uniform(0.05, 0.6))
            service.kill()
            service = Service(config, log).wait_listening()
        wait_settled(dsn)
        service.stop()
        row = summary("crash loop (SIGKILL)", dsn, admitted, 20, products)
    # Every held run is explained by a kill while its mutation was dispatched.
    assert set(row["holds"]) <= {"dispatch-interrupted"}, row["holds"]
    assert row["states"]["finished"] >= 150


def test_database_restart_under_load(cluster: Cluster, dsn: str, tmp_path: Path) -> None:
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    with deployment(tmp_path, dsn, ["two-mutations"], connections, workers=4) as (
        service,
        products,
    ):
        admitted = start_runs(service, 100, "restart")
        time.sleep(0.3)
        cluster.restart()
        not_ready = False
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ready = service.http.get("/ready", timeout=2)
            except httpx.HTTPError:
                continue
            not_ready = not_ready or ready.status_code == 503
            if ready.status_code == 200 and not_ready:
                break
            time.sleep(0.05)
        assert not_ready, "the service never reported the database outage on /ready"
        admitted += start_runs(service, 50, "after")
        wait_settled(dsn)
        assert service.process.poll() is None  # it survived
        row = summary("database restart", dsn, admitted, 1, products)
    assert row["states"]["finished"] == admitted  # nothing needed an operator


def test_two_processes_under_load_do_no_step_twice(dsn: str, tmp_path: Path) -> None:
    """Two service processes on one database and the same products take 200 runs between
    them; one is killed mid-load and started again. No step completes twice in any run,
    and no mutation reaches a product twice."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    with deployment(tmp_path, dsn, ["two-mutations"], connections, workers=3, lease="PT2S") as (
        first,
        products,
    ):
        settings = json.loads(first.config.read_text())
        settings["listen"]["port"] = free_port()
        other = tmp_path / "second.yaml"
        other.write_text(json.dumps(settings))
        log = tmp_path / "second.log"
        second = Service(other, log).wait_listening()
        try:
            for n in range(200):
                (first, second)[n % 2].start_run("two-mutations", {"id": f"pair-{n}"}, f"pair-{n}")
            second.kill()
            second = Service(other, log).wait_listening()
            wait_settled(dsn)
        finally:
            second.stop()
        row = summary("two processes (1 SIGKILL)", dsn, 200, 1, products)
    assert set(row["holds"]) <= {"dispatch-interrupted"}, row["holds"]
    with sync_connection(dsn) as conn:
        twice = conn.execute(
            "SELECT run_id, step FROM run_events WHERE kind = 'step-completed' "
            "GROUP BY run_id, step HAVING count(*) > 1"
        ).fetchall()
        actors = conn.execute(
            "SELECT count(DISTINCT actor) AS n FROM run_events WHERE kind = 'step-completed'"
        ).fetchone()
    assert twice == []
    assert actors is not None and actors["n"] >= 2, "both processes should have done steps"


def test_product_outage_and_hangs(dsn: str, tmp_path: Path) -> None:
    connections = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {"requestTimeout": "PT1S"}),
    }
    with deployment(tmp_path, dsn, ["two-mutations"], connections, workers=4) as (
        service,
        products,
    ):
        products.faults(
            "messaging",
            {"match": "POST /v1/messages", "mode": "hang-after-apply", "seconds": 5, "times": 10},
        )
        admitted = start_runs(service, 60, "hang")
        wait_settled(dsn)
        products.faults(
            "casework",
            {"match": "POST", "mode": "status", "status": 503, "retryAfter": 1, "times": 30},
        )
        admitted += start_runs(service, 40, "busy")
        wait_settled(dsn)
        row = summary("product hangs and 503s", dsn, admitted, 40, products)
    # A hang after the product applied a mutation is an unknown outcome, held; the 503s
    # were retried and finished.
    assert row["holds"] == Counter({"outcome-unknown": 10})
    assert row["states"]["finished"] == admitted - 10


def test_webhook_storm_resumes_each_run_once(dsn: str, tmp_path: Path) -> None:
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {"webhookSecret": "env:STANDIN_WEBHOOK_SECRET"})
    }
    with deployment(tmp_path, dsn, ["await-review"], connections, workers=4) as (service, products):
        keys = products.decided_reviews(150, "storm")
        early, late = keys[:50], keys[50:]
        deliveries = [(key, f"{key}-{copy}") for key in keys for copy in range(3)]
        random.Random(7).shuffle(deliveries)

        def deliver(key: str, event: str) -> None:
            body = {"result": "review-decision", "key": key, "eventId": event}
            response = service.http.post(**delivery_request(body))
            assert response.status_code == 202

        for key, event in deliveries:  # early ones: before their runs exist
            if key in early:
                deliver(key, event)
        runs = {key: service.start_run("await-review", {"requestId": key}) for key in keys}
        for key in late:
            wait_for(dsn, "SELECT state FROM runs WHERE id = %s", "waiting", params=(runs[key],))
        for key, event in deliveries:  # the rest: every one three times, out of order
            if key in late:
                deliver(key, event)
                deliver(key, event)  # and again, the same event
        wait_settled(dsn)
        summary("webhook storm", dsn, len(keys), len(deliveries) + len(late) * 3)
    with sync_connection(dsn) as conn:
        resumed = conn.execute(
            "SELECT run_id, count(*) AS n FROM run_events WHERE kind = 'step-completed' "
            "AND step = 'wait' GROUP BY run_id"
        ).fetchall()
    assert len(resumed) == len(keys)
    assert {r["n"] for r in resumed} == {1}


#: Faults of a hostile product, by stand-in, in the order each is met (each rule answers
#: ``times`` requests, then the next rule of that route takes over).
NAN_RECORD = (
    '{"data": {"recordIdentifier": "a", "revisionIdentifier": "r", '
    '"domainData": {"status": NaN}}, "meta": {}}'
)
DEEP = '{"id": "m", "status": "accepted", "d": ' + "[" * 20_000 + "]" * 20_000 + "}"
HOSTILE: dict[str, list[dict[str, Any]]] = {
    "breg": [
        {"match": "GET /v1/records", "mode": "status", "status": status, "times": 3}
        for status in (408, 423, 425)
    ]
    + [
        {"match": "GET /v1/records", "mode": "answer", "status": 200, "body": body, "times": 3}
        for body in (NAN_RECORD, DEEP)
    ],
    "casework": [
        {
            "match": "POST /v1/review-requests",
            "mode": "answer",
            "status": 201,
            "body": '{"requestId": "rev-\\u0000", "status": "open"}',
            "times": 2,
        },
        {"match": "POST /v1/review-requests", "mode": "status", "status": 408, "times": 2},
        {"match": "POST /v1/review-requests", "mode": "status", "status": 423, "times": 1},
        {"match": "POST /v1/review-requests", "mode": "status", "status": 425, "times": 1},
    ],
    "messaging": [
        {"match": "POST /v1/messages", "mode": "answer", "status": 202, "body": DEEP, "times": 2}
    ],
    "idp": [{"match": "POST /oauth2/token", "mode": "delay", "seconds": 2, "times": 1}],
}


def test_a_hostile_product(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 runs of the tutorial's workflow against products that answer 408, 423 and 425,
    JSON with NaN, a NUL or 20,000 levels of nesting, keep results pending under webhooks
    that say nothing final, and hand out tokens slowly; one run names the record "..".
    Every run ends finished, held with its true reason, or (the "..") failed before
    anything was sent; every read retried was retried because of a fault, every mutation
    sent once, every pending result read once per delivery."""
    idp = free_port()
    monkeypatch.setenv("STANDIN_CLIENT_SECRET", "s3cret-for-tests")
    identity = oauth2(idp, clientSecret="env:STANDIN_CLIENT_SECRET")
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "applications": ("breg", {}),
        "reviews": ("casework", {}),
        "notices": ("messaging", {"identity": identity}),
    }
    with deployment(
        tmp_path,
        dsn,
        ["review-application"],
        connections,
        webhooks=True,
        also={"idp": idp},
        workers=4,
    ) as (service, products):
        for product, rules in HOSTILE.items():
            products.faults(product, *rules)
        runs = [
            service.start_run("review-application", {"applicationId": f"app-{n}"})
            for n in range(29)
        ]
        dots = service.start_run("review-application", {"applicationId": ".."})
        wait_for(
            dsn,
            "SELECT count(*) FROM runs WHERE ended_at IS NULL AND state <> 'held' "
            "AND NOT (state = 'waiting' AND step = 'await_decision')",
            0,
            timeout=90,
        )
        with sync_connection(dsn) as conn:
            keys = [
                r["key"]
                for r in conn.execute(
                    "SELECT key FROM waits WHERE step = 'await_decision' ORDER BY key"
                ).fetchall()
            ]
        for key in keys:  # a webhook that says nothing final: one read, and the wait goes on
            pending(service, key)
        wait_for(dsn, "SELECT count(*) FROM run_events WHERE kind = 'result-delivered'", len(keys))
        for key in keys:
            decide(products, key)
        wait_settled(dsn)
        row = summary(
            "hostile product",
            dsn,
            len(runs) + 1,
            15 + 6 + 2 + 1 + 1,
            products,
            ended=frozenset({"finished", "held", "failed"}),
        )
        reads = products.requests("breg", "GET", "/v1/records/")
        results = Counter(
            r["path"] for r in products.requests("casework", "GET", "/v1/review-requests/")
        )
        sent_messages = products.requests("messaging", "POST", "/v1/messages")
    assert row["holds"] == Counter({"response-invalid": 4, "outcome-unknown": 4})
    assert row["states"] == Counter({"finished": 21, "held": 8, "failed": 1})
    assert run_state(dsn, dots)["failure_code"] == "request-invalid"
    assert len(reads) == 29 + 15  # each unusable answer was read again once, nothing more
    assert set(results.values()) == {2}  # each review: its pending webhook, its decision
    assert len(results) == len(keys) == 29 - 6
    assert len(sent_messages) == len(keys)
    with sync_connection(dsn) as conn:
        unknown = Counter(
            r["detail"][:3]
            for r in conn.execute(
                "SELECT detail FROM runs WHERE hold_code = 'outcome-unknown'"
            ).fetchall()
        )
    assert unknown == Counter({"408": 2, "423": 1, "425": 1})


def pending(service: Service, key: str) -> None:
    body = {"result": "review-decision", "key": key, "eventId": f"{key}-p"}
    response = service.http.post(**delivery_request(body))
    assert response.status_code == 202 and response.json()["woke"] == 1
