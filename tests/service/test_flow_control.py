"""Flow control per product, measured by the product: a connection given a rate never
sends it more than the rate and the burst allow, however many runs are due at once; and
a product's ``429`` with ``Retry-After`` holds back the whole connection — a run started
after it waits out the pause too — not only the run that heard it.

Only lower bounds on time are asserted (a loaded machine only spreads requests further).
"""

from __future__ import annotations

import uuid

from registry_coordinator.semantics.codes import RunState
from tests.support import Services, events, until, wait_state

PAST = "2020-01-01T00:00:00Z"
PER_SECOND, BURST = 5, 2


def _lookups(service: object, count: int) -> list[str]:
    return [
        service.start_run(  # type: ignore[attr-defined]
            "subject-lookup",
            {"recordId": str(uuid.uuid4()), "applicantId": f"a-{uuid.uuid4()}", "until": PAST},
        )
        for _ in range(count)
    ]


def test_a_product_given_a_rate_never_sees_more(dsn: str, services: Services) -> None:
    rate = {"perSecond": PER_SECOND, "burst": BURST}
    service, products = services.deploy(
        ["subject-lookup"], {"records": ("breg", {"rate": rate, "poolSize": 16})}
    )
    runs = _lookups(service, 20)
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    arrived = sorted(r["at"] for r in products.requests("breg", "GET", "/v1/records/"))
    assert len(arrived) == 20
    # Any k requests in a row span at least (k - burst) intervals; over ten in a row, the
    # product's own scheduling on a loaded machine (a stalled handler) is allowed 0.3 s:
    # without the limit the twenty arrive within a fraction of that.
    interval = 1 / PER_SECOND
    for i in range(len(arrived) - 10):
        assert arrived[i + 10] - arrived[i] >= (10 - BURST) * interval - 0.3, arrived


def test_a_retry_after_holds_back_the_whole_connection(dsn: str, services: Services) -> None:
    service, products = services.deploy(["subject-lookup"], {"records": ("breg", {})})
    products.faults(
        "breg",
        {"match": "GET /v1/records/", "mode": "status", "status": 429, "retryAfter": 2, "times": 1},
    )
    [first] = _lookups(service, 1)
    until(
        lambda: "retry-scheduled" in [e["kind"] for e in events(dsn, first)],
        "the first run to hear the 429",
    )
    [second] = _lookups(service, 1)
    for run in (first, second):
        wait_state(dsn, run, RunState.FINISHED)
    refused, *after = sorted(
        products.requests("breg", "GET", "/v1/records/"), key=lambda r: r["at"]
    )
    assert refused["status"] == 429 and len(after) == 2
    assert all(r["at"] - refused["at"] >= 2 for r in after), (refused, after)
    scraped = service.http.get("/metrics").text
    assert 'coordinator_connection_slowdowns{connection="records"} 1.0' in scraped
