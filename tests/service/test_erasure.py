"""One data subject's personal data erased, tried as an operator and an auditor would: a
workflow that names its subject seals each subject's runs under that subject's own data
key; ``coordinator erase`` destroys the key, so that what those runs read and kept opens
for nobody — not the API, not the tests' own key-encryption key — while another
subject's runs read as before, the history keeps every event and its chain, and
``audit verify`` passes and says what was erased, when, by whom and why. An erasure is
refused while a run of the subject is live, until it is cancelled; asked again, it says
it was done; a subject never seen is refused; a new start for an erased subject gets a
new key, also one that raced the erasure. No subject id reaches the service's log.
"""

from __future__ import annotations

import functools
import json
import signal
import threading
import uuid
from typing import Any

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from registry_coordinator.custody import CustodyCode, Unopenable
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import QUERIES, sync_connection
from tests.support import (
    ADMISSION_WAITING,
    Forms,
    Service,
    Services,
    coordinator,
    decide,
    free_port,
    new_review,
    push,
    pushing,
    run_state,
    signing,
    until,
    wait_for,
    wait_state,
)
from tests.support.rows import sealer_of

RECORDS: dict[str, tuple[str, dict[str, str]]] = {"records": ("breg", {})}
PAST, LATER = "2020-01-01T00:00:00Z", "2099-01-01T00:00:00Z"


def _email(record: str) -> str:
    """The e-mail address stand-in BReg's record ``record`` holds."""
    return f"applicant+{record[:8]}@example.org"


def _start(service: Service, applicant: str, until: str = PAST) -> tuple[str, str]:
    record = str(uuid.uuid4())
    given = {"recordId": record, "applicantId": applicant, "until": until}
    return service.start_run("subject-lookup", given), record


def _erase(service: Service, subject: str, reason: str) -> tuple[int, dict[str, Any]]:
    answer = service.http.post("/v1/erasures", json={"subject": subject, "reason": reason})
    return answer.status_code, answer.json()


def _history(service: Service, run: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = service.http.get(f"/v1/runs/{run}/history").json()["events"]
    return events


def _data_key(dsn: str, run: str) -> int:
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT data_key FROM runs WHERE id = %s", (run,)).fetchone()
    assert row is not None
    key: int = row["data_key"]
    return key


def test_an_erased_subjects_data_opens_for_nobody_and_the_history_still_verifies(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    erased, kept = f"applicant-{uuid.uuid4()}", f"applicant-{uuid.uuid4()}"
    theirs = [_start(service, erased) for _ in range(2)]
    other, other_record = _start(service, kept)
    for run, _ in [*theirs, (other, other_record)]:
        wait_state(dsn, run, RunState.FINISHED)
    keys = {_data_key(dsn, run) for run, _ in theirs}
    assert len(keys) == 1 and _data_key(dsn, other) not in keys  # a key of the subject's own
    [key] = keys
    kinds = {}
    for run, record in theirs:
        assert service.status(run)["output"] == {"email": _email(record)}
        kinds[run] = [
            e["kind"] for e in service.http.get(f"/v1/runs/{run}/history").json()["events"]
        ]

    status, answer = _erase(service, erased, "subject-access request 42: erase on request")
    assert status == 200, answer
    assert answer["key"] == key and answer["runs"] == 2 and answer["before"] is False

    for run, _ in theirs:
        assert service.status(run)["output"] is None  # to the API: gone
        opened = run_state(dsn, run)  # to the tests' own key-encryption key: gone too
        assert opened["input"] is None and opened["output"] is None
        events = _history(service, run)
        assert [e["kind"] for e in events] == kinds[run]  # every event is kept
        dispatched = [e for e in events if e["kind"] == "call-dispatched"]
        assert dispatched and all(e["detail"]["url"] is None for e in dispatched)
    assert service.status(other)["output"] == {"email": _email(other_record)}
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT kek, wrapped, erased_by FROM data_keys WHERE id = %s", (key,)
        ).fetchone()
    assert row is not None and row["kek"] is None and row["wrapped"] is None
    assert row["erased_by"]  # who, in clear; the reason sealed

    verified = coordinator("audit", "verify", "--config", service.config)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    [said] = [line for line in verified.stdout.splitlines() if line.startswith("data key")]
    assert f"data key {key} was erased at " in said
    assert "subject-access request 42" in said and "2 runs" in said and "events" in said

    status, again = _erase(service, erased, "asked twice")
    assert status == 200 and again["before"] is True and again["key"] == key
    status, unknown = _erase(service, f"applicant-{uuid.uuid4()}", "a typo")
    assert status == 404 and unknown["code"] == "subject.unknown"

    anew, record = _start(service, erased)  # the person applies again: a new key
    wait_state(dsn, anew, RunState.FINISHED)
    assert _data_key(dsn, anew) != key
    assert service.status(anew)["output"] == {"email": _email(record)}

    log = service.log.read_text()
    assert erased not in log and kept not in log


def test_an_erasure_waits_for_the_subjects_live_runs_to_be_cancelled(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    subject = f"applicant-{uuid.uuid4()}"
    ended, _ = _start(service, subject)
    live, _ = _start(service, subject, until=LATER)
    wait_state(dsn, ended, RunState.FINISHED)
    wait_state(dsn, live, RunState.WAITING)

    status, refused = _erase(service, subject, "on request")
    assert status == 409 and refused["code"] == "subject.live"
    assert refused["runs"] == [live] and "cancel them first" in refused["detail"]
    assert service.status(ended)["output"] is not None  # nothing changed

    cancelled = service.http.post(f"/v1/runs/{live}/cancel", json={"reason": "to erase"})
    assert cancelled.status_code == 200, cancelled.text
    wait_state(dsn, live, RunState.CANCELLED)
    erased = coordinator(
        "erase", "--url", service.url, "--subject", subject, "--reason", "on request"
    )
    assert erased.returncode == 0, erased.stderr
    assert "erased the subject's data key" in erased.stdout and "2 runs" in erased.stdout
    assert service.status(ended)["output"] is None


def test_a_start_racing_its_subjects_erasure_is_sealed_under_a_new_key(
    dsn: str, services: Services
) -> None:
    """The erasure's own transaction, held open by the test with the key locked and
    erased: a start for the subject meanwhile waits on the key, then finds it erased and
    is sealed under a new one. Without the start's share of the key's lock, the run is
    sealed under the erased key, and nothing of it opens: it is held data-unopenable."""
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    subject = f"applicant-{uuid.uuid4()}"
    first, _ = _start(service, subject)
    wait_state(dsn, first, RunState.FINISHED)
    key = _data_key(dsn, first)
    sealer = sealer_of(dsn)
    assert sealer is not None
    started: list[tuple[str, str]] = []
    with sync_connection(dsn) as conn:
        conn.execute("BEGIN")
        locked = conn.execute(
            QUERIES["lock_subject_data_key"], {"subject": sealer.subject_hash(subject)}
        ).fetchone()
        assert locked is not None and locked["id"] == key
        args = {"key": key, "actor": "operator:test", "reason": Jsonb("raced")}
        assert conn.execute(QUERIES["erase_data_key"], args).fetchone() is not None
        racing = threading.Thread(target=lambda: started.append(_start(service, subject)))
        racing.start()
        wait_for(dsn, ADMISSION_WAITING, 1)  # the start waits on the key's lock
        conn.execute("COMMIT")
    racing.join(30)
    [(run, record)] = started
    wait_state(dsn, run, RunState.FINISHED)  # not held: its data opens
    assert _data_key(dsn, run) not in (key, None)
    assert service.status(run)["output"] == {"email": _email(record)}


def test_an_archived_runs_bundle_still_verifies_and_holds_nothing_that_opens(
    dsn: str, services: Services
) -> None:
    """A bundle holds its run's events as stored, sealed fields as ciphertext: after the
    subject's erasure it verifies offline as before, and nothing sealed in it opens."""
    keys, archive = services.directory / "keys", services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    service, _ = services.deploy(
        ["subject-lookup"], RECORDS, extra={**signing(keys), "retention": retention}
    )
    subject = f"applicant-{uuid.uuid4()}"
    run, record = _start(service, subject)
    wait_for(dsn, "SELECT count(*) FROM archived_runs WHERE id = %s", 1, params=(run,))
    status, answer = _erase(service, subject, "on request")
    assert status == 200 and answer["runs"] == 1, answer  # archived runs count too

    [bundle] = archive.rglob(f"{run}.bundle.json")
    held = bundle.read_bytes()
    assert record.encode() not in held and _email(record).encode() not in held
    public = keys / "audit-key.pub"
    checked = coordinator("audit", "verify", "--bundle", bundle, "--public-key", public)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    sealer = sealer_of(dsn)
    assert sealer is not None
    events = json.loads(held)["events"]
    [sent] = [e for e in events if e["type"] == "call-dispatched"]
    with pytest.raises(Unopenable) as refused:
        sealer.open_field(run, sent["step"], "url", sent["detail"]["url"])
    assert refused.value.code is CustodyCode.ERASED


def test_an_operator_erases_a_subject_from_the_console(dsn: str, services: Services) -> None:
    """Asked, confirmed, taken, as the API takes it; a refusal is shown on the form, and
    the subject never goes into a URL."""
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    subject = f"applicant-{uuid.uuid4()}"
    live, _ = _start(service, subject, until=LATER)
    wait_state(dsn, live, RunState.WAITING)
    origin = {"Origin": service.url}

    asked = service.http.get("/console/erasures")
    assert asked.status_code == 200 and 'href="/console/erasures"' in asked.text
    form = Forms(asked.text).by_button("Review…")
    fields = {**form.fields, "subject": subject, "reason": "erasure request 7"}
    review = service.http.post(form.action, data=fields, headers=origin)
    assert review.status_code == 200 and subject in review.text
    confirm = Forms(review.text).by_button("Erase the subject's data now")
    refused = service.http.post(confirm.action, data=dict(confirm.fields), headers=origin)
    assert refused.status_code == 409 and "cancel them first" in refused.text
    assert "subject.live" in refused.text

    service.http.post(f"/v1/runs/{live}/cancel", json={"reason": "to erase"})
    wait_state(dsn, live, RunState.CANCELLED)
    taken = service.http.post(confirm.action, data=dict(confirm.fields), headers=origin)
    assert taken.status_code == 200, taken.text
    assert "Erased: the subject's data key" in taken.text and "1 runs" in taken.text
    assert all(subject not in str(r.url) for r in (asked, review, refused, taken))
    assert service.status(live)["output"] is None and run_state(dsn, live)["input"] is None


def test_an_erasure_killed_before_it_commits_leaves_the_key_whole(
    dsn: str, services: Services
) -> None:
    """Killed between the erasing statement and its commit, the service erased nothing:
    the subject's data still opens, and the erasure asked again after a restart is done."""
    service, _ = services.deploy(["subject-lookup"], RECORDS)
    subject = f"applicant-{uuid.uuid4()}"
    run, record = _start(service, subject)
    wait_state(dsn, run, RunState.FINISHED)
    config = service.config
    assert service.stop() == 0
    dying = services.start(config, crash_at="mid-erasure:1")
    with pytest.raises(httpx.HTTPError):  # the service dies before it answers
        dying.http.post("/v1/erasures", json={"subject": subject, "reason": "on request"})
    assert dying.process.wait(60) == -9
    assert run_state(dsn, run)["output"] == {"email": _email(record)}  # nothing erased

    again = services.start(config)
    status, answer = _erase(again, subject, "on request")
    assert status == 200 and answer["before"] is False and answer["runs"] == 1
    assert again.status(run)["output"] is None


def test_a_sealed_runs_decisions_replay_from_its_auditors_bundle_until_erased(
    dsn: str, services: Services
) -> None:
    """An auditor's bundle opens a sealed run's record with the service's keys, and its
    decisions replay offline; once its subject is erased there is no record to export,
    while the bundle without one still verifies."""
    keys = services.directory / "keys"
    service, _ = services.deploy(["subject-lookup"], RECORDS, extra=signing(keys))
    subject = f"applicant-{uuid.uuid4()}"
    run, record = _start(service, subject)
    wait_state(dsn, run, RunState.FINISHED)
    public, bundle = keys / "audit-key.pub", services.directory / "run.replay.json"
    export = ("audit", "export", "--config", service.config, "--run", run, "--out", bundle)
    made = coordinator(*export, "--record")
    assert made.returncode == 0, made.stderr
    assert _email(record).encode() in bundle.read_bytes()  # the record, opened, in clear
    replayed = coordinator("audit", "replay", "--bundle", bundle, "--public-key", public)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert f"at sleep: woke after {PAST}" in replayed.stdout
    assert replayed.stdout.endswith(
        "3 decisions follow from its record, signed by the key given; ended finished\n"
    )
    unchecked = coordinator("audit", "replay", "--bundle", bundle)
    assert "signed by the key it names, not checked against one given" in unchecked.stdout

    plain = coordinator(*export)
    assert plain.returncode == 0 and _email(record).encode() not in bundle.read_bytes()
    refused = coordinator("audit", "replay", "--bundle", bundle, "--public-key", public)
    assert refused.returncode == 2 and "holds no record to replay" in refused.stderr

    assert _erase(service, subject, "on request")[0] == 200
    erased = coordinator(*export, "--record")
    assert erased.returncode == 1 and "data was erased" in erased.stderr
    assert coordinator(*export).returncode == 0
    holds = coordinator("audit", "verify", "--bundle", bundle, "--public-key", public)
    assert holds.returncode == 0, holds.stdout


def _decided_reviews(dsn: str, service: Service, products: Any, *subjects: str) -> list[str]:
    """One review for each of ``subjects``, decided and pushed: its run finished, and the
    request id the delivery's key names, in order."""
    requests = []
    for subject in subjects:
        request = new_review(products)
        run = service.start_run("subject-review", {"requestId": request, "applicantId": subject})
        wait_state(dsn, run, RunState.WAITING)
        decide(products, request)
        push(service, request, f"evt-{request}")
        wait_state(dsn, run, RunState.FINISHED)
        requests.append(request)
    return requests


def _payloads(dsn: str) -> dict[str, bool]:
    """Whether each delivery (by key) still holds its payload."""
    with sync_connection(dsn) as conn:
        rows = conn.execute("SELECT key, payload IS NOT NULL AS held FROM deliveries")
        return {row["key"]: row["held"] for row in rows.fetchall()}


def test_the_webhook_payloads_an_erased_subjects_runs_waited_for_are_forgotten(
    dsn: str, services: Services
) -> None:
    """A delivery names no run, so its payload is sealed under the shared key: erasing a
    subject forgets the payloads its runs waited for, keeping each delivery's row (a
    repeat is still known as one), and leaves another subject's payloads whole."""
    service, products = services.deploy(["subject-review"], pushing())
    products.feed_read()
    erased, kept = f"applicant-{uuid.uuid4()}", f"applicant-{uuid.uuid4()}"
    decided = _decided_reviews(dsn, service, products, erased, kept)
    requests = dict(zip((erased, kept), decided, strict=True))
    payloads = functools.partial(_payloads, dsn)

    assert payloads() == {requests[erased]: True, requests[kept]: True}
    assert _erase(service, erased, "on request")[0] == 200
    assert payloads() == {requests[erased]: False, requests[kept]: True}
    refused = pytest.raises(psycopg.errors.RaiseException, match="append-only")
    with sync_connection(dsn) as conn, refused:  # still append-only for anything else
        conn.execute("UPDATE deliveries SET key = 'moved' WHERE key = %s", (requests[kept],))
    assert push(service, requests[erased], f"evt-{requests[erased]}").status_code == 204
    assert len(payloads()) == 2  # the repeat is known by its event id, and kept once


def test_an_archived_runs_webhook_payload_is_forgotten_with_its_history(
    dsn: str, services: Services
) -> None:
    """Archiving a run takes its waiting events to its bundle, where an erasure could no
    longer find the deliveries it waited for: the archiving forgets their payloads (the
    row stays, and a repeat is still known as one), and leaves whole the payload of a
    delivery that came before any run waited for it."""
    keys, archive = services.directory / "keys", services.directory / "archive"
    retention = {"archiveAfter": "PT1S", "directory": str(archive), "every": "PT1S"}
    service, products = services.deploy(
        ["subject-review"], pushing(), extra={**signing(keys), "retention": retention}
    )
    products.feed_read()
    early = new_review(products)
    decide(products, early)
    push(service, early, f"evt-{early}")  # no run waits for it yet
    [archived] = _decided_reviews(dsn, service, products, f"applicant-{uuid.uuid4()}")
    wait_for(dsn, "SELECT count(*) FROM archived_runs", 1)
    assert _payloads(dsn) == {archived: False, early: True}
    push(service, archived, f"evt-{archived}")
    assert len(_payloads(dsn)) == 2


def _listening(dsn: str) -> set[int]:
    """The backends LISTENing for the service's notices: one per process's listener."""
    with sync_connection(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN coordinator_wake'"
        ).fetchall()
    return {row["pid"] for row in rows}


def test_another_process_forgets_an_erased_key_also_after_missing_the_notice(
    dsn: str, services: Services
) -> None:
    """A process that opened a subject's data holds its key: erased through another
    process, it forgets the key when the notice comes — and when it missed the notice
    (its listener's session gone, the process stopped until after the erasure), once its
    listener is back and asks which of the keys it holds were erased meanwhile."""
    erasing, _ = services.deploy(["subject-lookup"], RECORDS)
    first = _listening(dsn)
    settings = json.loads(erasing.config.read_text())
    settings["listen"]["port"] = free_port()
    config = erasing.config.with_name("reading.json")
    config.write_text(json.dumps(settings))
    reading = services.start(config, log=services.directory / "reading.log").wait_listening()
    [listener] = until(lambda: _listening(dsn) - first, "the second process's listener")

    def output_in_b(run: str) -> object:
        return reading.status(run)["output"]

    notified, missed = f"applicant-{uuid.uuid4()}", f"applicant-{uuid.uuid4()}"
    runs = {subject: _start(erasing, subject)[0] for subject in (notified, missed)}
    for run in runs.values():
        wait_state(dsn, run, RunState.FINISHED)
        assert output_in_b(run) is not None  # opened there: the key is held there

    assert _erase(erasing, notified, "on request")[0] == 200
    until(lambda: output_in_b(runs[notified]) is None, "the notice to be heard")
    assert reading.http.get("/ready").json()["parts"]["listener"]["reconnects"] == 0

    reading.process.send_signal(signal.SIGSTOP)
    try:
        with sync_connection(dsn) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (listener,))
        assert _erase(erasing, missed, "on request")[0] == 200  # its notice goes unheard
    finally:
        reading.process.send_signal(signal.SIGCONT)
    until(lambda: output_in_b(runs[missed]) is None, "the listener to catch up")
    assert reading.http.get("/ready").json()["parts"]["listener"]["reconnects"] == 1
