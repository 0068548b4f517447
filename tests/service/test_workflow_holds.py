"""New starts held for one workflow: ``POST /v1/admission/hold`` with a ``workflow``.

Its starts are refused ``503 admission.held`` naming it, alone or in a batch, while the
other workflows' are admitted; ``/ready`` names it (by whom, since when); released, its
starts are admitted again. A workflow that is not pinned is refused naming those that are.
"""

from __future__ import annotations

import uuid
from typing import Any

from tests.support import Forms, Service, Services, coordinator

LATER = "2099-01-01T00:00:00Z"


def _start(service: Service, workflow: str) -> Any:
    given = {"applicationId": f"a-{uuid.uuid4()}", "until": LATER}
    return service.http.post(
        "/v1/runs",
        json={"workflow": workflow, "input": given},
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )


def test_one_workflows_starts_are_held_and_the_others_admitted(services: Services) -> None:
    service = services(["found-by-application", "one-per-application"])
    held = service.http.post(
        "/v1/admission/hold",
        json={"reason": "a fault found in its review step", "workflow": "found-by-application"},
    )
    assert held.status_code == 200, held.text
    assert held.json()["workflow"] == "found-by-application" and held.json()["held"] is True

    refused = _start(service, "found-by-application")
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "admission.held"
    assert refused.json()["detail"] == (
        "new runs of found-by-application are not admitted: a fault found in its review step "
        "(local-developer)"
    )
    assert _start(service, "one-per-application").status_code == 201
    batch = {
        "starts": [
            {
                "key": str(uuid.uuid4()),
                "workflow": workflow,
                "input": {"applicationId": f"a-{uuid.uuid4()}", "until": LATER},
            }
            for workflow in ("found-by-application", "one-per-application")
        ]
    }
    results = service.http.post("/v1/runs:batch", json=batch).json()["results"]
    assert results[0]["problem"]["code"] == "admission.held", results
    assert results[1]["status"] == 201, results

    ready = service.http.get("/ready").json()["parts"]["admission"]
    assert ready["held"] is False
    assert [h["workflow"] for h in ready["heldWorkflows"]] == ["found-by-application"]
    assert set(ready["heldWorkflows"][0]) == {"workflow", "since"}  # who and why: operators'

    released = coordinator(
        "admission", "release", "--url", service.url, "--workflow", "found-by-application",
        "--reason", "the fault is fixed",
    )  # fmt: skip
    assert released.returncode == 0, released.stderr
    assert released.stdout.strip() == "starts of found-by-application released: the fault is fixed"
    assert _start(service, "found-by-application").status_code == 201
    assert service.http.get("/ready").json()["parts"]["admission"]["heldWorkflows"] == []

    unknown = service.http.post(
        "/v1/admission/hold", json={"reason": "x", "workflow": "no-such-workflow"}
    )
    assert unknown.status_code == 404 and unknown.json()["code"] == "workflow.not-pinned"
    assert "found-by-application, one-per-application" in unknown.json()["detail"]


def test_the_console_holds_and_releases_one_workflows_starts(services: Services) -> None:
    service = services(["found-by-application", "one-per-application"])
    page = service.http.get("/console/admission")
    form = Forms(page.text).by_button("Hold found-by-application's starts")
    form.fields["reason"] = "its review step is being fixed"
    done = service.http.post(
        form.action, data=form.fields, headers={"Origin": service.url}, follow_redirects=True
    )
    assert done.status_code == 200 and "new starts are held." in done.text
    assert "held</strong> by local-developer" in done.text
    assert "“its review step is being fixed”" in done.text
    assert "hold of <code>found-by-application</code>" in done.text
    assert _start(service, "found-by-application").status_code == 503
    release = Forms(done.text).by_button("Release found-by-application's starts")
    release.fields["reason"] = "fixed"
    service.http.post(release.action, data=release.fields, headers={"Origin": service.url})
    assert _start(service, "found-by-application").status_code == 201
    forged = service.http.post(release.action, data=release.fields)  # no console origin
    assert forged.status_code == 403
