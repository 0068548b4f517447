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
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from registry_coordinator.engine.database import sync_connection
from tests.harness import (
    STANDIN_TOKEN,
    Cluster,
    Service,
    Services,
    StandIns,
    decide,
    delivery_request,
    free_port,
    oauth2,
    put_to_sleep,
    run_state,
    stand_ins,
    wait_for,
    wait_state,
)

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


#: The kills (of 20) that land inside dispatch windows: both products hold every mutation
#: back, and the kill comes once Casework has a full pool of them in flight. The others
#: land at random moments.
IN_DISPATCH = frozenset({3, 7, 11, 15, 19})
#: The Casework connection's pool (its default poolSize): how many of its calls can be in
#: flight at once, so exactly how many a kill inside a dispatch window interrupts there.
CASEWORK_POOL = 4


def test_crash_loop_twenty_kills_two_mutations(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """200 runs of two mutations, ten admitted before each of 20 SIGKILLs. Five kills land
    while mutations are known to be in flight (the products' ledgers show them, held back
    by a delay): every run whose mutation a kill cut off unanswered is held
    ``dispatch-interrupted`` at that step after the restart, never finished, its request
    received once. Every other run finishes with each mutation applied once, or is held
    as interrupted too (a kill between its dispatch and the recording of the answer);
    no mutation reaches a product twice.

    Without the known kills, random ones almost never land inside a millisecond-long
    dispatch, so a service that resent mutations after a crash would pass unnoticed.
    """
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
    config = services.configure(["two-mutations"], lease="PT2S", workers=4, connections=connections)
    chance = random.Random(20261129)
    cut_off: dict[str, int] = {}  # idempotency key -> the kill its request was unanswered at
    with stand_ins(
        tmp_path / "standins.log", {"casework": casework, "messaging": messaging}
    ) as products:
        service = services.start(config)
        admitted = 0
        for kill in range(20):
            if kill in IN_DISPATCH:
                for product, path in MUTATIONS:
                    products.faults(
                        product, {"match": f"POST {path}", "mode": "delay", "seconds": 60}
                    )
            admitted += start_runs(service, 10, f"crash-{kill}")
            if kill in IN_DISPATCH:
                products.wait_in_flight("casework", CASEWORK_POOL)
            else:
                time.sleep(chance.uniform(0.05, 0.6))
            service.kill()
            for key in unanswered(products):
                cut_off.setdefault(key, kill)
            if kill in IN_DISPATCH:
                for product, _ in MUTATIONS:
                    products.faults(product)  # the rest are answered at once
            service = services.start(config)
        wait_settled(dsn)
        service.stop()
        row = summary("crash loop (SIGKILL)", dsn, admitted, 20, products)
        received, applied = mutations_seen(products)
    at_known_kills = Counter(
        kill for key, kill in cut_off.items() if kill in IN_DISPATCH and key.endswith(":ask")
    )
    # Each known kill cut off exactly a full Casework pool of mutations in flight.
    assert at_known_kills == Counter(dict.fromkeys(IN_DISPATCH, CASEWORK_POOL)), cut_off
    with sync_connection(dsn) as conn:
        runs = {
            str(r["id"]): r
            for r in conn.execute("SELECT id, state, step, hold_code FROM runs").fetchall()
        }
        for key in cut_off:  # those runs: held at that step, as interrupted, sent once
            _, run, step = key.split(":")
            assert (runs[run]["state"], runs[run]["step"], runs[run]["hold_code"]) == (
                "held",
                step,
                "dispatch-interrupted",
            ), (key, runs[run])
            kinds = [
                e["kind"]
                for e in conn.execute(
                    "SELECT kind FROM run_events WHERE run_id = %s ORDER BY seq", (run,)
                ).fetchall()
            ]
            # found dispatched by the next holder: lost (no answer recorded), then held
            assert kinds[-3:] == ["call-dispatched", "call-lost", "held"], (key, kinds)
            assert received[key] == 1 and applied[key] == 0, key
    for run, found in runs.items():  # the rest: each mutation applied once, or held
        if found["state"] == "finished":
            assert applied[f"coordinator:{run}:ask"] == applied[f"coordinator:{run}:tell"] == 1
    held = row["states"]["held"]
    print(
        f"{len(cut_off)} mutations cut off unanswered ({sum(at_known_kills.values())} at the "
        f"{len(IN_DISPATCH)} known kills); {held} runs held, {row['states']['finished']} finished"
    )
    assert set(row["holds"]) <= {"dispatch-interrupted"}, row["holds"]
    assert held >= len(cut_off)
    assert row["states"]["finished"] + held == admitted


def mutations_seen(products: StandIns) -> tuple[Counter[str], Counter[str]]:
    """How often the products received, and applied, a mutation, by idempotency key."""
    received = Counter(
        r["key"] for product, path in MUTATIONS for r in products.requests(product, "POST", path)
    )
    applied: Counter[str] = Counter()
    for product, _ in MUTATIONS:
        applied.update(products.ledger(product)["applied"])
    return received, applied


def unanswered(products: StandIns) -> list[str]:
    """The idempotency keys of mutations a product received and never answered (after a
    kill: those it was still holding when the service died)."""
    return [
        request["key"]
        for product, path in MUTATIONS
        if product in products.ports
        for request in products.requests(product, "POST", path)
        if request["key"] is not None and "status" not in request
    ]


#: Histories each kind of run in the database-restart scenario must end with, exactly.
SLEPT = ["admitted", "waiting", "step-completed", "step-completed", "finished"]
CALLED = [
    "admitted",
    "call-dispatched",
    "call-answered",
    "step-completed",
    "call-dispatched",
    "call-answered",
    "step-completed",
    "finished",
]
DECIDED = [
    "admitted",
    "waiting",
    "result-delivered",
    "result-read",
    "step-completed",
    "finished",
]


def test_database_restart_under_load(cluster: Cluster, dsn: str, services: Services) -> None:
    """PostgreSQL is stopped and started again while the service has runs in every state:
    mutations in flight at Casework (held back there), runs waiting for a review decision,
    runs asleep at a wait-until not yet due, and a thousand wait-untils come due at once,
    some finished, many not yet taken. Each state is counted at the moment of the stop and
    must be non-empty.

    While the database is down the products answer the calls in flight: an answer in hand
    is recorded once the database is back, so each of those runs finishes, its mutation
    received and applied once. The runs waiting for a decision resume when it is made,
    the sleepers and the due ones wake and finish, each history exactly as without the
    outage. The one kind of run that may rightly be held (``dispatch-interrupted``) is one
    whose dispatch the stop cut off, its commit unknown: a mutation sealed and never sent,
    so none of those reached a product. The lease (15 s) outlasts the outage, so no claim
    on a call in flight is lost meanwhile.
    """
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    workflows = ["two-mutations", "await-review", "timed-choice"]
    service, products = services.deploy(
        workflows, connections, webhooks=True, workers=4, lease="PT15S"
    )
    reviews = open_reviews(products, 10)
    for key in reviews:
        service.start_run("await-review", {"requestId": key}, key=key)
    wait_for(dsn, "SELECT count(*) FROM waits", len(reviews))
    put_to_sleep(dsn, 20, timedelta(seconds=6), prefix="asleep")  # still, at the stop
    products.faults(
        "casework", {"match": "POST /v1/review-requests", "mode": "delay", "seconds": 5}
    )
    admitted = len(reviews) + 20 + start_runs(service, CASEWORK_POOL, "calling")
    products.wait_in_flight("casework", CASEWORK_POOL)
    # Due before the stop: half of them the timer's to take on in batches, half the workers'
    # (as runs that fell asleep before schema 5), so that hundreds are still due at the stop.
    put_to_sleep(dsn, 1000, timedelta(seconds=0.3), prefix="burst", unbatched_every=2)
    admitted += 1000
    at_stop = every_state(dsn)
    in_flight = set(unanswered(products))
    with cluster.down():
        wait_ready(service, 503)  # it reports the outage
        wait_answered(products, in_flight)  # answers in hand while the database is down
    products.faults("casework")
    wait_ready(service, 200)
    for key in reviews:
        decide(products, key)
    admitted += start_runs(service, 50, "after")
    wait_settled(dsn)
    assert service.process.poll() is None  # it survived
    row = summary("database restart", dsn, admitted, 1, products)
    received, applied = mutations_seen(products)
    print({state: len(runs) for state, runs in at_stop.items()})
    assert len(at_stop["mid-call"]) == CASEWORK_POOL
    assert len(at_stop["awaiting a result"]) == len(reviews)
    assert len(at_stop["asleep"]) == 20
    assert len(at_stop["due"]) >= 200
    # Every request in flight at the stop is a mid-call run's; one may have been answered
    # (its 5 s delay over) between the count and the stop, on a loaded machine.
    assert in_flight and in_flight <= {f"coordinator:{run}:ask" for run in at_stop["mid-call"]}
    ended = final_states(dsn)
    for run in at_stop["mid-call"]:  # answered during the outage: recorded, and went on
        assert ended[run][:2] == ("finished", "done"), ended[run]
        assert ended[run][2] == CALLED, ended[run]
        for step in ("ask", "tell"):
            assert received[f"coordinator:{run}:{step}"] == 1, (run, step)
            assert applied[f"coordinator:{run}:{step}"] == 1, (run, step)
    for run in at_stop["awaiting a result"]:
        assert ended[run] == ("finished", "decided", DECIDED), ended[run]
    for run in at_stop["asleep"] | at_stop["due"]:
        assert ended[run] == ("finished", "no", SLEPT), ended[run]
    held = [run for run, (state, _, _) in ended.items() if state == "held"]
    for run in held:  # cut off in its dispatch: sealed, never sent
        step = run_state(dsn, run)["step"]
        assert received[f"coordinator:{run}:{step}"] == 0, (run, step)
    assert set(row["holds"]) <= {"dispatch-interrupted"}, row["holds"]
    assert row["states"]["finished"] == admitted - len(held)
    print(f"{len(held)} runs held, their dispatch cut off by the stop")


def every_state(dsn: str, timeout: float = 30) -> dict[str, set[str]]:
    """The unended runs by state, once every state the restart must hit has runs: calls in
    flight, waits for a result, wait-untils not yet due, and runs due that no worker holds
    yet (at least 200 of those, so that some are left when the stop lands) while others
    are being finished (the workers are busy)."""
    deadline = time.monotonic() + timeout
    with sync_connection(dsn) as conn:
        while True:
            rows = conn.execute(
                """
                SELECT id::text AS id,
                       ended_at IS NULL AND dispatched_at IS NOT NULL AS "mid-call",
                       EXISTS (SELECT 1 FROM waits w WHERE w.run_id = r.id)
                           AS "awaiting a result",
                       state = 'waiting' AND wakes_to IS NOT NULL
                           AND timer_at > clock_timestamp() AS asleep,
                       ended_at IS NULL AND due_at <= clock_timestamp()
                           AND lease_token IS NULL AS due,
                       ended_at IS NOT NULL AS ended
                FROM runs r
                """
            ).fetchall()
            states = {
                state: {r["id"] for r in rows if r[state]}
                for state in ("mid-call", "awaiting a result", "asleep", "due", "ended")
            }
            if all(states.values()) and len(states["due"]) >= 200:
                return states
            assert time.monotonic() < deadline, {k: len(v) for k, v in states.items()}
            time.sleep(0.01)


def final_states(dsn: str) -> dict[str, tuple[str, str | None, list[str]]]:
    """Every run's state, outcome and history kinds, by run id."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            """
            SELECT r.id::text AS id, r.state, r.outcome,
                   (SELECT array_agg(e.kind ORDER BY e.seq) FROM run_events e
                    WHERE e.run_id = r.id) AS kinds
            FROM runs r
            """
        ).fetchall()
    return {r["id"]: (r["state"], r["outcome"], r["kinds"]) for r in rows}


def open_reviews(products: StandIns, count: int) -> list[str]:
    """Make ``count`` review requests at Casework, left undecided; their ids."""
    auth = {"Authorization": f"Bearer {STANDIN_TOKEN}"}
    subject = {"kind": "restart", "subject": {"type": "a", "id": "1"}}
    with httpx.Client(base_url=products.url("casework"), headers=auth) as casework:
        return [
            casework.post("/v1/review-requests", json=subject).json()["requestId"]
            for _ in range(count)
        ]


def wait_ready(service: Service, status: int, timeout: float = 30) -> None:
    """Until the service's /ready answers ``status``."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = service.http.get("/ready", timeout=5).status_code
        except httpx.HTTPError as exc:
            last = exc
        if last == status:
            return
        time.sleep(0.05)
    raise AssertionError(f"/ready answered {last}, not {status}, within {timeout} s")


def wait_answered(products: StandIns, keys: set[str], timeout: float = 30) -> None:
    """Until the products have answered every mutation with one of these keys."""
    deadline = time.monotonic() + timeout
    while pending := keys & set(unanswered(products)):
        assert time.monotonic() < deadline, f"still unanswered: {pending}"
        time.sleep(0.05)


def test_two_processes_under_load_do_no_step_twice(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    """Two service processes on one database and the same products take 200 runs between
    them; one is killed mid-load and started again. No step completes twice in any run,
    and no mutation reaches a product twice."""
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {}),
    }
    first, products = services.deploy(["two-mutations"], connections, workers=3, lease="PT2S")
    settings = json.loads(first.config.read_text())
    settings["listen"]["port"] = free_port()
    other = tmp_path / "second.yaml"
    other.write_text(json.dumps(settings))
    log = tmp_path / "second.log"
    second = services.start(other, log)
    for n in range(200):
        (first, second)[n % 2].start_run("two-mutations", {"id": f"pair-{n}"}, f"pair-{n}")
    second.kill()
    second = services.start(other, log)
    wait_settled(dsn)
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


def test_product_outage_and_hangs(dsn: str, services: Services) -> None:
    connections = {
        "reviews": ("casework", {}),
        "notices": ("messaging", {"requestTimeout": "PT1S"}),
    }
    service, products = services.deploy(["two-mutations"], connections, workers=4)
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


def test_webhook_storm_resumes_each_run_once(dsn: str, services: Services) -> None:
    connections: dict[str, tuple[str, dict[str, Any]]] = {
        "reviews": ("casework", {"webhookSecret": "env:STANDIN_WEBHOOK_SECRET"})
    }
    service, products = services.deploy(["await-review"], connections, workers=4)
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
        wait_state(dsn, runs[key], "waiting")
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


def test_a_hostile_product(dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch) -> None:
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
    service, products = services.deploy(
        ["review-application"],
        connections,
        webhooks=True,
        also={"idp": idp},
        workers=4,
    )
    for product, rules in HOSTILE.items():
        products.faults(product, *rules)
    runs = [
        service.start_run("review-application", {"applicationId": f"app-{n}"}) for n in range(29)
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
