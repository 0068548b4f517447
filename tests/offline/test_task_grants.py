"""Casework's task-grant assertions, judged before Coordinator exchanges one for a token.

As the platform's exchange client judges them (``crates/registry-platform-httputil/src/
client/exchange_authorization.rs`` at ``1126b1dee9c40c97be35ac5bb02afcc6711cb96b``,
``validate_assertion``, and the Rust coordinator's ``tests/scheduling_adapter.rs`` at
``93c16cbc6ceb98c5274fe98a1167215201f7b753``, which refuses an assertion minted for another
resource before any exchange): each claim a real assertion binds is changed in turn, and
each change is refused; the one assertion that binds them all is taken.
"""

from __future__ import annotations

import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.config import TaskAuthority
from registry_coordinator.engine.identity import (
    ACCESS_TOKEN,
    Grant,
    assertion_problems,
    exchange_problems,
)

NOW = int(time.time())
GRANT = Grant("6f1c2a4e-0b5f-4c3a-9e21-5a6b7c8d9e01", NOW + 600)
AUTHORITY = TaskAuthority(
    "https://casework.example.test",
    "https://casework.example.test/issuer",
    "coordinator-agent",
    "https://issuer.example.test",
    "urn:example:casework",
)
CLIENT, RESOURCE, SCOPES = "registry-coordinator", "urn:example:scheduling", ("appointments:book",)
KEY = Ed25519PrivateKey.generate()


def claims(**changed: Any) -> dict[str, Any]:
    found = {
        "iss": AUTHORITY.issuer,
        "sub": AUTHORITY.subject,
        "aud": AUTHORITY.exchange_audience,
        "iat": NOW,
        "exp": NOW + 60,
        "jti": "a1",
        "scope": " ".join(SCOPES),
        "registry_actor_kind": "agent",
        "registry_grant_id": GRANT.id,
        "registry_grant_client": CLIENT,
        "registry_grant_resource": RESOURCE,
        "registry_grant_exp": GRANT.expires_at,
    }
    found.update(changed)
    return {name: value for name, value in found.items() if value is not None}


def answer(
    signed: dict[str, Any] | None = None, headers: dict[str, str] | None = None, **body: Any
) -> dict[str, Any]:
    header = {"typ": "JWT", "kid": "casework-1", **(headers or {})}
    token = jwt.encode(signed or claims(), KEY, algorithm="EdDSA", headers=header)
    return {"assertion": token, "expiresAt": NOW + 60, "grantExpiresAt": GRANT.expires_at, **body}


def problems(body: object) -> str | None:
    return assertion_problems(body, GRANT, AUTHORITY, CLIENT, RESOURCE, SCOPES, NOW)


def test_the_assertion_that_binds_everything_is_taken() -> None:
    assert problems(answer()) is None


@pytest.mark.parametrize(
    ("claim", "value"),
    [
        ("iss", "https://elsewhere.test"),
        ("sub", "another-agent"),
        ("aud", "urn:example:other-issuer"),
        ("exp", NOW + 59),
        ("registry_actor_kind", "human"),
        ("registry_grant_id", "0f8c2a51-6d3e-4b7a-9c10-2e5f7a8b9c0d"),
        ("registry_grant_client", "another-client"),
        ("registry_grant_resource", "urn:example:other"),
        ("registry_grant_exp", GRANT.expires_at + 1),
        ("iat", NOW + 5),
        ("iat", NOW - 61),
        ("nbf", NOW + 5),
        ("jti", None),
        ("scope", "appointments:book appointments:cancel"),
        ("scope", ""),
    ],
    ids=lambda value: value if isinstance(value, str) else "changed",  # stable across workers
)
def test_an_assertion_binding_anything_else_is_refused(claim: str, value: Any) -> None:
    said = problems(answer(claims(**{claim: value})))
    assert said is not None and claim in said
    assert GRANT.id not in said and "casework-1" not in said  # nothing of it is repeated


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"grantExpiresAt": GRANT.expires_at + 60}, "another deadline of the grant"),
        ({"expiresAt": NOW}, "has expired"),
        ({"expiresAt": NOW + 61}, "lives longer than a minute"),
        ({"extra": True}, "is not {assertion, expiresAt, grantExpiresAt}"),
        ({"assertion": "not.a.jwt"}, "not a compact JWT"),
    ],
)
def test_an_answer_that_is_not_a_bounded_assertion_is_refused(
    body: dict[str, Any], said: str
) -> None:
    found = problems(answer(**body))
    assert found is not None and said in found


def test_an_assertion_outliving_its_grant_is_refused() -> None:
    short = Grant(GRANT.id, NOW + 30)
    body = answer(claims(registry_grant_exp=short.expires_at))
    body["grantExpiresAt"] = short.expires_at
    said = assertion_problems(body, short, AUTHORITY, CLIENT, RESOURCE, SCOPES, NOW)
    assert said is not None and "longer than a minute or than the grant" in said


@pytest.mark.parametrize("header", [{"alg": "HS256"}, {"kid": ""}, {"typ": "at+jwt"}])
def test_an_assertion_not_signed_with_a_named_asymmetric_key_is_refused(
    header: dict[str, str],
) -> None:
    if header.get("alg") == "HS256":
        token = jwt.encode(
            claims(), "a shared secret of thirty-two bytes", algorithm="HS256", headers={"kid": "k"}
        )
        body = {"assertion": token, "expiresAt": NOW + 60, "grantExpiresAt": GRANT.expires_at}
    else:
        body = answer(headers=header)
    said = problems(body)
    assert said is not None and "header" in said


@pytest.mark.parametrize(
    ("exchanged", "said"),
    [
        ({"issued_token_type": "urn:ietf:params:oauth:token-type:jwt"}, "access token"),
        ({"token_type": "DPoP"}, "bearer token"),
        ({"scope": "appointments:read"}, "fewer scopes"),
    ],
)
def test_an_exchange_that_issues_anything_but_the_token_asked_for_is_refused(
    exchanged: dict[str, str], said: str
) -> None:
    good = {"issued_token_type": ACCESS_TOKEN, "token_type": "Bearer", "scope": SCOPES[0]}
    assert exchange_problems(good, SCOPES) is None
    found = exchange_problems({**good, **exchanged}, SCOPES)
    assert found is not None and said in found
