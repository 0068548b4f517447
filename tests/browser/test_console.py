"""The operator console in a real Chromium: sign in at the stand-in issuer, resolve held work,
watch pages follow the service, and every page under the CSP at desktop and phone widths.

Every test fails on any console error, uncaught error or unexpected failed answer in its
pages (tests/browser/conftest.py). The screenshots in docs/console/ are written here.
"""

from __future__ import annotations

from typing import Any

import httpx
from playwright.sync_api import Page, expect

from registry_coordinator.http.console.render import CSP
from registry_coordinator.semantics.codes import RunState
from tests.browser.pages import PageErrors, screenshot
from tests.support import Service, Services, StandIns, decide, events, held_notice, wait_state

#: Messaging pushes nothing: the notice is read, the first time a second after it was sent.
REVIEW: dict[str, tuple[str, dict[str, Any]]] = {
    "applications": ("breg", {}),
    "reviews": ("casework", {}),
    "notices": ("messaging", {"resultPollFirst": "PT1S"}),
}
APPLICATION = "7d1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01"


def _sign_in(page: Page, service: Service, person: str) -> None:
    page.goto(service.url + "/console/")
    expect(page.get_by_role("heading", name="Sign in to Registry Coordinator")).to_be_visible()
    page.get_by_role("button", name=f"Sign in as {person}").click()
    # The console's own header, past the signed-in page whose refresh would abort a goto.
    expect(page.locator(".who").get_by_text("Signed in as")).to_be_visible()


def test_an_operator_signs_in_reconciles_a_held_run_and_watches_it_finish(
    dsn: str, services: Services, page: Page
) -> None:
    service, products, run, _ = held_notice(dsn, services)
    _sign_in(page, service, "ada")
    expect(page.locator(".who strong")).to_have_text("ada (registry-operators)")
    expect(page.locator("#held-count")).to_have_text("1")
    card = page.locator(f"#held-{run}")
    expect(card.get_by_role("heading")).to_have_text("Nobody knows whether the product acted")
    expect(card).to_contain_text("POST http://127.0.0.1:")
    expect(card).to_contain_text("messaging keeps receipts for submit-message")
    screenshot(page, "held-work")

    card.get_by_role("link", name="Reconcile…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Reconcile with the product")
    page.get_by_label("Reason").fill("ticket OPS-7: Messaging shows the message as sent")
    page.get_by_role("button", name="Review…").click()
    expect(page.get_by_text("ticket OPS-7: Messaging shows the message as sent")).to_be_visible()
    found = page.get_by_role("region", name="What the product says now")
    expect(found).to_contain_text("The product's receipt for the key (200) confirms the request")
    expect(found).to_contain_text('"status": "queued"')
    screenshot(page, "reconcile-confirm")
    page.get_by_role("button", name="Reconcile with the product now").click()

    expect(page.get_by_role("status")).to_contain_text("Reconcile confirmed the step")
    # The page follows the run to its end without a reload.
    expect(page.locator("#run-summary .state")).to_have_text("finished", timeout=20_000)
    person = page.locator("#timeline .by-person", has_text="reconciled")
    expect(person).to_contain_text("ada (registry-operators)")
    expect(person).to_contain_text("ticket OPS-7: Messaging shows the message as sent")
    expect(page.locator("#held-count")).to_have_text("0")
    expect(page.locator("figure.graph.drawn svg")).to_be_visible()
    screenshot(page, "run")

    reconciled = [e for e in events(dsn, run) if e["kind"] == "reconciled"]
    assert [e["actor"] for e in reconciled] == ["ada (registry-operators)"]
    # The notice was sent once (the receipt's lookups resent its key to another route).
    sent = products.requests("messaging", "POST", "/v1/messages")
    assert [r["path"] for r in sent if r["path"] == "/v1/messages"] == ["/v1/messages"]


def test_a_caller_without_operator_rights_sees_no_actions_and_is_refused_if_forced(
    dsn: str, services: Services, page: Page, page_errors: PageErrors
) -> None:
    service, _, run, token = held_notice(dsn, services)
    _sign_in(page, service, "sam")
    expect(page.locator(".who strong")).to_have_text("sam (case-portal)")
    card = page.locator(f"#held-{run}")
    expect(card).to_be_visible()
    # Only what the case portal's policy allows it through the API too: cancel its own run.
    expect(card.get_by_role("link")).to_have_text([run[:8], "Cancel the run…"])
    page.goto(f"{service.url}/console/runs/{run}")
    expect(page.get_by_role("link", name="Reconcile…")).to_have_count(0)
    expect(page.get_by_role("link", name="Retry the same request…")).to_have_count(0)

    page_errors.expect(status=403, path=f"/console/runs/{run}/retry-same")
    forced = page.evaluate(
        """async (url) => {
            const csrf = document.querySelector('input[name=csrf]').value;
            const body = new URLSearchParams({csrf: csrf, reason: 'forcing it'});
            const answer = await fetch(url, {method: 'POST', body: body});
            return [answer.status, await answer.text()];
        }""",
        f"/console/runs/{run}/retry-same",
    )
    assert forced[0] == 403
    assert "auth.operator-required" in forced[1]
    api = httpx.post(
        f"{service.url}/v1/runs/{run}/retry-same",
        json={"reason": "forcing it"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert api.status_code == 403
    assert api.json()["code"] == "auth.operator-required"
    assert [e["kind"] for e in events(dsn, run)][-1] == "held"


def _waiting_review(dsn: str, services: Services) -> tuple[Service, StandIns, str]:
    service, products = services.deploy(["review-application"], REVIEW, webhooks=True)
    run = service.start_run("review-application", {"applicationId": APPLICATION})
    wait_state(dsn, run, RunState.WAITING)
    return service, products, run


def test_the_runs_page_follows_a_run_to_its_end_without_a_reload(
    dsn: str, services: Services, page: Page
) -> None:
    service, products, run = _waiting_review(dsn, services)
    page.goto(service.url + "/console/runs")
    row = page.locator(f"#run-{run}")
    expect(row.locator(".state")).to_have_text("waiting")
    page.evaluate("() => { window.notReloaded = true; }")
    review = next(e for e in events(dsn, run) if e["kind"] == "waiting")["detail"]["key"]
    decide(products, review)
    expect(row.locator(".state")).to_have_text("finished", timeout=20_000)
    expect(row).to_contain_text("approved-and-notified")
    assert page.evaluate("() => window.notReloaded") is True
    screenshot(page, "runs")


PAGES = {
    "held-work-phone": "/console/",
    "workflows": "/console/workflows",
    "admission": "/console/admission",
    "erasure": "/console/erasures",
    "health": "/console/health",
}


def test_every_page_has_the_csp_fits_the_screen_and_works_by_keyboard(
    dsn: str, services: Services, page: Page, phone: Page
) -> None:
    service, _, run = _waiting_review(dsn, services)
    digest = service.status(run)["workflow"]["digest"]
    pages = {
        **PAGES,
        "workflow": f"/console/workflows/{digest}",
        "run-phone": f"/console/runs/{run}",
    }
    for name, path in pages.items():
        for shown, width in ((page, 1280), (phone, 390)):
            answer = shown.goto(service.url + path)
            assert answer is not None and answer.status == 200, path
            assert answer.headers["content-security-policy"] == CSP
            assert shown.evaluate("() => document.documentElement.scrollWidth") <= width, path
        if "graph" in (page.content()):
            expect(page.locator("figure.graph.drawn svg")).to_be_visible()
        target = phone if name.endswith("-phone") else page
        screenshot(target, name)

    page.goto(service.url + "/console/runs")
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to the page")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("main")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_label("Workflow")).to_be_focused()
