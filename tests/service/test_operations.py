"""Service identities (OAuth 2 client credentials), cancellation, admission, no secrets kept."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from registry_coordinator.store.database import sync_connection
from registry_coordinator.store.operator_actions import admission_reason
from tests.support import (
    STANDIN_TOKEN,
    Services,
    events,
    free_port,
    notify_with_oauth2,
    oauth2,
    run_state,
    sendings,
    wait_for,
    wait_state,
)
from tests.support.rows import sealer_of


def test_client_secret_tokens_are_fetched_once_and_reused(
    dsn: str, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    service, products = notify_with_oauth2(services, monkeypatch)
    runs = [service.start_run("notify", {"email": f"{n}@example.org"}) for n in range(5)]
    for run in runs:
        wait_state(dsn, run, "finished")
    issued = products.ledger("idp")["applied"]
    assert issued == {"tokens": 1}
    kept = everything_stored(dsn)
    # What the runs sent is sealed in the rows (docs/custody.md): opened, it holds what
    # was sent, so what it lacks was never kept; nor is a secret anywhere in clear.
    sent = [r for run in runs for r in sendings(dsn, run)]
    assert any(b"0@example.org" in r["body"] for r in sent), "opened, the bodies sent"
    for secret in ("s3cret-for-tests", "Bearer", "tok-"):
        assert secret not in kept and secret.encode().hex() not in kept, secret
        assert all(secret.encode() not in r["body"] for r in sent), secret
        assert all(secret not in json.dumps(r["headers"]) for r in sent), secret


def everything_stored(dsn: str) -> str:
    """Every row of every table Coordinator has, as text (bytea in hex): whatever a column
    holds, a secret written anywhere is in here."""
    with sync_connection(dsn) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        names = [row["tablename"] for row in tables.fetchall()]
        assert {"runs", "run_events", "executions"} <= set(names), names
        return "\n".join(
            row["text"]
            for name in names
            for row in conn.execute(f"SELECT t::text AS text FROM {name} t").fetchall()
        )


def test_private_key_jwt_client_authentication(
    dsn: str, tmp_path: Path, services: Services
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = tmp_path / "key.pem"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    public = tmp_path / "key.pub.pem"
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    idp = free_port()
    identity = oauth2(idp, privateKey=f"file:{private}", keyId="k1", algorithm="RS256")
    service, products = services.deploy(
        ["notify"],
        {"notices": ("messaging", {"identity": identity})},
        also={"idp": idp},
        stand_in_env={"STANDIN_CLIENT_PUBLIC_KEY": str(public)},
    )
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, "finished")
    assert products.ledger("idp")["applied"] == {"tokens": 1}


def test_a_refused_client_secret_holds_the_run(dsn: str, services: Services) -> None:
    idp = free_port()
    identity = oauth2(idp, clientSecret="env:STANDIN_TOKEN")  # not the IdP's secret
    service, products = services.deploy(
        ["notify"], {"notices": ("messaging", {"identity": identity})}, also={"idp": idp}
    )
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_state(dsn, run, "held")
    assert products.requests("messaging", "POST", "/v1/messages") == []
    state = run_state(dsn, run)
    assert state["hold_code"] == "product-forbidden"
    assert "token endpoint" in state["detail"]
    assert STANDIN_TOKEN not in state["detail"]


def test_cancel_with_a_call_in_flight_takes_effect_when_it_settles(
    dsn: str, services: Services
) -> None:
    service, products = services.deploy(["notify", "timed-choice"], {"notices": ("messaging", {})})
    products.faults("messaging", {"match": "POST", "mode": "delay", "seconds": 2})
    run = service.start_run("notify", {"email": "a@example.org"})
    wait_for(dsn, "SELECT dispatched_at IS NOT NULL FROM runs WHERE id = %s", True, params=(run,))
    asked = service.http.post(f"/v1/runs/{run}/cancel", json={"reason": "applicant withdrew"})
    assert asked.status_code == 202, asked.text
    assert asked.json()["state"] == "running"
    wait_state(dsn, run, "cancelled")
    time.sleep(1)
    assert len(products.requests("messaging", "POST", "/v1/messages")) == 1

    waiting = service.start_run("timed-choice", {"answer": "yes"})
    wait_state(dsn, waiting, "waiting")
    done = service.http.post(f"/v1/runs/{waiting}/cancel", json={"reason": "duplicate"})
    assert done.status_code == 200
    assert done.json()["state"] == "cancelled"
    again = service.http.post(f"/v1/runs/{waiting}/cancel", json={"reason": "twice"})
    assert again.status_code == 409
    assert again.json()["code"] == "run.ended"
    time.sleep(2.5)  # past the wait-until: nothing moves a cancelled run
    assert run_state(dsn, waiting)["state"] == "cancelled"
    kinds = [e["kind"] for e in events(dsn, run)]
    # What became of the request in flight is recorded, then the cancellation it waited for.
    assert kinds == [
        "admitted",
        "call-dispatched",
        "cancel-requested",
        "call-answered",
        "cancelled",
    ]
    assert events(dsn, run)[2]["detail"] == {"reason": "applicant withdrew"}
    with sync_connection(dsn) as conn:
        assert conn.execute("SELECT count(*) AS n FROM waits").fetchone() == {"n": 0}


def test_admission_hold_and_release(dsn: str, services: Services) -> None:
    service = services(["timed-choice"])
    body = {"workflow": "timed-choice", "input": {"answer": "no"}}
    held = service.http.post("/v1/admission/hold", json={"reason": "database upgrade"})
    assert held.status_code == 200
    refused = service.http.post("/v1/runs", json=body, headers={"Idempotency-Key": "a"})
    assert refused.status_code == 503
    assert refused.json()["code"] == "admission.held"
    assert "database upgrade" in refused.json()["detail"]
    assert service.http.post("/v1/admission/release", json={}).status_code == 400
    released = service.http.post("/v1/admission/release", json={"reason": "done"})
    assert released.status_code == 200
    started = service.http.post("/v1/runs", json=body, headers={"Idempotency-Key": "a"})
    assert started.status_code == 201
    with sync_connection(dsn) as conn:
        trail = conn.execute(
            "SELECT held, reason, data_key AS reason_key FROM admission_events ORDER BY at"
        ).fetchall()
    assert all(row["reason_key"] is not None for row in trail)  # sealed: a reason may name one
    sealer = sealer_of(dsn)
    assert [(row["held"], admission_reason(sealer, row)) for row in trail] == [
        (True, "database upgrade"),
        (False, "done"),
    ]
