"""Personal data sealed at rest, tried as someone holding a database dump would: a run's
input, its steps' outputs and its output are ciphertext in the rows and in ``pg_dump``,
read back in clear only through the service; a sealed value copied into another run's
row does not open there, and says so; a database whose data keys the configuration
cannot open is refused at startup, in one line, before any run needs them; and a
rotation to a new key-encryption key, killed between two keys while the service runs,
loses nothing and goes on where it stopped.

The canary is a product's record: stand-in BReg makes a record's e-mail address from its
id, so the address appears nowhere but in what the run read and kept.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import uuid
from pathlib import Path

import httpx

from registry_coordinator.authoring.canonical import canonical_bytes, digest_of
from registry_coordinator.custody import DataKey, wrap
from registry_coordinator.semantics.codes import RunState
from registry_coordinator.store.database import sync_connection
from tests.support import (
    HANG_ONCE,
    PG_BIN,
    Service,
    Services,
    coordinator,
    coordinator_on_terminal,
    deliver,
    reviews,
    run_state,
    services_kek,
    wait_state,
)
from tests.support.config import custody

RECORDS: dict[str, tuple[str, dict[str, str]]] = {"records": ("breg", {})}


def _email(record: str) -> str:
    """The e-mail address stand-in BReg's record ``record`` holds."""
    return f"applicant+{record[:8]}@example.org"


def _looked_up(dsn: str, services: Services, count: int) -> tuple[Service, list[tuple[str, str]]]:
    """``count`` finished runs of ``lookup``, each with the record id it read."""
    service, _ = services.deploy(["lookup"], RECORDS)
    runs = []
    for _ in range(count):
        record = str(uuid.uuid4())
        runs.append((service.start_run("lookup", {"recordId": record}), record))
    for run, _ in runs:
        wait_state(dsn, run, RunState.FINISHED)
    return service, runs


def _dumped(dsn: str, directory: Path) -> bytes:
    """The whole database as a plain (uncompressed) ``pg_dump`` writes it."""
    out = directory / "dump.sql"
    dump = [str(PG_BIN / "pg_dump"), "--format=plain", f"--file={out}", f"--dbname={dsn}"]
    subprocess.run(dump, check=True, capture_output=True)
    return out.read_bytes()


def test_a_runs_data_is_ciphertext_in_the_rows_and_the_dump(dsn: str, services: Services) -> None:
    service, [(run, record)] = _looked_up(dsn, services, 1)
    email = _email(record)
    assert service.status(run)["output"] == {"email": email}  # in clear to its caller
    with sync_connection(dsn) as conn:
        row = conn.execute(
            "SELECT data_key, input, outputs, output FROM runs WHERE id = %s", (run,)
        ).fetchone()
    assert row is not None and row["data_key"] is not None
    assert all(isinstance(row[c], str) for c in ("input", "output")), row
    assert all(isinstance(v, str) for v in row["outputs"].values()), row["outputs"]
    assert email not in json.dumps(row) and record not in json.dumps(row)
    opened = run_state(dsn, run)  # the tests' key-encryption key opens them
    assert opened["input"] == {"recordId": record} and opened["output"] == {"email": email}
    assert opened["outputs"]["read"]["data"]["domainData"]["email"] == email

    dump = _dumped(dsn, services.directory)
    assert run.encode() in dump  # ids stay in clear (docs/custody.md says why)
    assert email.encode() not in dump


def test_what_was_sent_and_answered_is_ciphertext_in_the_dump(dsn: str, services: Services) -> None:
    """A prepared BReg action's request carries the record id in its body; a read's in its
    URL, and its answer the address: neither is in the dump, in ``executions`` or in the
    history's ``call-dispatched`` event, and the console still shows them to an operator."""
    service, _ = services.deploy(["act", "lookup"], {"registry": ("breg", {}), **RECORDS})
    record = str(uuid.uuid4())
    acted = service.start_run("act", {"recordId": record})
    read = service.start_run("lookup", {"recordId": record})
    for run in (acted, read):
        wait_state(dsn, run, RunState.FINISHED)
    with sync_connection(dsn) as conn:
        sent = conn.execute("SELECT count(*) AS n FROM executions").fetchone()
    assert sent is not None and sent["n"] >= 1  # the action was sealed and sent
    dump = _dumped(dsn, services.directory)
    for canary in (record, _email(record)):  # pg_dump writes bytea in hexadecimal
        assert canary.encode() not in dump and canary.encode().hex().encode() not in dump
    history = service.http.get(f"/v1/runs/{acted}/history").json()["events"]
    dispatched = [e for e in history if e["kind"] == "call-dispatched"]
    assert dispatched and all(e["detail"]["url"].startswith("http://") for e in dispatched)


def test_an_operators_reason_and_a_webhooks_payload_are_ciphertext_in_the_dump(
    dsn: str, services: Services
) -> None:
    """An operator's reason may name a person — a run's, or admission's — and so may a
    product's webhook payload: none is in the dump; the run's history gives the reason back
    to its readers, and a start refused while admission is held reads the hold's."""
    notices = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", notices), **reviews()}
    )
    products.faults("messaging", HANG_ONCE)
    run = service.start_run("notify", {"email": "held@example.org"})
    wait_state(dsn, run, RunState.HELD)
    reason = f"checked with {uuid.uuid4()} by phone"
    asked = service.http.post(f"/v1/runs/{run}/retry-same", json={"reason": reason})
    assert asked.status_code == 200, asked.text
    wait_state(dsn, run, RunState.FINISHED)
    payload = f"payload-{uuid.uuid4()}"
    body = {"eventId": "evt-1", "result": "review-decision", "key": "k-1", "payload": payload}
    assert deliver(service, body).status_code == 202
    held = f"held while {uuid.uuid4()}'s complaint is looked into"
    assert service.http.post("/v1/admission/hold", json={"reason": held}).status_code == 200
    refused = service.http.post(
        "/v1/runs", json={"workflow": "notify", "input": {"email": "late@example.org"}},
        headers={"Idempotency-Key": f"late-{uuid.uuid4()}"},
    )  # fmt: skip
    assert refused.status_code == 503 and held in refused.text, refused.text  # read back
    released = f"released: {uuid.uuid4()} answered"
    assert service.http.post("/v1/admission/release", json={"reason": released}).status_code == 200

    dump = _dumped(dsn, services.directory)
    for canary in (reason, payload, held, released):
        assert canary.encode() not in dump and canary.encode().hex().encode() not in dump
    history = service.http.get(f"/v1/runs/{run}/history").json()["events"]
    retried = [e for e in history if e["kind"] == "retry-same"]
    assert [e["detail"]["reason"] for e in retried] == [reason]


def test_a_value_that_fails_its_schema_is_not_quoted_where_it_fails(
    dsn: str, services: Services
) -> None:
    """A record id that is no UUID fails BReg's read-record contract: the run fails
    request-invalid, and its detail, its history, the log and the dump say which field and
    which rule, never the value (a mistyped national id is still a person's)."""
    service, _ = services.deploy(["lookup"], RECORDS)
    mistyped = f"id-{uuid.uuid4().hex}"
    run = service.start_run("lookup", {"recordId": mistyped})
    wait_state(dsn, run, RunState.FAILED)
    failure = service.status(run)["failure"]
    assert failure["code"] == "request-invalid", failure
    assert "recordId: does not match '^[0-9a-f]" in failure["detail"], failure
    assert mistyped not in json.dumps(service.history(run))
    assert mistyped.encode() not in _dumped(dsn, services.directory)
    with service.log.open() as log:
        assert mistyped not in log.read()


def test_a_sealed_value_copied_to_another_run_does_not_open(dsn: str, services: Services) -> None:
    service, [(first, record), (second, _)] = _looked_up(dsn, services, 2)
    email = _email(record)
    with sync_connection(dsn) as conn:
        conn.execute(
            "UPDATE runs SET output = (SELECT output FROM runs WHERE id = %s) WHERE id = %s",
            (first, second),
        )
    refused = service.http.get(f"/v1/runs/{second}")
    assert refused.status_code == 500, refused.text
    problem = refused.json()
    assert problem["code"] == "run.data-unopenable"
    assert f"the output of run {second} does not open here" in problem["detail"]
    assert problem["custody"] == "custody.not-authentic"
    assert email not in refused.text
    page = service.http.get(f"/console/runs/{second}")  # a person is answered with a page
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "run.data-unopenable" in page.text and "does not open here" in page.text
    assert email not in page.text
    assert service.status(first)["output"] == {"email": email}  # the original still opens
    with service.log.open() as log:
        assert email not in log.read()


def test_a_run_whose_data_does_not_open_is_held_and_the_others_go_on(
    dsn: str, services: Services
) -> None:
    """Asleep at a wait-until, a run is given another run's sealed input: the timer
    cannot take it on and leaves it to a worker, whose claim finds it unopenable and holds
    it with its own code at once (not retried at every lease's end), naming where; the
    run asleep beside it wakes and finishes."""
    service, _ = services.deploy(["timed-choice"], {})
    broken = service.start_run("timed-choice", {"answer": "yes"})
    beside = service.start_run("timed-choice", {"answer": "yes"})  # its output is sealed
    with sync_connection(dsn) as conn:
        conn.execute(
            "UPDATE runs SET input = (SELECT input FROM runs WHERE id = %s) WHERE id = %s",
            (beside, broken),
        )
    wait_state(dsn, broken, RunState.HELD)
    wait_state(dsn, beside, RunState.FINISHED)
    hold = service.status(broken)["hold"]
    assert hold["code"] == "data-unopenable", hold
    assert f"the input of run {broken} does not open here" in hold["detail"], hold
    assert "(custody.not-authentic)" in hold["detail"], hold
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT defects FROM runs WHERE id = %s", (broken,)).fetchone()
    assert row is not None and row["defects"] == 1  # held at the first claim
    with sync_connection(dsn) as conn:  # and now a column the held list reads is wrong too
        conn.execute(
            "UPDATE runs SET output = (SELECT output FROM runs WHERE id = %s) WHERE id = %s",
            (beside, broken),
        )
        copied = conn.execute("SELECT output FROM runs WHERE id = %s", (broken,)).fetchone()
    assert copied is not None and isinstance(copied["output"], str)  # a sealed value
    held = service.http.get("/console/")
    assert held.status_code == 200 and broken in held.text  # listed, not a 500 for all


def test_a_start_key_stands_for_a_keyed_digest_of_its_input(dsn: str, services: Services) -> None:
    """What an Idempotency-Key stands for is kept as an HMAC under the installation's key,
    so a dump cannot confirm a guessed input by hashing it; a retry still finds its run,
    another input under the key is refused, and a run whose digest is plain (admitted
    before custody) is still found by its retry."""
    service, _ = services.deploy(["lookup"], RECORDS)
    record = str(uuid.uuid4())
    run = service.start_run("lookup", {"recordId": record}, key="start-1")
    asked = {"workflow": "lookup", "version": None, "input": {"recordId": record}}
    plain = digest_of(canonical_bytes(asked))
    with sync_connection(dsn) as conn:
        row = conn.execute("SELECT start_digest FROM runs WHERE id = %s", (run,)).fetchone()
    assert row is not None and row["start_digest"].startswith("hmac-sha256:"), row
    assert row["start_digest"] != plain and plain.removeprefix("sha256:") not in str(row)

    def start(run_input: object) -> httpx.Response:
        body = {"workflow": "lookup", "input": run_input}
        return service.http.post("/v1/runs", json=body, headers={"Idempotency-Key": "start-1"})

    again = start({"recordId": record})
    assert (again.status_code, again.json()["id"]) == (200, run), again.text
    other = start({"recordId": str(uuid.uuid4())})
    assert other.status_code == 409, other.text
    with sync_connection(dsn) as conn:
        conn.execute("UPDATE runs SET start_digest = %s WHERE id = %s", (plain, run))
    before = start({"recordId": record})
    assert (before.status_code, before.json()["id"]) == (200, run), before.text


def _without_custody(config: Path, custody: object) -> Path:
    changed = config.with_name(f"custody-{uuid.uuid4().hex[:6]}.json")
    settings = json.loads(config.read_text())
    if custody is None:
        del settings["custody"]
    else:
        settings["custody"] = custody
    changed.write_text(json.dumps(settings))
    return changed


def test_a_database_whose_keys_do_not_open_is_refused_at_start(
    dsn: str, services: Services
) -> None:
    service, _ = _looked_up(dsn, services, 1)
    assert service.stop() == 0

    bare = coordinator("serve", "--config", _without_custody(service.config, None))
    assert bare.returncode == 1, bare.stderr
    assert bare.stderr.count("\n") == 1 and "Traceback" not in bare.stderr
    assert "the database holds 1 data key," in bare.stderr, bare.stderr
    assert "give custody: {keys: ..., active: N}" in bare.stderr

    other = services.directory / "other-kek"
    other.write_text("ab" * 32 + "\n")
    wrong = {"keys": {"1": f"file:{other}"}, "active": 1}
    refused = coordinator("serve", "--config", _without_custody(service.config, wrong))
    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "(custody.not-authentic)" in refused.stderr, refused.stderr


def _keys_by_version(dsn: str) -> dict[int, int]:
    with sync_connection(dsn) as conn:
        rows = conn.execute("SELECT kek, count(*) AS n FROM data_keys GROUP BY kek").fetchall()
    return {row["kek"]: row["n"] for row in rows}


def _subjects_keys(dsn: str, count: int) -> None:
    """``count`` more data keys wrapped under the services' KEK 1, as data subjects' are."""
    kek = services_kek(dsn)
    with sync_connection(dsn) as conn:
        timeline = conn.execute("SELECT installation FROM timeline").fetchone()
        assert timeline is not None
        for _ in range(count):
            key = DataKey(secrets.randbits(63) or 1, os.urandom(32))
            conn.execute(
                "INSERT INTO data_keys (id, subject, kek, wrapped) VALUES (%s, %s, 1, %s)",
                (key.id, os.urandom(32), wrap(kek, timeline["installation"], key)),
            )


def test_a_rotation_killed_midway_loses_nothing(dsn: str, services: Services) -> None:
    service, [(run, record)] = _looked_up(dsn, services, 1)
    _subjects_keys(dsn, 2)
    old = json.loads(service.config.read_text())["custody"]["keys"]["1"]
    new = services.directory / "kek-2"
    assert coordinator("keys", "generate", "--out", new).returncode == 0
    both = _without_custody(service.config, {"keys": {"1": old, "2": f"file:{new}"}, "active": 2})

    killed = coordinator(
        "keys", "rotate", "--config", both, env={"COORDINATOR_CRASH_AT": "mid-rotation:2"}
    )
    assert killed.returncode == -9, killed.stderr  # the first key stored, the second not
    assert _keys_by_version(dsn) == {1: 2, 2: 1}
    assert service.status(run)["output"] == {"email": _email(record)}  # served meanwhile
    looked = coordinator("doctor", "--config", both)
    assert (
        "WARN  2 data keys wrapped under key-encryption key 1, not the active 2: "
        "run coordinator keys rotate --config FILE\n"
    ) in looked.stdout, looked.stdout
    later = str(uuid.uuid4())
    wait_state(dsn, service.start_run("lookup", {"recordId": later}), RunState.FINISHED)

    code, out, shown = coordinator_on_terminal("keys", "rotate", "--config", both)
    assert code == 0, shown
    # On a terminal it shows its progress on one line, ended once: the summary goes to stdout.
    assert "\rrotating data keys: 1 of 2\rrotating data keys: 2 of 2\r\n" in shown, shown
    assert out == (
        "wrapped 2 data keys again under key-encryption key 2 (1 already under it, "
        "0 erased); every data key is under it: the other versions may leave custody.keys "
        "once no backup needs them\n"
    )
    assert _keys_by_version(dsn) == {2: 3}
    assert "ok    custody: 3 data keys, all under key-encryption key 2\n" in (
        coordinator("doctor", "--config", both).stdout
    )
    assert service.stop() == 0

    only_new = _without_custody(service.config, {"keys": {"2": f"file:{new}"}, "active": 2})
    after = services.start(only_new)
    assert after.status(run)["output"] == {"email": _email(record)}
    assert after.stop() == 0
    only_old = _without_custody(service.config, {"keys": {"1": old}, "active": 1})
    refused = coordinator("serve", "--config", only_old)
    assert refused.returncode == 1, refused.stderr
    assert "(custody.kek-missing)" in refused.stderr, refused.stderr


def test_runs_that_ended_before_custody_are_sealed_after_and_a_kill_loses_nothing(
    dsn: str, services: Services
) -> None:
    """A database that ran without custody holds its runs in clear; with custody given,
    ``keys seal`` seals each ended run whole in a transaction of its own — killed between
    a run and its sendings, that run stays in clear and the next pass seals it — and the
    API reads them as before, their histories as they were written and signed."""
    service, _ = services.deploy(["lookup"], RECORDS, extra={"custody": {}})
    records = [str(uuid.uuid4()) for _ in range(3)]
    runs = [service.start_run("lookup", {"recordId": record}) for record in records]
    for run in runs:
        wait_state(dsn, run, RunState.FINISHED)
    histories = {run: service.http.get(f"/v1/runs/{run}/history").json() for run in runs}
    assert service.stop() == 0
    with_custody = _without_custody(service.config, custody(services.directory, dsn))

    killed = coordinator(
        "keys", "seal", "--config", with_custody, env={"COORDINATOR_CRASH_AT": "mid-sealing:2"}
    )
    assert killed.returncode == -9, killed.stderr

    def sealed() -> list[bool]:
        with sync_connection(dsn) as conn:
            rows = conn.execute(
                "SELECT data_key IS NOT NULL AS sealed FROM runs WHERE id = ANY(%s::uuid[]) "
                "ORDER BY id",
                (runs,),
            ).fetchall()
        return [row["sealed"] for row in rows]

    assert sealed() == [True, False, False]  # the second's transaction rolled back whole
    done = coordinator("keys", "seal", "--config", with_custody)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "sealed 2 ended runs written before custody (2 sendings) under the installation's "
        "shared key; their histories stay as written; every run's values are sealed\n"
    )
    assert sealed() == [True, True, True]
    dump = _dumped(dsn, services.directory)
    for record in records:
        for canary in (record, _email(record)):  # the run's row and its sendings'
            assert canary.encode().hex().encode() not in dump
        # Its output (and the answer) are sealed; the history keeps the URL it was written with.
        assert _email(record).encode() not in dump
    with sync_connection(dsn) as conn:
        inputs = conn.execute("SELECT input FROM runs WHERE id = ANY(%s::uuid[])", (runs,))
        assert all(isinstance(row["input"], str) for row in inputs.fetchall())  # ciphertext

    again = services.start(with_custody)
    for run, record in zip(runs, records, strict=True):
        assert again.status(run)["output"] == {"email": _email(record)}
        assert again.http.get(f"/v1/runs/{run}/history").json() == histories[run]
    verified = coordinator("audit", "verify", "--config", with_custody)
    assert verified.returncode == 0, verified.stdout
