"""Triage after an outage in a real Chromium: 500 runs held at once, for three reasons.

Held work counts them by what holds them, largest group first, each with its oldest and
newest and a link to act on them all, then explains them a page at a time, a run's id a
click from the clipboard. The link opens a bulk job's form prefilled with the action the
hold's advice recommends. The operator previews the job (nothing is done), starts it with
a reason, pauses and resumes it, and watches it finish without a reload; the other two
groups are left held. At phone width the groups fit the screen.
"""

from __future__ import annotations

import uuid

from playwright.sync_api import Page, expect

from tests.browser.pages import screenshot
from tests.support import Services, wait_for

NOTICES = {"notices": ("messaging", {"verification": {"attempts": 0}})}
#: How many sends Messaging answers each way, in this order: held outcome-unknown (a
#: server error), product-forbidden (401), response-invalid (a 202 that is no receipt).
FAULTS = (
    {"match": "POST /v1/messages", "mode": "status", "status": 500, "times": 200},
    {"match": "POST /v1/messages", "mode": "status", "status": 401, "times": 150},
    {"match": "POST /v1/messages", "mode": "answer", "status": 202, "body": "[1]", "times": 150},
)


def test_five_hundred_held_runs_are_counted_and_a_group_redriven_as_one_job(
    dsn: str, services: Services, page: Page, phone: Page
) -> None:
    service, products = services.deploy(["notify"], NOTICES)
    products.faults("messaging", *FAULTS)
    for batch in range(5):
        starts = [
            {"key": str(uuid.uuid4()), "workflow": "notify", "input": {"email": f"p{n}@x.org"}}
            for n in range(100)
        ]
        answered = service.http.post("/v1/runs:batch", json={"starts": starts})
        assert answered.status_code == 200, (batch, answered.text)
    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'held'", 500, timeout=120)

    page.goto(service.url + "/console/")
    expect(page.get_by_role("heading", name="500 held, by what holds them")).to_be_visible()
    groups = page.locator("table.groups tbody tr")
    expect(groups).to_have_count(3)
    expect(groups.nth(0)).to_contain_text("outcome-unknown")
    expect(groups.nth(0).get_by_role("link", name="200")).to_be_visible()
    forbidden = groups.filter(has_text="product-forbidden")
    expect(forbidden.get_by_role("link", name="150")).to_be_visible()
    expect(forbidden.get_by_role("link", name="Retry all…")).to_be_visible()
    screenshot(page, "held-work-groups")
    cards = page.locator("ol.held > li")
    expect(cards).to_have_count(25)  # a page at a time, not a cap
    first = set(cards.evaluate_all("items => items.map(item => item.id)"))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    oldest = cards.nth(0)
    oldest.get_by_role("button", name="Copy the run's id").click()
    expect(oldest.get_by_role("button", name="Copy the run's id")).to_have_text("Copied")
    copied = page.evaluate("() => navigator.clipboard.readText()")
    assert f"held-{copied}" == oldest.get_attribute("id")
    page.get_by_role("link", name="The next 25 held runs →").click()
    expect(cards).to_have_count(25)
    second = set(cards.evaluate_all("items => items.map(item => item.id)"))
    assert len(first | second) == 50
    page.goto(service.url + "/console/")

    products.faults("messaging")  # Messaging's identity fixed: it accepts sends again
    forbidden.get_by_role("link", name="Retry all…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Bulk jobs")
    expect(page.get_by_label("Action")).to_have_value("retry-same")
    expect(page.get_by_label("Hold code")).to_have_value("product-forbidden")
    page.get_by_label("Runs per second").fill("50")
    page.get_by_role("button", name="Preview…").click()

    expect(page.get_by_role("heading", level=1)).to_have_text("Bulk job: retry-same")
    expect(page.get_by_role("heading", name="Previewed: nothing is done")).to_be_visible()
    expect(page.locator(".facts")).to_contain_text("Runs found150")
    page.get_by_label("Reason for the action").fill("INC-88: Messaging's identity is fixed")
    page.get_by_role("button", name="Start: take the action on each run").click()
    expect(page.get_by_role("heading", name="Running")).to_be_visible()
    page.get_by_label("Reason to pause the job").fill("checking the first sends")
    page.get_by_role("button", name="Pause the job").click()
    expect(page.get_by_role("heading", name="Paused")).to_be_visible()
    page.get_by_label("Reason to resume the job").fill("the first sends arrived")
    page.get_by_role("button", name="Resume the job").click()
    expect(page.get_by_role("heading", name="Done")).to_be_visible(timeout=60_000)
    expect(page.locator("#job-acted")).to_have_text("150")
    kinds = page.get_by_role("region", name="Changes").locator("tbody td:nth-child(2)")
    expect(kinds).to_have_text(["previewed", "started", "paused", "resumed", "done"])
    screenshot(page, "bulk-job")

    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'finished'", 150, timeout=60)
    wait_for(dsn, "SELECT count(*) FROM runs WHERE state = 'held'", 350)

    phone.goto(service.url + "/console/")
    expect(phone.get_by_role("heading", name="350 held, by what holds them")).to_be_visible()
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
