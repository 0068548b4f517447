"""Caller authentication and policies against a live service.

Tokens are signed here with real keys (Ed25519, RSA and P-256) whose public
halves are in the JWKS file the service is configured with.
"""

from __future__ import annotations

import base64
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import h11
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER
from tests.support import (
    KEYS,
    POLICIES,
    Service,
    Services,
    call,
    coordinator,
    h11_answer,
    jwt_auth,
    token,
)


@pytest.fixture
def service(services: Services, tmp_path: Path) -> Service:
    auth = jwt_auth(tmp_path)
    return services(["timed-choice", "deadline"], extra={"auth": auth})


def start(service: Service, bearer: str, workflow: str = "timed-choice") -> Any:
    return call(
        service,
        "POST",
        "/v1/runs",
        bearer,
        json={"workflow": workflow, "input": {"answer": "no"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def test_refused_tokens_get_401_with_a_code(service: Service) -> None:
    now = int(time.time())
    other = Ed25519PrivateKey.generate()
    cases = [
        ("auth.missing-token", None),
        ("auth.invalid-token", "not-a-jwt"),
        ("auth.invalid-token", token("case-portal", key=other)),  # right kid, wrong key
        (
            "auth.unknown-key",
            jwt.encode(
                {"iss": DEVELOPMENT_ISSUER}, other, algorithm="EdDSA", headers={"kid": "nobody"}
            ),
        ),
        (  # the Ed25519 key's id on an RS256 token: refused, not tried with the wrong key
            "auth.invalid-token",
            jwt.encode({"iss": "x"}, KEYS["rsa"][1], algorithm="RS256", headers={"kid": "ed"}),
        ),
        ("auth.expired", token("case-portal", iat=now - 600, exp=now - 120)),
        ("auth.wrong-audience", token("case-portal", aud="someone-else")),
        ("auth.wrong-issuer", token("case-portal", iss="https://foreign.example")),
        ("auth.lifetime-too-long", token("case-portal", exp=now + 7200)),
    ]
    for code, bearer in cases:
        response = call(service, "GET", "/v1/runs", bearer)
        assert response.status_code == 401, (code, response.text)
        assert response.json()["code"] == code
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


def test_every_algorithm_is_accepted(service: Service) -> None:
    for kid in KEYS:
        response = call(service, "GET", "/v1/runs", token("case-portal", kid=kid))
        assert response.status_code == 200, (kid, response.text)


def test_a_valid_token_without_a_policy_gets_403(service: Service) -> None:
    stranger = token("stranger")
    assert start(service, stranger).json()["code"] == "auth.forbidden"
    assert call(service, "GET", "/v1/runs", stranger).status_code == 403
    wrong_scope = token("case-portal", scopes="something.else")
    assert start(service, wrong_scope).status_code == 403
    not_this_workflow = start(service, token("case-portal"), workflow="deadline")
    assert not_this_workflow.status_code == 403
    no_cancel = start(service, token("other-portal"))
    assert no_cancel.status_code == 201
    refused = call(
        service,
        "POST",
        f"/v1/runs/{no_cancel.json()['id']}/cancel",
        token("other-portal"),
        json={"reason": "try"},
    )
    assert refused.status_code == 403
    not_operator = call(
        service, "POST", "/v1/admission/hold", token("case-portal"), json={"reason": "x"}
    )
    assert not_operator.json()["code"] == "auth.operator-required"


def test_a_run_is_read_and_cancelled_only_under_a_policy_for_its_workflow(
    service: Service,
) -> None:
    """A caller's own run of a workflow its token's policies do not cover (started under
    another scope) is refused, as its start would be."""
    deadlines = token("case-portal", scopes="coordinator.deadlines")
    run = start(service, deadlines, workflow="deadline").json()["id"]
    assert call(service, "GET", f"/v1/runs/{run}", deadlines).status_code == 200
    runs_only = token("case-portal")  # timed-choice only
    for method, path, body in [
        ("GET", f"/v1/runs/{run}", None),
        ("GET", f"/v1/runs/{run}/history", None),
        ("POST", f"/v1/runs/{run}/cancel", {"reason": "not under this policy"}),
    ]:
        refused = call(service, method, path, runs_only, json=body)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.json()["code"] == "auth.forbidden"
    assert call(service, "GET", f"/v1/runs/{run}", deadlines).json()["state"] != "cancelled"


def test_a_listing_shows_only_runs_of_workflows_the_tokens_policies_cover(
    service: Service,
) -> None:
    """The listing applies the rule a run's own route does: a caller's run of a workflow
    its token's policies do not cover is not listed, under any filter or page size."""
    deadlines = token("case-portal", scopes="coordinator.deadlines")
    hidden = start(service, deadlines, workflow="deadline").json()["id"]
    runs_only = token("case-portal")  # timed-choice only
    shown = start(service, runs_only).json()["id"]
    filters: list[dict[str, Any]] = [{}, {"workflow": "deadline"}, {"state": "running"}]
    for params in [*filters, {"limit": 1}]:
        page = call(service, "GET", "/v1/runs", runs_only, params=params).json()
        assert hidden not in [r["id"] for r in page["runs"]], params
        while page["next"]:
            cursor = {**params, "cursor": page["next"]}
            page = call(service, "GET", "/v1/runs", runs_only, params=cursor).json()
            assert hidden not in [r["id"] for r in page["runs"]], params
    listed = call(service, "GET", "/v1/runs", runs_only).json()["runs"]
    assert [r["id"] for r in listed] == [shown]
    both = token("case-portal", scopes="coordinator.runs coordinator.deadlines")
    listed = call(service, "GET", "/v1/runs", both).json()["runs"]
    assert {r["id"] for r in listed} == {hidden, shown}
    deadline_only = call(service, "GET", "/v1/runs", deadlines).json()["runs"]
    assert [r["id"] for r in deadline_only] == [hidden]


def test_callers_see_their_own_runs_and_operators_see_all(service: Service) -> None:
    mine = start(service, token("case-portal")).json()["id"]
    theirs = start(service, token("other-portal")).json()["id"]
    assert call(service, "GET", f"/v1/runs/{theirs}", token("case-portal")).status_code == 404
    history = call(service, "GET", f"/v1/runs/{theirs}/history", token("case-portal"))
    assert history.status_code == 404
    cancel = call(
        service,
        "POST",
        f"/v1/runs/{theirs}/cancel",
        token("case-portal"),
        json={"reason": "not mine"},
    )
    assert cancel.status_code == 404
    listed = call(service, "GET", "/v1/runs", token("case-portal")).json()["runs"]
    assert [r["id"] for r in listed] == [mine]
    operator = token("registry-operators", "coordinator.operate")
    assert call(service, "GET", f"/v1/runs/{theirs}", operator).status_code == 200
    everything = call(service, "GET", "/v1/runs", operator).json()["runs"]
    assert {r["id"] for r in everything} == {mine, theirs}
    assert call(service, "GET", f"/v1/runs/{mine}", token("case-portal")).json()["caller"] == (
        "case-portal"
    )


def test_a_refusal_sent_before_the_body_arrived_leaves_the_connection_usable(
    service: Service,
) -> None:
    """Clients send headers and body in separate writes; under load a refusal (401, 404)
    can be sent before the body arrives. The client's next request on that connection
    must still be answered (it used to wait forever: a test here timed out on it)."""
    theirs = start(service, token("other-portal")).json()["id"]
    host, port = service.url.removeprefix("http://").split(":")
    body = b'{"reason": "not mine"}'
    refusals = [
        (f"/v1/runs/{theirs}/cancel", [("Authorization", f"Bearer {token('case-portal')}")], 404),
        ("/v1/runs", [], 401),
        ("/v1/no-such-route", [], 404),
    ]
    for path, authorization, status in refusals:
        client = h11.Connection(h11.CLIENT)
        headers = [("Host", "test"), ("Content-Length", str(len(body))), *authorization]
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(client.send(h11.Request(method="POST", target=path, headers=headers)))
            time.sleep(0.2)  # the server has all it needs to refuse
            sock.sendall(client.send(h11.Data(data=body)) + client.send(h11.EndOfMessage()))
            assert h11_answer(sock, client) == status, path
            client.start_next_cycle()
            request = h11.Request(method="GET", target="/health", headers=[("Host", "test")])
            sock.sendall(client.send(request) + client.send(h11.EndOfMessage()))
            assert h11_answer(sock, client) == 200, path


def test_run_listing_pages_with_a_cursor_and_filters(service: Service) -> None:
    operator = token("registry-operators", "coordinator.operate")
    started = [start(service, token("other-portal")).json()["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = call(service, "GET", "/v1/runs", operator, params=params).json()
        seen += [r["id"] for r in page["runs"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(started)
    assert len(seen) == len(set(seen))
    filters = {"state": "finished", "workflow": "timed-choice"}
    deadline = time.monotonic() + 30  # the runs finish after their 2 s wait-until
    while True:
        finished = call(service, "GET", "/v1/runs", operator, params=filters).json()["runs"]
        if {r["id"] for r in finished} == set(started) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {r["id"] for r in finished} == set(started)
    assert all(r["state"] == "finished" for r in finished)
    other = {"state": "finished", "workflow": "deadline"}
    assert call(service, "GET", "/v1/runs", operator, params=other).json()["runs"] == []
    bad = call(service, "GET", "/v1/runs", operator, params={"state": "sleeping"})
    assert bad.json()["code"] == "request.invalid-filter"
    unreadable = [
        "%%%",
        base64.urlsafe_b64encode(b'["2024-01-01T00:00:00Z", 5]').decode(),
        base64.urlsafe_b64encode(
            f'["9999-12-31T23:59:59-23:59", "{started[0]}"]'.encode()
        ).decode(),
    ]
    for cursor in unreadable:
        refused = call(service, "GET", "/v1/runs", operator, params={"cursor": cursor})
        assert refused.status_code == 400, (cursor, refused.text)
        assert refused.json()["code"] == "request.invalid-cursor"
    workflows = call(service, "GET", "/v1/workflows", token("stranger")).json()["workflows"]
    assert sorted(w["id"] for w in workflows) == ["deadline", "timed-choice"]


def test_coordinator_token_mints_a_token_the_service_accepts(
    tmp_path: Path, services: Services
) -> None:
    key = tmp_path / "dev" / "signing-key.pem"
    minted = coordinator(
        "token", "--key", key, "--client", "case-portal", "--scope", "coordinator.runs"
    )
    assert minted.returncode == 0, minted.stderr
    assert "created development key" in minted.stderr
    auth = {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(key.with_name("signing-key.jwks.json")),
        "policies": POLICIES,
    }
    live = services(["timed-choice"], extra={"auth": auth})
    response = call(live, "GET", "/v1/runs", minted.stdout.strip())
    assert response.status_code == 200, response.text
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert coordinator("token", "--key", key, "--client", "x", "--lifetime", "soon").returncode == 2
