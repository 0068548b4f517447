"""The console's questions before a resend, in a real Chromium: where the request goes when
its connection has moved since it was sealed, and what the operator found at the product
when the database was restored from a backup. Each answer is recorded with the person."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Page, expect

from registry_coordinator.semantics.codes import HoldCode, RunState
from tests.support import (
    Service,
    Services,
    events,
    free_port,
    held_notice,
    moved,
    pg_dump,
    pg_restore,
    stand_ins,
    started_by_case_portal,
    wait_state,
)


def _retry_same_as_ada(page: Page, service: Service, run: str) -> None:
    """Ada signed in, on the run's page, at the retry-same form."""
    page.goto(service.url + "/console/")
    page.get_by_role("button", name="Sign in as ada").click()
    # The console's own header, past the signed-in page whose refresh would abort a goto.
    expect(page.locator(".who").get_by_text("Signed in as")).to_be_visible()
    page.goto(f"{service.url}/console/runs/{run}")
    page.get_by_role("link", name="Retry the same request…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Retry the same request")


def test_a_resend_after_the_connection_moved_goes_where_the_operator_chose(
    dsn: str, services: Services, page: Page, tmp_path: Path
) -> None:
    service, products, run, _ = held_notice(dsn, services)
    assert service.stop() == 0
    sealed_to = f"{products.url('messaging')}/v1/messages"
    port = free_port()  # the operator moved Messaging to another address
    elsewhere_config = moved(service.config, "notices", port)
    now_to = f"http://127.0.0.1:{port}/v1/messages"

    with stand_ins(tmp_path / "moved-standins.log", {"messaging": port}) as elsewhere:
        again = services.start(elsewhere_config, tmp_path / "moved.log")
        _retry_same_as_ada(page, again, run)
        where = page.get_by_role("group", name="Where does the resend go?")
        expect(where).to_contain_text(sealed_to)
        page.get_by_label("Reason").fill("ticket OPS-9: Messaging moved to its new host")
        # Nothing is chosen for the operator: the form is not valid until a choice is made.
        expect(where.get_by_role("radio", checked=True)).to_have_count(0)
        form = page.locator("form.action")
        assert form.evaluate("form => form.checkValidity()") is False

        where.get_by_role("radio", name=f"To the connection as it is now: {now_to}").check()
        assert form.evaluate("form => form.checkValidity()") is True
        page.get_by_role("button", name="Review…").click()
        chosen = f"The request goes to the connection as it is now: {now_to}."
        expect(page.get_by_text(chosen)).to_be_visible()
        page.get_by_role("button", name="Retry the same request now").click()
        expect(page.get_by_role("status")).to_contain_text("Retry-same was taken")
        expect(page.locator("#run-summary .state")).to_have_text("finished", timeout=20_000)
        resent = elsewhere.requests("messaging", "POST", "/v1/messages")
        assert [r["key"] for r in resent] == [f"coordinator:{run}:send"]  # the same key

    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1  # the first only
    retried = [e for e in events(dsn, run) if e["kind"] == "retry-same"]
    assert [e["actor"] for e in retried] == ["ada (registry-operators)"]
    assert retried[0]["detail"]["binding"] == {
        "chose": "current",
        "sealed": sealed_to,
        "current": now_to,
    }
    assert retried[0]["detail"]["reason"] == "ticket OPS-9: Messaging moved to its new host"


def test_a_resend_after_a_restore_takes_the_operators_attestation(
    dsn: str, services: Services, page: Page, tmp_path: Path
) -> None:
    service, products = services.deploy(
        ["two-mutations"], {"reviews": ("casework", {}), "notices": ("messaging", {})}, sign_in=True
    )
    products.faults(
        "casework", {"match": "POST /v1/review-requests", "mode": "hold", "seconds": 300}
    )
    run, _ = started_by_case_portal(
        services, service, "two-mutations", {"id": "applicant-1"}, "restored-1"
    )
    products.wait_in_flight("casework")
    backup = tmp_path / "backup.dump"
    pg_dump(dsn, backup)  # the run is at its first call
    products.faults("casework")
    wait_state(dsn, run, RunState.FINISHED)
    assert service.stop() == 0
    pg_restore(dsn, backup)
    again = services.start(service.config, tmp_path / "restored.log")
    wait_state(dsn, run, RunState.HELD)

    _retry_same_as_ada(page, again, run)
    expect(page.locator("main")).to_contain_text(f"held {HoldCode.RESTORED_REVIEW}")
    page.get_by_label("Reason").fill("reviewed after the restore of 7 December")
    attestation = page.get_by_label("What you found at the product for this run since the backup")
    attestation.fill("Casework holds review REV-1 for applicant-1, made before the restore")
    page.get_by_role("button", name="Review…").click()
    expect(
        page.get_by_text(
            "Your attestation, recorded with it: “Casework holds review REV-1 for applicant-1,"
        )
    ).to_be_visible()
    page.get_by_role("button", name="Retry the same request now").click()
    expect(page.get_by_role("status")).to_contain_text("Retry-same was taken")

    released = [e for e in events(dsn, run) if e["kind"] == "retry-same"]
    assert [e["actor"] for e in released] == ["ada (registry-operators)"]
    assert released[0]["detail"]["held"] == HoldCode.RESTORED_REVIEW
    assert released[0]["detail"]["attestation"] == (
        "Casework holds review REV-1 for applicant-1, made before the restore"
    )
