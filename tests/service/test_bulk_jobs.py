"""Bulk jobs: one operator action on every run a filter finds, kept in the database.

A preview finds and keeps the runs and does nothing; started, the job takes each run
exactly as an operator's action on one run, recorded in the run's history with the
operator who started it, the job's reason and the job's id. Killed between the action's
write and its commit, or just after the commit, and started again, it acts on no run
twice and skips none. Paused, it takes no run until resumed; a run that changed since
the preview is left alone, one the action refuses is settled with the refusal's code;
it takes runs no faster than its rate. Bad requests are refused naming what to change.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from registry_coordinator.semantics.codes import RunState
from tests.support import HANG_ONCE, Service, Services, coordinator, until, wait_state

LATER, PAST = "2099-01-01T00:00:00Z", "2020-01-01T00:00:00Z"
WORKFLOW = "found-by-application"
BAD = "request.invalid-filter"


def _waiting_runs(service: Service, dsn: str, office: str, count: int) -> list[str]:
    """``count`` runs asleep until 2099, found by their ``office``."""
    batch = {
        "starts": [
            {
                "key": str(uuid.uuid4()),
                "workflow": WORKFLOW,
                "input": {"applicationId": f"{office}-{n}", "office": office, "until": LATER},
            }
            for n in range(count)
        ]
    }
    answered = service.http.post("/v1/runs:batch", json=batch)
    assert answered.status_code == 200, answered.text
    runs = [r["run"]["id"] for r in answered.json()["results"]]
    for run in runs:
        wait_state(dsn, run, RunState.WAITING)
    return runs


def _preview(service: Service, office: str, action: str = "cancel", **more: Any) -> dict[str, Any]:
    body = {"action": action, "filter": {"workflow": WORKFLOW, "fields": [f"office:{office}"]}}
    answer = service.http.post("/v1/bulk-jobs", json={**body, **more})
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def _change(service: Service, job: str, change: str, reason: str = "after the outage") -> Any:
    answer = service.http.post(f"/v1/bulk-jobs/{job}/{change}", json={"reason": reason})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _job(service: Service, job: str) -> dict[str, Any]:
    answer = service.http.get(f"/v1/bulk-jobs/{job}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _done(service: Service, job: str) -> dict[str, Any]:
    return until(lambda: j if (j := _job(service, job))["state"] == "done" else None, "job done")


def _cancellations(dsn: str, run: str) -> list[tuple[str, Any]]:
    """Each history event of ``run`` an operator's cancel wrote: its actor and detail."""
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT actor, detail FROM run_events WHERE run_id = %s AND kind = 'cancelled'",
            (uuid.UUID(run),),
        ).fetchall()


def test_a_preview_does_nothing_and_a_started_job_acts_on_each_run(
    dsn: str, services: Services
) -> None:
    service = services([WORKFLOW])
    office = f"o{uuid.uuid4().hex[:8]}"
    runs = _waiting_runs(service, dsn, office, 6)
    _waiting_runs(service, dsn, f"{office}x", 2)  # another office: not found

    job = _preview(service, office)
    assert job["state"] == "previewed" and job["runs"]["total"] == 6
    assert sorted(r["id"] for r in job["sample"]) == sorted(runs)
    assert job["filter"] == {"workflow": WORKFLOW, "fields": [f"office:{office}"]}
    assert all(service.status(run)["state"] == "waiting" for run in runs)

    started = _change(service, job["id"], "start", "the registry closed these applications")
    assert started["startedBy"] == "local-developer"
    done = _done(service, job["id"])
    assert done["runs"] == {
        "total": 6, "pending": 0, "acted": 6, "unconfirmed": 0, "changed": 0, "refused": 0
    }  # fmt: skip
    assert [e["kind"] for e in done["events"]] == ["previewed", "started", "done"]
    assert done["events"][1]["reason"] == "the registry closed these applications"
    for run in runs:
        assert service.status(run)["state"] == "cancelled"
        [(actor, detail)] = _cancellations(dsn, run)
        assert actor == "local-developer" and detail["bulkJob"] == job["id"]
    with psycopg.connect(dsn) as conn:
        [(kept,)] = conn.execute(
            "SELECT filter::text FROM bulk_jobs WHERE id = %s", (uuid.UUID(job["id"]),)
        ).fetchall()
    assert office not in kept  # the filter is sealed: a search value may be personal


@pytest.mark.parametrize("point", ["bulk-settled", "bulk-committed"])
def test_a_job_killed_mid_way_acts_on_no_run_twice_and_skips_none(
    dsn: str, services: Services, tmp_path: Path, point: str
) -> None:
    """Killed with the fourth run's action written but not committed, or just after its
    commit, then started again on the same database."""
    config = services.configure([WORKFLOW])
    first = services.start(config)
    office = f"k{uuid.uuid4().hex[:8]}"
    runs = _waiting_runs(first, dsn, office, 8)
    job = _preview(first, office, perSecond=20)
    first.stop()

    dying = services.start(config, tmp_path / "dying.log", crash_at=f"{point}:4")
    _change(dying, job["id"], "start")
    dying.process.wait(60)
    with psycopg.connect(dsn) as conn:
        [(acted,)] = conn.execute(
            "SELECT count(*) FROM bulk_job_runs WHERE job_id = %s AND outcome = 'acted'",
            (uuid.UUID(job["id"]),),
        ).fetchall()
    assert acted == (3 if point == "bulk-settled" else 4)  # the fourth rolled back, or not

    services.start(config, tmp_path / "again.log")
    again = until(
        lambda: j if (j := _job_at(config, job["id"]))["state"] == "done" else None, "done", 60
    )
    assert again["runs"]["acted"] == 8 and again["runs"]["pending"] == 0, again
    for run in runs:
        assert len(_cancellations(dsn, run)) == 1, run


def _job_at(config: Path, job: str) -> dict[str, Any]:
    """The job as the service on ``config`` shows it (through the CLI, as an operator)."""
    port = json.loads(config.read_text())["listen"]["port"]
    shown = coordinator(
        "bulk", "show", job, "--url", f"http://127.0.0.1:{port}", "--format", "json"
    )
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


def _started(services: Services, dsn: str, runs: int, per_second: int) -> tuple[Service, Any]:
    """A service, ``runs`` waiting runs of one office, and a job cancelling them, started."""
    service = services([WORKFLOW])
    office = f"s{uuid.uuid4().hex[:8]}"
    _waiting_runs(service, dsn, office, runs)
    job = _preview(service, office, perSecond=per_second)
    _change(service, job["id"], "start")
    return service, job


def test_a_paused_job_takes_no_run_until_resumed(dsn: str, services: Services) -> None:
    service, job = _started(services, dsn, 12, 4)
    until(lambda: _job(service, job["id"])["runs"]["acted"] >= 2, "two acted")
    paused = _change(service, job["id"], "pause", "the product's team asked us to wait")
    assert paused["state"] == "paused"
    at_pause = _job(service, job["id"])["runs"]["acted"]
    time.sleep(1.5)  # six runs' time at the job's rate
    # A run being taken when the pause came may still settle; none after it.
    assert _job(service, job["id"])["runs"]["acted"] <= at_pause + 1
    _change(service, job["id"], "resume", "the product is back")
    done = _done(service, job["id"])
    assert done["runs"]["acted"] == 12
    assert [e["kind"] for e in done["events"]] == [
        "previewed", "started", "paused", "resumed", "done"
    ]  # fmt: skip
    assert done["events"][2]["reason"] == "the product's team asked us to wait"


def test_a_run_changed_since_the_preview_is_left_alone(dsn: str, services: Services) -> None:
    service = services([WORKFLOW])
    office = f"c{uuid.uuid4().hex[:8]}"
    runs = _waiting_runs(service, dsn, office, 4)
    job = _preview(service, office)
    alone = service.http.post(f"/v1/runs/{runs[1]}/cancel", json={"reason": "by hand"})
    assert alone.status_code == 200, alone.text
    _change(service, job["id"], "start")
    done = _done(service, job["id"])
    assert done["runs"]["acted"] == 3 and done["runs"]["changed"] == 1, done
    assert done["notActedOn"] == [
        {
            "run": runs[1],
            "outcome": "changed",
            "code": "run.changed",
            "at": done["notActedOn"][0]["at"],
        }
    ]
    [(_, detail)] = _cancellations(dsn, runs[1])
    assert "bulkJob" not in detail  # the hand's cancel, not the job's

    refused = _preview(service, f"{office}", action="retry-same")  # none is held now
    _change(service, refused["id"], "start")
    shown = _done(service, refused["id"])
    assert shown["runs"]["refused"] == 4
    assert {r["code"] for r in shown["notActedOn"]} == {"run.not-held"}


def test_a_job_takes_its_runs_no_faster_than_its_rate(dsn: str, services: Services) -> None:
    """Ten runs at five a second span at least nine fifths of a second. Each run's
    settling is dated when its transaction began, after its turn came and a read or two,
    which load can delay for one run and not the next: so the span is held, less the most
    the first run's reads may have taken, not each gap."""
    service, job = _started(services, dsn, 10, 5)
    _done(service, job["id"])
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT settled_at FROM bulk_job_runs WHERE job_id = %s ORDER BY position",
            (uuid.UUID(job["id"]),),
        ).fetchall()
    span = (rows[-1][0] - rows[0][0]).total_seconds()
    assert len(rows) == 10 and span >= 9 / 5 - 0.4, span  # without the rate: a tenth of it


def test_bad_bulk_requests_are_refused_naming_what_to_change(dsn: str, services: Services) -> None:
    service = services([WORKFLOW])
    office = f"b{uuid.uuid4().hex[:8]}"
    _waiting_runs(service, dsn, office, 1)
    none = f"office:{office}-none"
    for body, status, code, words in (
        ({"action": "delete", "filter": {}}, 400, "bulk.invalid", "action must be one of"),
        ({"action": "cancel", "filter": {"colour": "red"}}, 400, BAD, "filter is an object of"),
        ({"action": "cancel", "filter": {"state": "asleep"}}, 400, BAD, "state must be one of"),
        ({"action": "cancel", "perSecond": 0}, 400, "bulk.invalid", "perSecond must be"),
        ({"action": "cancel", "filter": {"fields": ["parcel:1"]}}, 400, BAD, "parcel"),
        ({"action": "cancel", "filter": {"fields": [none]}}, 422, "bulk.no-runs", "no run"),
    ):  # fmt: skip
        answer = service.http.post("/v1/bulk-jobs", json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["code"] == code and words in answer.json()["detail"], answer.text
    job = _preview(service, office)
    assert service.http.get(f"/v1/bulk-jobs/{uuid.uuid4()}").json()["code"] == "bulk.not-found"
    paused = service.http.post(f"/v1/bulk-jobs/{job['id']}/pause", json={"reason": "x"})
    assert paused.status_code == 409 and paused.json()["code"] == "bulk.state", paused.text
    assert "the job is previewed: it cannot pause" in paused.json()["detail"]
    no_reason = service.http.post(f"/v1/bulk-jobs/{job['id']}/start", json={})
    assert no_reason.json()["code"] == "request.reason-missing"
    _change(service, job["id"], "cancel", "previewed by mistake")
    again = service.http.post(f"/v1/bulk-jobs/{job['id']}/start", json={"reason": "x"})
    assert again.status_code == 409 and "the job is cancelled" in again.json()["detail"]
    assert _job(service, job["id"])["runs"]["acted"] == 0  # a job cancelled unstarted did nothing


def test_a_redrive_resends_each_held_runs_request_once(dsn: str, services: Services) -> None:
    """Three runs held outcome-unknown (Messaging applied each; the answers never came):
    a retry-same job chosen by their connection and hold code resends each sealed request
    once, under its key, and every run finishes with the message Messaging made the first
    time."""
    notices = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    service, products = services.deploy(["notify"], {"notices": ("messaging", notices)})
    products.faults("messaging", {**HANG_ONCE, "times": 3})
    runs = [service.start_run("notify", {"email": f"held-{n}@example.org"}) for n in range(3)]
    for run in runs:
        wait_state(dsn, run, RunState.HELD)
    listed = service.http.get("/v1/runs", params={"connection": "notices", "state": "held"})
    assert sorted(r["id"] for r in listed.json()["runs"]) == sorted(runs)
    unknown = service.http.get("/v1/runs", params={"connection": "faxes"})
    assert unknown.status_code == 400 and "the configured ones are notices" in unknown.text
    body = {
        "action": "retry-same",
        "filter": {"connection": "notices", "state": "held", "holdCode": "outcome-unknown"},
    }
    job = service.http.post("/v1/bulk-jobs", json=body).json()
    assert sorted(r["id"] for r in job["sample"]) == sorted(runs)
    _change(service, job["id"], "start", "Messaging's outage is over")
    assert _done(service, job["id"])["runs"]["acted"] == 3
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    sent = products.requests("messaging", "POST", "/v1/messages")
    keys = sorted(r["key"] for r in sent)
    assert len(sent) == 6 and len(set(keys)) == 3, keys  # each request twice, one key each
    assert len({r["bodySha256"] for r in sent}) == 3  # byte for byte as sealed


def test_a_run_whose_data_does_not_open_is_refused_and_the_job_goes_on(
    dsn: str, services: Services
) -> None:
    """Between the preview and the start, a run is given another run's sealed output: the
    job settles it refused, naming why, takes the others, and the service serves on (a
    run that cannot be read used to end the runner, and with it the service)."""
    service = services([WORKFLOW])
    office = f"u{uuid.uuid4().hex[:8]}"
    given = [{"applicationId": f"{office}-{n}", "office": office} for n in range(3)]
    batch = {
        "starts": [
            {"key": str(uuid.uuid4()), "workflow": WORKFLOW, "input": {**g, "until": PAST}}
            for g in given
        ]
    }
    runs = [
        r["run"]["id"] for r in service.http.post("/v1/runs:batch", json=batch).json()["results"]
    ]
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    job = _preview(service, office)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE runs SET output = (SELECT output FROM runs WHERE id = %s) WHERE id = %s",
            (uuid.UUID(runs[0]), uuid.UUID(runs[1])),
        )
    _change(service, job["id"], "start")
    done = _done(service, job["id"])
    codes = {r["run"]: r["code"] for r in done["notActedOn"]}
    assert codes == {runs[0]: "run.ended", runs[1]: "run.data-unopenable", runs[2]: "run.ended"}
    assert service.http.get("/health").status_code == 200
