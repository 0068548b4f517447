"""Runs found by their business fields (``search: {applicationId: input.applicationId}``):
matched exactly, never as a part of a longer value, every field asked for at once, a page
at a time over the API, the CLI and the console; kept as keyed digests, never in clear;
and an erased subject's runs found by no field. A name no workflow declares, a malformed
filter, and a field asked of archived runs are refused 400 naming what to do. The runs
page beside them counts the live states as tabs that keep its other filters.
"""

from __future__ import annotations

import json
import re
import uuid

import psycopg

from registry_coordinator.semantics.codes import RunState
from tests.support import Services, coordinator, wait_state

PAST = "2020-01-01T00:00:00Z"
WORKFLOW = "found-by-application"


def _start_all(service_http: object, starts: list[dict[str, str]]) -> list[str]:
    """Start a run of each input in one batch; their ids, in order."""
    batch = {
        "starts": [
            {"key": str(uuid.uuid4()), "workflow": WORKFLOW, "input": {**given, "until": PAST}}
            for given in starts
        ]
    }
    answered = service_http.post("/v1/runs:batch", json=batch)  # type: ignore[attr-defined]
    assert answered.status_code == 200, answered.text
    results = answered.json()["results"]
    assert [r["status"] for r in results] == [201] * len(starts), results
    return [r["run"]["id"] for r in results]


def test_runs_are_found_by_a_fields_exact_value(dsn: str, services: Services) -> None:
    service = services([WORKFLOW])
    prefix = f"s{uuid.uuid4().hex[:8]}"
    north, south = f"{prefix}-north", f"{prefix}-south"
    one = {"applicationId": f"{prefix}-3-17", "office": north, "until": PAST}
    started = service.http.post(  # one start alone (admit_run), the rest in batches
        "/v1/runs", json={"workflow": WORKFLOW, "input": one}, headers={"Idempotency-Key": prefix}
    )
    assert started.status_code == 201, started.text
    exact = started.json()["id"]
    near = [f"{prefix}-3-17{n}" for n in range(10)]
    longer = _start_all(service.http, [{"applicationId": a, "office": north} for a in near])
    rest = _start_all(
        service.http, [{"applicationId": f"{prefix}-{n}", "office": south} for n in range(25)]
    )
    for run in [exact, *longer, *rest]:
        wait_state(dsn, run, RunState.FINISHED)

    def found(*fields: str, **also: str) -> list[str]:
        answer = service.http.get("/v1/runs", params={"field": list(fields), **also})
        assert answer.status_code == 200, answer.text
        return [r["id"] for r in answer.json()["runs"]]

    assert found(f"applicationId:{prefix}-3-17") == [exact]  # not -3-170 … -3-179
    assert found(f"applicationId:{prefix}-3-17", f"office:{north}") == [exact]
    assert found(f"applicationId:{prefix}-3-17", f"office:{south}") == []
    assert found(f"applicationId:{prefix}-3-17", f"applicationId:{prefix}-3-170") == []
    assert sorted(found(f"office:{north}", workflow=WORKFLOW)) == sorted([exact, *longer])

    pages, cursor = [], None
    while True:
        asked = {
            "field": f"office:{south}",
            "limit": "10",
            **({"cursor": cursor} if cursor else {}),
        }
        answer = service.http.get("/v1/runs", params=asked).json()
        pages.append([r["id"] for r in answer["runs"]])
        cursor = answer["next"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert sorted(run for p in pages for run in p) == sorted(rest)

    with psycopg.connect(dsn) as conn:
        kept = conn.execute(
            "SELECT term FROM run_search WHERE run_id = %s ORDER BY term", (uuid.UUID(exact),)
        ).fetchall()
        clear = conn.execute(
            "SELECT count(*) FROM run_search WHERE term LIKE %s", (f"%{prefix}%",)
        ).fetchone()
    assert len(kept) == 2 and clear == (0,)  # both fields, neither in clear

    listed = coordinator(
        "runs", "list", "--url", service.url, "--format", "json",
        "--field", f"applicationId:{prefix}-3-17",
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["runs"]] == [exact]

    page = service.http.get("/console/runs", params={"field": f"applicationId:{prefix}-3-17"})
    assert page.status_code == 200 and f'id="run-{exact}"' in page.text
    assert not any(f'id="run-{run}"' in page.text for run in longer)
    assert "Field is exactly" in page.text and "<code>office</code>" in page.text
    shown = service.http.get(f"/console/runs/{exact}").text  # a finished run's durations
    assert re.search(r"<dt>Ended</dt><dd>[^<]+, [0-9.]+ (ms|s) after it started</dd>", shown)
    assert re.search(r"<code>sleep</code> — done [^<]+, in [0-9.]+ (ms|s)</li>", shown), shown


def test_a_field_no_workflow_declares_is_refused_naming_those_that_are(
    services: Services,
) -> None:
    service = services([WORKFLOW, "one-per-application"])
    for asked, words in (
        ({"field": "parcel:7"}, "no workflow declares the search field parcel"),
        (
            {"field": "office:north", "workflow": "one-per-application"},
            "workflow one-per-application declares no search field office",
        ),
        ({"field": "applicationId"}, "field must be NAME:VALUE"),
        ({"field": "applicationId:"}, "field must be NAME:VALUE"),
        (
            {"field": "office:north", "archived": "true"},
            "archived runs are not found by search fields",
        ),
    ):
        answer = service.http.get("/v1/runs", params=asked)
        assert answer.status_code == 400, (asked, answer.text)
        problem = answer.json()
        assert problem["code"] == "request.invalid-filter", problem
        assert words in problem["detail"], problem
    said = service.http.get("/v1/runs", params={"field": "parcel:7"}).json()["detail"]
    assert "(declared: applicationId, office)" in said
    console = service.http.get("/console/runs", params={"field": "parcel:7"})
    assert console.status_code == 400 and "no workflow declares the search field parcel" in (
        console.text
    )


def test_an_erased_subjects_runs_are_found_by_no_field(dsn: str, services: Services) -> None:
    service = services([WORKFLOW])
    application = f"e{uuid.uuid4().hex[:8]}"
    [run] = _start_all(service.http, [{"applicationId": application, "office": "east"}])
    wait_state(dsn, run, RunState.FINISHED)
    asked = {"field": f"applicationId:{application}"}
    assert [r["id"] for r in service.http.get("/v1/runs", params=asked).json()["runs"]] == [run]
    erased = service.http.post("/v1/erasures", json={"subject": application, "reason": "asked"})
    assert erased.status_code in (200, 201), erased.text
    assert service.http.get("/v1/runs", params=asked).json()["runs"] == []
    with psycopg.connect(dsn) as conn:
        left = conn.execute(
            "SELECT count(*) FROM run_search WHERE run_id = %s", (uuid.UUID(run),)
        ).fetchone()
    assert left == (0,)


def test_the_runs_page_counts_the_live_states_as_tabs_keeping_the_filters(
    dsn: str, services: Services
) -> None:
    service = services([WORKFLOW])
    office = f"t{uuid.uuid4().hex[:8]}"
    later = "2099-01-01T00:00:00Z"
    batch = {
        "starts": [
            {
                "key": str(uuid.uuid4()),
                "workflow": WORKFLOW,
                "input": {"applicationId": f"{office}-{n}", "office": office, "until": later},
            }
            for n in range(3)
        ]
    }
    for result in service.http.post("/v1/runs:batch", json=batch).json()["results"]:
        wait_state(dsn, result["run"]["id"], RunState.WAITING)
    page = service.http.get("/console/runs", params={"workflow": WORKFLOW}).text
    with psycopg.connect(dsn) as conn:
        [(waiting,)] = conn.execute(
            "SELECT count(*) FROM runs WHERE state = 'waiting' AND ended_at IS NULL"
        ).fetchall()
    assert waiting >= 3
    tab = f'href="/console/runs?workflow={WORKFLOW}&amp;state=waiting">waiting '
    assert f'{tab}<span class="badge">{waiting}</span>' in page, page
    assert f'href="/console/runs?workflow={WORKFLOW}" aria-current="true">all' in page
