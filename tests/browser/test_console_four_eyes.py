"""Four eyes in a real Chromium: Ada asks to resend a request nobody knows the outcome of,
over a connection configured ``fourEyes``; nothing is sent, the run's page says it waits
for a second operator, and Held work offers Ada no way to approve her own request. Bo
signs in, approves it with his reason, and the run finishes; its history names both.
"""

from __future__ import annotations

from playwright.sync_api import Page, expect

from registry_coordinator.semantics.codes import RunState
from tests.browser.pages import screenshot
from tests.support import Services, events, held_notice, wait_state


def _sign_in(page: Page, url: str, person: str) -> None:
    page.goto(url + "/console/")
    page.get_by_role("button", name=f"Sign in as {person}").click()
    expect(page.locator(".who").get_by_text("Signed in as")).to_be_visible()


def test_a_resend_in_doubt_waits_for_a_second_operator_in_the_console(
    dsn: str, services: Services, page: Page
) -> None:
    service, products, run, _ = held_notice(dsn, services, fourEyes=True)

    _sign_in(page, service.url, "ada")
    page.goto(f"{service.url}/console/runs/{run}")
    page.get_by_role("link", name="Retry the same request…").click()
    page.get_by_label("Reason").fill("INC-12: Messaging lost its queue")
    page.get_by_role("button", name="Review…").click()
    page.get_by_role("button", name="Retry the same request now").click()
    expect(page.get_by_role("status")).to_contain_text("Waiting for a second operator")
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1  # nothing resent
    page.goto(service.url + "/console/")
    waiting = page.get_by_role("region", name="Waiting for a second operator (1)")
    expect(waiting).to_contain_text("INC-12: Messaging lost its queue")
    expect(waiting.get_by_role("button", name="Approve")).to_have_count(0)
    expect(waiting).to_contain_text("You asked for it: another operator decides.")
    page.get_by_role("button", name="Sign out").click()

    _sign_in(page, service.url, "bo")
    waiting = page.get_by_role("region", name="Waiting for a second operator (1)")
    waiting.get_by_label("Your reason").fill("checked Messaging: the queue is empty")
    screenshot(page, "approval")
    waiting.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status")).to_contain_text("Approved: the action was taken")
    wait_state(dsn, run, RunState.FINISHED)
    [resent] = [e for e in events(dsn, run) if e["kind"] == "retry-same"]
    assert resent["actor"] == "ada (registry-operators)"
    assert resent["detail"]["approvedBy"] == "bo (registry-operators)"
    assert resent["detail"]["approval"] == "checked Messaging: the queue is empty"
