"""At most one live run per concurrency key (``concurrency: {key: input.applicationId}``),
held by a unique index in the statement that admits: a start for a key whose run is live
is refused ``409 run.concurrent`` naming the run, alone or in a batch (also against a
start of the same batch), and admitted once that run has ended; starts of one key racing
each other admit exactly one; a key the input does not give is refused ``422``.
"""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

import httpx

from registry_coordinator.semantics.codes import RunState
from tests.support import Services, wait_state

LATER, PAST = "2099-01-01T00:00:00Z", "2020-01-01T00:00:00Z"


def _start(url: str, application: str, until: str = LATER) -> httpx.Response:
    body = {
        "workflow": "one-per-application",
        "input": {"applicationId": application, "until": until},
    }
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    return httpx.post(f"{url}/v1/runs", json=body, headers=headers, timeout=30)


def test_a_start_for_a_live_runs_key_is_refused_naming_it(dsn: str, services: Services) -> None:
    service = services(["one-per-application"])
    application = f"app-{uuid.uuid4()}"
    first = _start(service.url, application)
    assert first.status_code == 201, first.text
    live = first.json()["id"]
    wait_state(dsn, live, RunState.WAITING)
    again = _start(service.url, application)
    assert again.status_code == 409, again.text
    assert again.json()["code"] == "run.concurrent" and again.json()["run"] == live
    assert application not in again.text
    assert _start(service.url, f"app-{uuid.uuid4()}").status_code == 201  # another key

    batch: dict[str, Any] = {
        "starts": [
            {
                "key": str(uuid.uuid4()),
                "workflow": "one-per-application",
                "input": {"applicationId": app, "until": LATER},
            }
            for app in (application, "app-new", "app-new")
        ]
    }
    answered = service.http.post("/v1/runs:batch", json=batch)
    assert answered.status_code == 200, answered.text
    results = answered.json()["results"]
    said = [r["problem"]["code"] if "problem" in r else r["status"] for r in results]
    assert said[0] == "run.concurrent" and results[0]["problem"]["run"] == live, results
    assert sorted(map(str, said[1:])) == ["201", "run.concurrent"], results  # one of the two

    service.http.post(f"/v1/runs/{live}/cancel", json={"reason": "to start again"})
    wait_state(dsn, live, RunState.CANCELLED)
    assert _start(service.url, application).status_code == 201
    missing = service.http.post(
        "/v1/runs",
        json={"workflow": "one-per-application", "input": {"applicationId": "", "until": PAST}},
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    assert missing.status_code == 422 and missing.json()["code"] == "input.no-concurrency-key"


def test_starts_of_one_key_racing_each_other_admit_exactly_one(
    dsn: str, services: Services
) -> None:
    service = services(["one-per-application"])
    application = f"app-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: _start(service.url, application), range(8)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [201] + [409] * 7, [a.text for a in answers]
    [admitted] = [a.json()["id"] for a in answers if a.status_code == 201]
    assert all(a.json()["run"] == admitted for a in answers if a.status_code == 409)
