"""Reviewed external reads through a real service: a workflow reads an office directory
(the stand-in external service) over an ``external-http`` connection.

What an external read promises, each seen from the directory's own ledger: only a
reviewed path under the deployment's prefix, the query as data, no credential on a
public read, every completed status the workflow's to branch on, no redirect followed,
no answer released that breaks the review, and a slow answer read again, not failed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.engine.workflows import load_service
from tests.support import ROOT, Service, Services, StandIns, bound_to_one, wait_state

WORKFLOW = ROOT / "tests" / "workflows" / "external-read.yaml"


@pytest.fixture
def directory(services: Services) -> tuple[Service, StandIns]:
    return services.deploy(
        [WORKFLOW], {"directory": ("external-http", {"requestTimeout": "PT1S"})}, sweep="PT1S"
    )


def reads(products: StandIns) -> list[dict[str, object]]:
    return products.requests("external-http", "GET", "/directory")


def test_a_reviewed_read_finds_its_offices_and_a_404_is_branched_on(
    dsn: str, directory: tuple[Service, StandIns]
) -> None:
    service, products = directory
    found = service.start_run("external-read", {"district": "north"})
    unknown = service.start_run("external-read", {"district": "atlantis & co"})
    wait_state(dsn, found, "finished")
    wait_state(dsn, unknown, "finished")
    assert service.status(found)["output"] == {
        "offices": [{"id": "office-north-1"}, {"id": "office-north-2"}]
    }
    assert service.status(unknown)["outcome"] == "unknown-district"
    sent = [(r["path"], r["query"], r["authorization"]) for r in reads(products)]
    assert sorted(sent, key=str) == [
        ("/directory/v2/offices", {"district": "atlantis & co"}, "none"),
        ("/directory/v2/offices", {"district": "north"}, "none"),
    ]


def test_a_redirect_is_not_followed_and_fails_the_run(
    dsn: str, directory: tuple[Service, StandIns]
) -> None:
    service, products = directory
    products.faults("external-http", {"match": "GET /directory", "mode": "answer", "status": 302})
    run = service.start_run("external-read", {"district": "north"})
    wait_state(dsn, run, "failed")
    failure = service.status(run)["failure"]
    assert failure["code"] == "external-redirect"
    assert len(reads(products)) == 1


def test_an_answer_naming_a_member_twice_is_not_released(
    dsn: str, directory: tuple[Service, StandIns]
) -> None:
    service, products = directory
    twice = '{"items": [], "items": [{"id": "sensitive-canary"}]}'
    products.faults(
        "external-http", {"match": "GET /directory", "mode": "answer", "status": 200, "body": twice}
    )
    run = service.start_run("external-read", {"district": "north"})
    wait_state(dsn, run, "failed")
    failure = service.status(run)["failure"]
    assert failure["code"] == "external-invalid-response"
    assert "canary" not in str(service.history(run))


def test_a_slow_answer_is_read_again_once_the_attempt_runs_out(
    dsn: str, directory: tuple[Service, StandIns]
) -> None:
    """The attempt is bounded by the connection's requestTimeout (a second here): a
    directory that answers later than that is read again, and the run goes on once it
    answers in time (a loaded machine may take more than one more attempt)."""
    service, products = directory
    products.faults(
        "external-http", {"match": "GET /directory", "mode": "delay", "seconds": 3, "times": 1}
    )
    run = service.start_run("external-read", {"district": "south"})
    wait_state(dsn, run, "finished")
    assert service.status(run)["output"] == {"offices": [{"id": "office-south-1"}]}
    calls = [e["kind"] for e in service.history(run) if e["kind"].startswith("call-")]
    assert calls[:2] == ["call-dispatched", "call-lost"]  # the slow answer was not waited for
    assert calls.count("call-dispatched") == len(reads(products)) >= 2
    assert calls[-2:] == ["call-dispatched", "call-answered"]


def test_a_read_with_an_identity_presents_its_own_token(dsn: str, services: Services) -> None:
    settings = {"identity": {"bearer": "env:STANDIN_TOKEN"}}
    service, products = services.deploy([WORKFLOW], {"directory": ("external-http", settings)})
    run = service.start_run("external-read", {"district": "south"})
    wait_state(dsn, run, "finished")
    assert [r["authorization"] for r in reads(products)] == ["valid"]


def test_a_workflow_reading_an_unreviewed_path_is_refused_at_startup(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    review = {"paths": ["districts"], "queryParameters": ["language"]}
    config, _ = bound_to_one(tmp_path, dsn, str(WORKFLOW), "directory", "external-http", review)
    with pytest.raises(Refused) as refused:
        load_service(config)
    said = sorted((d.code, d.message) for d in refused.value.diagnostics)
    assert said == [
        (
            "config.external-unreviewed",
            "external-read step read reads path 'offices' of connection directory, which "
            "its review does not list",
        ),
        (
            "config.external-unreviewed",
            "external-read step read reads query parameter 'district' of connection "
            "directory, which its review does not list",
        ),
    ]
