"""A subject-access request answered from the console in a real Chromium: the operator gives
the subject's id on a form, reads the report — a live run with its request and the product's
answer, an archived run with the request its bundle holds — at desktop and phone widths, and
downloads the signed extract, which verifies offline. The subject never goes into a URL.
"""

from __future__ import annotations

import uuid

from playwright.sync_api import Page, expect

from registry_coordinator.semantics import reports
from registry_coordinator.semantics.checkpoints import public_key
from registry_coordinator.semantics.codes import RunState
from tests.browser.pages import screenshot
from tests.support import Services, signing, wait_for, wait_state

RECORDS: dict[str, tuple[str, dict[str, str]]] = {"records": ("breg", {})}


def _ask(page: Page, url: str, subject: str) -> None:
    page.goto(url + "/console/subject-reports")
    page.get_by_label("The subject's id").fill(subject)
    page.get_by_role("button", name="Show the report").click()
    expect(page.get_by_role("heading", name="Runs in the database (1)")).to_be_visible()


def test_an_operator_reads_a_subjects_report_and_downloads_it_signed(
    dsn: str, services: Services, page: Page, phone: Page
) -> None:
    keys, archive = services.directory / "keys", services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    service, _ = services.deploy(
        ["subject-lookup"], RECORDS, extra={**signing(keys), "retention": retention}
    )
    subject = f"applicant-{uuid.uuid4()}"
    ended, live = (
        service.start_run(
            "subject-lookup",
            {"recordId": str(uuid.uuid4()), "applicantId": subject, "until": until},
        )
        for until in ("2020-01-01T00:00:00Z", "2099-01-01T00:00:00Z")
    )
    wait_state(dsn, live, RunState.WAITING)
    wait_for(dsn, "SELECT count(*) FROM archived_runs WHERE id = %s", 1, params=(ended,))

    _ask(phone, service.url, subject)
    assert phone.evaluate("() => document.documentElement.scrollWidth") <= 390
    _ask(page, service.url, subject)
    expect(page.get_by_role("heading", name="Archived runs (1)")).to_be_visible()
    expect(page.get_by_role("region", name=live)).to_contain_text("answered (200)")
    archived = page.get_by_role("region", name=ended)
    expect(archived).to_contain_text("Read from its bundle")
    expect(archived).to_contain_text("answered (200)")
    screenshot(page, "subject-report")
    assert subject not in page.url and subject not in phone.url

    with page.expect_download() as downloading:
        page.get_by_role("button", name="Download the signed report").click()
    extract = downloading.value
    assert extract.suggested_filename == "subject-report.json"
    with open(extract.path(), "rb") as file:
        signed = file.read()
    report = reports.check(signed, public_key((keys / "audit-key.pub").read_bytes()))
    assert isinstance(report, dict) and report["subject"] == subject
    assert [r["run"] for r in report["runs"]] == [live]
    assert [r["run"] for r in report["archived"]] == [ended]
