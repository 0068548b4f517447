"""What the chaos scenarios check of every run and every mutation: the summary table's
row (nothing lost, nothing sent twice on a guess, gap-free histories) read from the
database and the stand-ins' ledgers, the histories a run may end with, and the mutations
a product received and never answered."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from registry_coordinator.store.database import sync_connection
from tests.support.processes import Service
from tests.support.standins import StandIns

#: Coordinator's mutations in these scenarios: the product, the route, and whether the
#: product's contract makes the identical request (same key, same body) its recovery —
#: Casework answers it with the original acceptance and acts once. Messaging answers for
#: a submission on its receipt route instead (``POST /v1/messages/receipt``, beneath the
#: submission's route and not a submission), so a submission is never sent again.
MUTATIONS = (("casework", "/v1/review-requests", True), ("messaging", "/v1/messages", False))
#: How often a connection asks a product about an unknown outcome before holding the run:
#: as often as by default, closer together, so that the askings end within a scenario.
ASKING = {"verification": {"attempts": 3, "spacing": "PT2S"}}
#: The summary table's header, printed before its rows (:func:`summary`).
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
        dispatched = sealings(dsn)
        for product, path, identical in MUTATIONS:
            if product in products.ports:
                requests = sent(products, product, path)
                duplicates += resent_on_a_guess(requests, identical)
                # The effects the product's ledger records (an identical resend answered
                # from its record of the key is none), by the run and step they were for.
                effects: Counter[tuple[str, str]] = Counter()
                for key, n in products.ledger(product)["applied"].items():
                    if key.startswith("coordinator:"):
                        _, run, step = key.split(":")
                        effects[(run, step)] += n
                duplicates += sum(n - 1 for n in effects.values() if n > 1)
                # Nothing leaves unsealed: each sending of a key was sealed (and its
                # call-dispatched recorded) before it was sent.
                for key, n in Counter(r["key"] for r in requests).items():
                    _, run, step = key.split(":")
                    assert n <= dispatched[(run, step)], (key, n, dispatched[(run, step)])
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


def resent_on_a_guess(requests: list[dict[str, Any]], identical_is_recovery: bool) -> int:
    """Mutations received again after an earlier sending that may have taken effect.

    A key may come again after answers that say the product did not act (429 or 503);
    and, where the product's contract makes it the recovery (``identical_is_recovery``),
    as the identical request: the same body as the sending that may have acted. Any
    other resend is a command sent twice on a guess.
    """
    resent = 0
    acted: dict[str, str] = {}  # key -> the body digest of its sending that may have acted
    for request in requests:  # in the order the product received them
        key = request["key"]
        if key in acted and not (identical_is_recovery and request["bodySha256"] == acted[key]):
            resent += 1
        if request.get("status") not in (429, 503):
            acted.setdefault(key, request["bodySha256"])
    return resent


def sent(products: StandIns, product: str, path: str) -> list[dict[str, Any]]:
    """Coordinator's sendings of the mutation at ``path`` (that route exactly, not the
    receipt route beneath it), in the order ``product`` received them."""
    return [
        r
        for r in products.requests(product, "POST", path)
        if r["path"] == path and str(r["key"]).startswith("coordinator:")
    ]


def sealings(dsn: str) -> Counter[tuple[str, str]]:
    """How often each run sealed a request at each step (its call-dispatched events)."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT run_id::text AS run, step, count(*) AS n FROM run_events "
            "WHERE kind = 'call-dispatched' GROUP BY 1, 2"
        ).fetchall()
    return Counter({(r["run"], r["step"]): r["n"] for r in rows})


def start_runs(service: Service, count: int, prefix: str) -> int:
    for n in range(count):
        service.start_run("two-mutations", {"id": f"{prefix}-{n}"}, key=f"{prefix}-{n}")
    return count


#: The Casework connection's pool (its default poolSize): how many of its calls can be in
#: flight at once, so exactly how many a kill inside a dispatch window interrupts there.
CASEWORK_POOL = 4
#: The Messaging connection's pool, likewise.
MESSAGING_POOL = 4


def unanswered_requests(products: StandIns) -> list[tuple[str, str, float]]:
    """The mutations a product received and never answered (after a kill: those it was
    still holding when the service died), as (product, idempotency key, when received)."""
    return [
        (product, request["key"], request["at"])
        for product, path, _ in MUTATIONS
        if product in products.ports
        for request in sent(products, product, path)
        if "status" not in request
    ]


def mutations_seen(products: StandIns) -> tuple[Counter[str], Counter[str]]:
    """How often the products received a mutation, and how often they acted on it (their
    ledgers' effects: an identical resend answered from the product's record of the key is
    no second one), by idempotency key."""
    received = Counter(
        r["key"]
        for product, path, _ in MUTATIONS
        if product in products.ports
        for r in sent(products, product, path)
    )
    applied: Counter[str] = Counter()
    for product, _, _ in MUTATIONS:
        if product in products.ports:
            applied.update(products.ledger(product)["applied"])
    return received, applied


def unanswered(products: StandIns) -> list[str]:
    """The idempotency keys of mutations a product received and never answered (after a
    kill: those it was still holding when the service died)."""
    return [key for _, key, _ in unanswered_requests(products)]


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


#: The same run's history where a sending's outcome was unknown (the dispatch found
#: interrupted, or the answer lost) and the product was asked what became of it before
#: the step completed on its confirmation: Casework by the identical request, Messaging
#: for the submission's receipt (again while none was found, as often as allowed).
ASKED = re.compile(
    r"admitted"
    r"( call-dispatched call-lost verify-scheduled)* call-dispatched call-answered step-completed"
    r" call-dispatched( call-answered| call-lost verify-scheduled"
    r"( receipt-looked-up verify-scheduled)* receipt-looked-up) step-completed"
    r" finished"
)


def called_or_asked(kinds: list[str]) -> bool:
    """Whether a finished run of two mutations has :data:`CALLED`'s history, or that
    history with its products asked about an unknown outcome (:data:`ASKED`). The answer
    to a sending found lost may still come back after its claim was given up: it is kept
    (``late-answer``, only after a ``call-lost``) beside that history."""
    lost = kinds.index("call-lost") if "call-lost" in kinds else len(kinds)
    late = [n for n, kind in enumerate(kinds) if kind == "late-answer"]
    if any(n < lost for n in late):
        return False
    rest = [kind for kind in kinds if kind != "late-answer"]
    return ASKED.fullmatch(" ".join(rest)) is not None


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


def wait_answered(products: StandIns, keys: set[str], timeout: float = 30) -> None:
    """Until the products have answered every mutation with one of these keys."""
    deadline = time.monotonic() + timeout
    while pending := keys & set(unanswered(products)):
        assert time.monotonic() < deadline, f"still unanswered: {pending}"
        time.sleep(0.05)
