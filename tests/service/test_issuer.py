"""The stand-in OpenID Connect issuer the console signs in with, as a real
``coordinator stand-ins --issuer`` process driven over HTTP the way a browser (the
sign-in page's forms, the 303 back) and a console (discovery, the token endpoint) do.

The tokens are checked with pyjwt against the key set the issuer publishes, and once by
a real Coordinator configured with that key set's URL.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import h11
import httpx
import jwt
import pytest

from registry_coordinator.devtools.issuer import s256
from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, jwks_path
from tests.support import (
    Forms,
    Services,
    coordinator,
    coordinator_process,
    free_port,
    h11_answer,
)

CLIENT = "coordinator-console"
REDIRECT = "http://127.0.0.1:8123/console/signed-in?from=held"
PEOPLE = {
    "ada": ("registry-operators", "coordinator.operate", "Ada Lindqvist (operator)"),
    "bo": ("registry-operators", "coordinator.operate", "Bo Jensen (second operator)"),
    "sam": ("case-portal", "coordinator.runs", "Sam Okafor (caseworker supervisor)"),
}
#: Every parameter of an authorization request, in the order the issuer checks them.
PARAMETERS = (
    "client_id",
    "redirect_uri",
    "response_type",
    "scope",
    "state",
    "nonce",
    "code_challenge",
    "code_challenge_method",
)


@dataclass
class RunningIssuer:
    """The stand-in issuer serving in a process of its own, and a client to it."""

    url: str
    key: Path
    http: httpx.Client


@contextmanager
def issuer_process(directory: Path, *options: str) -> Iterator[tuple[list[str], Path]]:
    """``coordinator stand-ins`` with ``options``: the lines it printed, one per server
    (read until the issuer's), and its log."""
    log = directory / "stand-ins.log"
    process = coordinator_process(["stand-ins", *options], log, stdout=subprocess.PIPE)
    assert process.stdout is not None
    try:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("issuer "):
            line = process.stdout.readline().decode()
            assert line, f"stand-ins did not start:\n{log.read_text()}"
            lines.append(line)
        yield lines, log
    finally:
        process.kill()
        process.wait(10)
        process.stdout.close()


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIssuer]:
    directory = tmp_path_factory.mktemp("issuer")
    port, key = free_port(), directory / "keys" / "issuer.pem"
    with issuer_process(directory, f"--issuer={port}", f"--issuer-key={key}") as (lines, _):
        url = f"http://127.0.0.1:{port}"
        assert lines == [f"issuer {url}\n"]
        with httpx.Client(base_url=url, timeout=10) as http:
            yield RunningIssuer(url, key, http)


# --- a browser and a console ----------------------------------------------------------------


def request(challenge: str, **changes: str | None) -> dict[str, str]:
    """An authorization request for ``challenge``, with ``changes`` (None drops one)."""
    parameters = {
        "response_type": "code",
        "client_id": CLIENT,
        "redirect_uri": REDIRECT,
        "scope": "openid profile",
        "state": secrets.token_urlsafe(16),
        "nonce": secrets.token_urlsafe(16),
        "code_challenge": challenge,
        "code_challenge_method": "S256",
        **changes,
    }
    return {name: value for name, value in parameters.items() if value is not None}


def sign_in(http: httpx.Client, person: str, verifier: str) -> tuple[str, dict[str, str]]:
    """Sign in as ``person`` as a browser does: the page, the person's form, the 303
    back to the redirect URI. The code it brings, and the request it answers."""
    asked = request(s256(verifier))
    page = http.get("/authorize", params=asked)
    assert page.status_code == 200, page.text
    (form,) = [f for f in Forms(page.text).forms if f.button == f"Sign in as {person}"]
    assert form.method == "get"
    approved = http.get(form.action, params=form.fields)
    assert approved.status_code == 303, approved.text
    location = urlsplit(approved.headers["Location"])
    query = parse_qs(location.query)
    assert urlunsplit(location._replace(query="from=held")) == REDIRECT
    assert query["from"] == ["held"]  # the redirect URI's own query is kept
    assert query["state"] == [asked["state"]]
    (code,) = query["code"]
    return code, asked


def exchange(http: httpx.Client, code: str, verifier: str, **changes: str) -> httpx.Response:
    return http.post(
        "/token",
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": REDIRECT,
            "client_id": CLIENT,
            "code_verifier": verifier,
            **changes,
        },
    )


def verified(http: httpx.Client, token: str, audience: str, issuer: str) -> dict[str, Any]:
    """The claims of ``token``, checked against the key set the issuer publishes."""
    header = jwt.get_unverified_header(token)
    (key,) = jwt.PyJWKSet.from_dict(http.get("/jwks").json()).keys
    assert header == {"alg": "EdDSA", "kid": key.key_id, "typ": "JWT"}
    claims: dict[str, Any] = jwt.decode(
        token, key.key, algorithms=["EdDSA"], audience=audience, issuer=issuer
    )
    return claims


def refused(response: httpx.Response, error: str, saying: str) -> None:
    assert response.status_code == (401 if error == "invalid_client" else 400), response.text
    assert response.headers["Cache-Control"] == "no-store"
    body = response.json()
    assert body["error"] == error
    assert saying in body["error_description"]


def refused_page(response: httpx.Response, parameter: str) -> None:
    assert response.status_code == 400
    assert response.headers["Content-Type"].startswith("text/html")
    assert "Location" not in response.headers
    assert "Sign-in request refused" in response.text
    assert f"The parameter <code>{parameter}</code>" in response.text


# --- the tests ---------------------------------------------------------------------------------


def test_discovery_names_the_endpoints_and_what_they_support(issuer: RunningIssuer) -> None:
    document = issuer.http.get("/.well-known/openid-configuration").json()
    url = issuer.url
    assert {k: v for k, v in document.items() if k not in ("scopes_supported",)} == {
        "issuer": url,
        "authorization_endpoint": f"{url}/authorize",
        "token_endpoint": f"{url}/token",
        "jwks_uri": f"{url}/jwks",
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code"],
        "code_challenge_methods_supported": ["S256"],
        "id_token_signing_alg_values_supported": ["EdDSA"],
        "subject_types_supported": ["public"],
        "token_endpoint_auth_methods_supported": ["none"],
        "claims_supported": ["iss", "aud", "sub", "exp", "iat", "nonce", "name"],
    }
    assert document["scopes_supported"] == [
        "openid",
        "profile",
        "coordinator.operate",
        "coordinator.runs",
    ]


def test_the_key_set_served_is_the_one_written_beside_the_key(issuer: RunningIssuer) -> None:
    served = issuer.http.get("/jwks").json()
    assert served == json.loads(jwks_path(issuer.key).read_text())
    assert [k["kty"] for k in served["keys"]] == ["OKP"]


def test_the_sign_in_page_offers_each_person_a_form_without_script(issuer: RunningIssuer) -> None:
    asked = request(s256(secrets.token_urlsafe(32)))
    page = issuer.http.get("/authorize", params=asked)
    assert page.status_code == 200
    assert "<h1>Sign in to Registry Coordinator</h1>" in page.text
    assert "script-src" not in page.headers["Content-Security-Policy"]
    assert page.headers["Content-Security-Policy"].startswith("default-src 'none'")
    parsed = Forms(page.text)
    assert parsed.scripts == 0
    assert [f.button for f in parsed.forms] == ["Sign in as ada", "Sign in as bo", "Sign in as sam"]
    for form, person in zip(parsed.forms, PEOPLE, strict=True):
        assert (form.action, form.method) == ("/authorize/approve", "get")
        assert form.fields == {**asked, "person": person}
    for client, scope, name in PEOPLE.values():
        assert name in page.text
        assert f"client {client}, scopes {scope}" in page.text


@pytest.mark.parametrize("person", sorted(PEOPLE))
def test_a_code_flow_with_pkce_gives_tokens_the_key_set_verifies(
    issuer: RunningIssuer, person: str
) -> None:
    verifier = secrets.token_urlsafe(48)
    code, asked = sign_in(issuer.http, person, verifier)
    answer = exchange(issuer.http, code, verifier)
    assert answer.status_code == 200, answer.text
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.json()
    client, scope, name = PEOPLE[person]
    assert {k: body[k] for k in ("token_type", "expires_in", "scope")} == {
        "token_type": "Bearer",
        "expires_in": 3600,
        "scope": scope,
    }

    access = verified(issuer.http, body["access_token"], DEVELOPMENT_AUDIENCE, issuer.url)
    assert set(access) == {"iss", "aud", "sub", "client_id", "scope", "iat", "exp", "jti"}
    assert (access["sub"], access["client_id"], access["scope"]) == (person, client, scope)
    assert access["exp"] - access["iat"] == 3600

    identity = verified(issuer.http, body["id_token"], CLIENT, issuer.url)
    assert set(identity) == {"iss", "aud", "sub", "nonce", "iat", "exp", "name"}
    assert (identity["sub"], identity["nonce"], identity["name"]) == (
        person,
        asked["nonce"],
        name,
    )


def test_a_code_is_spent_by_its_first_use(issuer: RunningIssuer) -> None:
    verifier = secrets.token_urlsafe(32)
    code, _ = sign_in(issuer.http, "ada", verifier)
    assert exchange(issuer.http, code, verifier).status_code == 200
    refused(exchange(issuer.http, code, verifier), "invalid_grant", "already used")


def test_a_wrong_verifier_is_refused_and_spends_the_code(issuer: RunningIssuer) -> None:
    verifier = secrets.token_urlsafe(32)
    code, _ = sign_in(issuer.http, "ada", verifier)
    wrong = secrets.token_urlsafe(32)
    refused(exchange(issuer.http, code, wrong), "invalid_grant", "does not match")
    refused(exchange(issuer.http, code, verifier), "invalid_grant", "already used")


@pytest.mark.parametrize(
    ("change", "saying"),
    [
        ({"redirect_uri": "http://127.0.0.1:8123/console/signed-in"}, "redirect_uri"),
        ({"client_id": "another-console"}, "another client_id"),
    ],
)
def test_a_code_is_refused_to_another_redirect_uri_or_client(
    issuer: RunningIssuer, change: dict[str, str], saying: str
) -> None:
    verifier = secrets.token_urlsafe(32)
    code, _ = sign_in(issuer.http, "sam", verifier)
    refused(exchange(issuer.http, code, verifier, **change), "invalid_grant", saying)


def test_an_unknown_code_is_refused(issuer: RunningIssuer) -> None:
    verifier = secrets.token_urlsafe(32)
    refused(exchange(issuer.http, "made-up", verifier), "invalid_grant", "unknown")


@pytest.mark.parametrize(
    ("change", "error", "saying"),
    [
        ({"code_verifier": None}, "invalid_request", "code_verifier is missing"),
        ({"code_verifier": "too-short"}, "invalid_request", "43 to 128 characters"),
        ({"grant_type": "client_credentials"}, "unsupported_grant_type", "authorization_code"),
        ({"client_secret": "s3cret"}, "invalid_client", "send no client secret"),
    ],
)
def test_a_malformed_token_request_is_refused_and_leaves_the_code(
    issuer: RunningIssuer, change: dict[str, str | None], error: str, saying: str
) -> None:
    verifier = secrets.token_urlsafe(32)
    code, _ = sign_in(issuer.http, "ada", verifier)
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT,
        "client_id": CLIENT,
        "code_verifier": verifier,
        **change,
    }
    answer = issuer.http.post("/token", data={k: v for k, v in form.items() if v is not None})
    refused(answer, error, saying)
    assert exchange(issuer.http, code, verifier).status_code == 200


def test_a_token_request_must_be_a_form(issuer: RunningIssuer) -> None:
    verifier = secrets.token_urlsafe(32)
    code, _ = sign_in(issuer.http, "ada", verifier)
    answer = issuer.http.post("/token", json={"code": code, "code_verifier": verifier})
    refused(answer, "invalid_request", "application/x-www-form-urlencoded")


def test_an_unknown_person_is_refused_with_a_page_and_no_code(issuer: RunningIssuer) -> None:
    asked = request(s256(secrets.token_urlsafe(32)))
    refused_page(issuer.http.get("/authorize/approve", params={**asked, "person": "eve"}), "person")
    refused_page(issuer.http.get("/authorize/approve", params=asked), "person")


@pytest.mark.parametrize("missing", PARAMETERS)
def test_an_authorization_request_missing_a_parameter_is_refused_with_a_page(
    issuer: RunningIssuer, missing: str
) -> None:
    asked = request(s256(secrets.token_urlsafe(32)), **{missing: None})
    refused_page(issuer.http.get("/authorize", params=asked), missing)
    refused_page(issuer.http.get("/authorize/approve", params={**asked, "person": "ada"}), missing)


@pytest.mark.parametrize(
    ("parameter", "value"),
    [
        ("redirect_uri", "https://console.example.org/signed-in"),
        ("redirect_uri", "javascript:alert(1)"),
        ("redirect_uri", "http://127.0.0.1:8123/signed-in#fragment"),
        ("redirect_uri", "http://127.0.0.1.example.org/signed-in"),
        ("response_type", "token"),
        ("scope", "profile"),
        ("scope", "openid admin"),
        ("code_challenge", "short"),
        ("code_challenge_method", "plain"),
    ],
)
def test_an_authorization_request_with_a_wrong_parameter_is_refused_with_a_page(
    issuer: RunningIssuer, parameter: str, value: str
) -> None:
    asked = request(s256(secrets.token_urlsafe(32)), **{parameter: value})
    refused_page(issuer.http.get("/authorize", params=asked), parameter)


def test_a_repeated_parameter_is_refused(issuer: RunningIssuer) -> None:
    asked = request(s256(secrets.token_urlsafe(32)))
    repeated = httpx.QueryParams(asked).add("redirect_uri", "http://127.0.0.1:9/elsewhere")
    refused_page(issuer.http.get("/authorize", params=repeated), "redirect_uri")


def test_s256_is_rfc_7636_appendix_b() -> None:
    verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"
    assert s256(verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"


def test_the_issuer_starts_beside_products_with_its_audience_and_lifetime(
    tmp_path: Path,
) -> None:
    product, port = free_port(), free_port()
    options = [f"--product=breg={product}", f"--issuer={port}", f"--issuer-key={tmp_path / 'k'}"]
    options += ["--audience=elsewhere", "--token-lifetime=600"]
    with issuer_process(tmp_path, *options) as (lines, _):
        url = f"http://127.0.0.1:{port}"
        assert lines == [f"breg http://127.0.0.1:{product}\n", f"issuer {url}\n"]
        assert httpx.get(f"http://127.0.0.1:{product}/_control/ledger").status_code == 200
        with httpx.Client(base_url=url, timeout=10) as http:
            verifier = secrets.token_urlsafe(32)
            code, _ = sign_in(http, "ada", verifier)
            body = exchange(http, code, verifier).json()
            access = verified(http, body["access_token"], "elsewhere", url)
    assert access["exp"] - access["iat"] == 600
    assert body["expires_in"] == 600


@pytest.mark.parametrize(
    ("options", "saying"),
    [
        (["--issuer=18000"], "--issuer PORT and --issuer-key PATH go together"),
        (["--product=breg=18000", "--audience=x"], "--audience and --token-lifetime"),
        (["--issuer=0", "--issuer-key=k"], "port must be 1 to 65535"),
        (["--issuer=18000", "--issuer-key=k", "--token-lifetime=0"], "must be positive"),
    ],
)
def test_the_issuers_options_are_checked(tmp_path: Path, options: list[str], saying: str) -> None:
    result = coordinator("stand-ins", *options, cwd=tmp_path)
    assert result.returncode == 2
    assert saying in result.stderr
    assert not (tmp_path / "k").exists()


def test_a_coordinator_accepts_the_access_tokens_and_its_policies_apply(
    issuer: RunningIssuer, services: Services
) -> None:
    auth = {
        "mode": "jwt",
        "issuer": issuer.url,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksUrl": f"{issuer.url}/jwks",
        "policies": [
            {
                "client": "case-portal",
                "scopes": ["coordinator.runs"],
                "workflows": ["timed-choice"],
                "actions": ["start", "read", "cancel"],
            },
            {"client": "registry-operators", "scopes": ["coordinator.operate"], "operator": True},
        ],
    }
    service = services(["timed-choice"], extra={"auth": auth})
    tokens = {}
    for person in PEOPLE:
        verifier = secrets.token_urlsafe(32)
        code, _ = sign_in(issuer.http, person, verifier)
        tokens[person] = exchange(issuer.http, code, verifier).json()

    def call(path: str, token: str, **kwargs: Any) -> httpx.Response:
        return service.http.request(
            "POST" if "json" in kwargs else "GET",
            path,
            headers={"Authorization": f"Bearer {token}"},
            **kwargs,
        )

    assert call("/v1/runs", tokens["sam"]["access_token"]).status_code == 200
    hold = {"json": {"reason": "checking the issuer"}}
    refusal = call("/v1/admission/hold", tokens["sam"]["access_token"], **hold)
    assert (refusal.status_code, refusal.json()["code"]) == (403, "auth.operator-required")
    assert call("/v1/admission/hold", tokens["ada"]["access_token"], **hold).status_code == 200
    assert call("/v1/admission/release", tokens["ada"]["access_token"], **hold).status_code == 200
    wrong = call("/v1/runs", tokens["ada"]["id_token"])  # for the console, not for the API
    assert (wrong.status_code, wrong.json()["code"]) == (401, "auth.wrong-audience")


def test_a_token_request_refused_before_its_body_arrived_leaves_the_connection_usable(
    issuer: RunningIssuer,
) -> None:
    """Clients write headers and body apart; a refusal sent in between (here: a JSON body)
    must not leave the connection unable to carry the next request (it timed out once)."""
    host, port = urlsplit(issuer.url).netloc.split(":")
    body = b'{"grant_type": "authorization_code"}'
    client = h11.Connection(h11.CLIENT)
    headers = [("Host", "test"), ("Content-Type", "application/json")]
    headers.append(("Content-Length", str(len(body))))
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(client.send(h11.Request(method="POST", target="/token", headers=headers)))
        time.sleep(0.2)  # the issuer has all it needs to refuse
        sock.sendall(client.send(h11.Data(data=body)) + client.send(h11.EndOfMessage()))
        assert h11_answer(sock, client) == 400
        client.start_next_cycle()
        request = h11.Request(method="GET", target="/jwks", headers=[("Host", "test")])
        sock.sendall(client.send(request) + client.send(h11.EndOfMessage()))
        assert h11_answer(sock, client) == 200
