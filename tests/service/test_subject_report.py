"""What the service holds and did for one data subject, asked as a subject-access request
would ask it: every run of the subject, in the database (what it held, every request it
sent and what the product answered) and archived (with its bundle, and the requests its
history says it sent, read from the bundle), and none of anyone else's, as an extract
signed with the audit key that verifies offline and refuses a changed byte. After the
subject's erasure the report still lists the runs and their effects, with what they held
null; an archived run whose bundle is changed or gone is listed with why, never guessed.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from registry_coordinator.semantics import reports
from registry_coordinator.semantics.checkpoints import public_key
from registry_coordinator.semantics.codes import RunState
from tests.support import Forms, Services, coordinator, signing, wait_for, wait_state

RECORDS: dict[str, tuple[str, dict[str, str]]] = {"records": ("breg", {})}
PAST, LATER = "2020-01-01T00:00:00Z", "2099-01-01T00:00:00Z"


def _report(service: Any, public: Path, subject: str) -> dict[str, Any]:
    answer = service.http.post("/v1/subject-reports", json={"subject": subject})
    assert answer.status_code == 200, answer.text
    report = reports.check(answer.content, public_key(public.read_bytes()))
    assert isinstance(report, dict)
    return report


def test_a_subjects_report_lists_its_runs_and_effects_signed(
    dsn: str, services: Services, tmp_path: Path
) -> None:
    keys, archive = services.directory / "keys", services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    service, _ = services.deploy(
        ["subject-lookup"], RECORDS, extra={**signing(keys), "retention": retention}
    )
    public = keys / "audit-key.pub"
    subject, other = f"applicant-{uuid.uuid4()}", f"applicant-{uuid.uuid4()}"
    ended_record, live_record = str(uuid.uuid4()), str(uuid.uuid4())
    ended = service.start_run(
        "subject-lookup", {"recordId": ended_record, "applicantId": subject, "until": PAST}
    )
    live = service.start_run(
        "subject-lookup", {"recordId": live_record, "applicantId": subject, "until": LATER}
    )
    theirs = service.start_run(
        "subject-lookup", {"recordId": str(uuid.uuid4()), "applicantId": other, "until": LATER}
    )
    wait_state(dsn, live, RunState.WAITING)
    wait_state(dsn, theirs, RunState.WAITING)
    wait_for(dsn, "SELECT count(*) FROM archived_runs WHERE id = %s", 1, params=(ended,))

    report = _report(service, public, subject)
    assert report["subject"] == subject and len(report["keys"]) == 1
    [run] = report["runs"]  # the live one; the ended one was archived
    assert run["run"] == live and run["state"] == "waiting" and not run["erased"]
    assert run["input"]["recordId"] == live_record
    [sent] = run["sendings"]
    assert sent["method"] == "GET" and live_record in sent["url"]
    assert sent["effect"] == "answered" and sent["status"] == 200
    assert f"applicant+{live_record[:8]}@example.org" in sent["answer"]
    assert run["outcomesUnknown"] == 0
    [gone] = report["archived"]
    assert gone["run"] == ended and gone["state"] == "finished" and gone["bundle"]
    [sent] = gone["sendings"]  # read from its bundle: the answer left with the hot tables
    assert sent["method"] == "GET" and ended_record in sent["url"] and gone["unread"] is None
    assert (sent["effect"], sent["status"], sent["answer"]) == ("answered", 200, None)
    assert theirs not in str(report)

    out = tmp_path / "report.json"
    written = coordinator(
        "subject", "report", "--config", service.config, "--subject", subject, "--out", out
    )
    assert written.returncode == 0, written.stderr
    checked = coordinator("audit", "verify", "--report", out, "--public-key", public)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 runs in the database, 1 archived" in checked.stdout
    changed = out.read_bytes().replace(live_record.encode(), str(uuid.uuid4()).encode())
    out.write_bytes(changed)
    refused = coordinator("audit", "verify", "--report", out, "--public-key", public)
    assert refused.returncode == 1 and "signature does not hold" in refused.stdout

    service.http.post(f"/v1/runs/{live}/cancel", json={"reason": "to erase"})
    wait_state(dsn, live, RunState.CANCELLED)
    erased = service.http.post("/v1/erasures", json={"subject": subject, "reason": "asked"})
    assert erased.status_code == 200, erased.text
    after = _report(service, public, subject)
    [run] = after["runs"]
    assert run["erased"] and run["input"] is None and run["state"] == "cancelled"
    assert [s["url"] for s in run["sendings"]] == [None] and run["sendings"][0]["status"] == 200
    [gone] = after["archived"]
    assert after["keys"][0]["erasedAt"] is not None and gone["erased"]
    assert [(s["url"], s["status"]) for s in gone["sendings"]] == [(None, 200)]

    bundle = archive / gone["bundle"]
    bundle.write_bytes(bundle.read_bytes().replace(b'"seq":1', b'"seq":9'))
    [changed] = _report(service, public, subject)["archived"]
    assert changed["sendings"] is None and "sha256 differs" in changed["unread"]
    bundle.unlink()
    [missing] = _report(service, public, subject)["archived"]
    assert missing["sendings"] is None and "cannot be read" in missing["unread"]

    unknown = service.http.post("/v1/subject-reports", json={"subject": "nobody"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "subject.unknown"


def test_an_operator_reads_and_downloads_a_subjects_report_in_the_console(
    dsn: str, services: Services
) -> None:
    """Asked on a form, shown on the page its POST gets, and downloaded as the signed
    extract the API gives; an unknown subject is refused on the form; the subject never
    goes into a URL."""
    keys = services.directory / "keys"
    service, _ = services.deploy(["subject-lookup"], RECORDS, extra=signing(keys))
    subject, record = f"applicant-{uuid.uuid4()}", str(uuid.uuid4())
    run = service.start_run(
        "subject-lookup", {"recordId": record, "applicantId": subject, "until": LATER}
    )
    wait_state(dsn, run, RunState.WAITING)
    origin = {"Origin": service.url}

    asked = service.http.get("/console/subject-reports")
    assert asked.status_code == 200 and 'href="/console/subject-reports"' in asked.text
    form = Forms(asked.text).by_button("Show the report")
    unknown = service.http.post(
        form.action, data={**form.fields, "subject": "nobody"}, headers=origin
    )
    assert unknown.status_code == 404 and "subject.unknown" in unknown.text
    shown = service.http.post(form.action, data={**form.fields, "subject": subject}, headers=origin)
    assert shown.status_code == 200, shown.text
    assert f'href="/console/runs/{run}"' in shown.text and f"/{record}?" in shown.text
    assert "answered (200)" in shown.text and "Archived runs (0)" in shown.text

    download = Forms(shown.text).by_button("Download the signed report")
    extract = service.http.post(download.action, data=dict(download.fields), headers=origin)
    assert extract.status_code == 200 and "attachment" in extract.headers["content-disposition"]
    report = reports.check(extract.content, public_key((keys / "audit-key.pub").read_bytes()))
    assert isinstance(report, dict) and [r["run"] for r in report["runs"]] == [run]
    assert all(subject not in str(r.url) for r in (asked, unknown, shown, extract))
    forged = service.http.post(download.action, data=dict(download.fields))  # no Origin
    assert forged.status_code == 403 and "console.forged-request" in forged.text
