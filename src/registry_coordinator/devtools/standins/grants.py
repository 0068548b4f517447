"""Task grants as the stand-ins share them: a stand-in Casework asserts a grant a person
approved, and the stand-in IdP exchanges the assertion for a token that carries it.

Real Casework signs its assertions with its own key, which the token endpoint that
exchanges them trusts. The stand-ins, which may run in separate processes, derive one
Ed25519 development key from a shared secret (``STANDIN_ASSERTION_KEY``) and sign with
EdDSA; the claims are those Casework's assertions carry and Coordinator checks before it
exchanges one: the issuer, the agent the grant names, the exchange's audience, the client,
resource and scopes it acts with, and the grant itself with its deadline.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

#: The grant type and token types of an RFC 8693 exchange.
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN = "urn:ietf:params:oauth:token-type:jwt"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
#: What the stand-in Casework's assertions name: configure a connection's taskAuthority
#: with these (issuer, subject, exchangeAudience).
ISSUER = "urn:stand-in:casework"
AGENT = "coordinator-agent"
EXCHANGE_AUDIENCE = "urn:stand-in:idp"
#: An assertion lives this long.
LIFETIME = 60


def _key() -> Ed25519PrivateKey:
    secret = os.environ.get("STANDIN_ASSERTION_KEY", "stand-in-task-assertion-key")
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(secret.encode()).digest())


def assertion(grant: str, deadline: int, client: str, resource: str, scope: str) -> tuple[str, int]:
    """Casework's signed assertion that ``grant`` (until ``deadline``) lets ``client``
    act as the agent on ``resource`` with ``scope``, and when it expires."""
    now = int(time.time())
    expires = min(now + LIFETIME, deadline)
    claims = {
        "iss": ISSUER,
        "sub": AGENT,
        "aud": EXCHANGE_AUDIENCE,
        "iat": now,
        "exp": expires,
        "jti": str(uuid.uuid4()),
        "registry_actor_kind": "agent",
        "scope": scope,
        "registry_grant_id": grant,
        "registry_grant_client": client,
        "registry_grant_resource": resource,
        "registry_grant_exp": deadline,
    }
    signed = jwt.encode(claims, _key(), algorithm="EdDSA", headers={"typ": "JWT", "kid": "dev"})
    return signed, expires


def exchanged(form: dict[str, str], client: str) -> str | None:
    """The grant a token-exchange request's assertion proves, for ``client``, for the
    resource and scopes it asks; None when it proves none."""
    if form.get("subject_token_type") != JWT_TOKEN:
        return None
    try:
        claims = jwt.decode(
            form.get("subject_token", ""),
            _key().public_key(),
            algorithms=["EdDSA"],
            audience=EXCHANGE_AUDIENCE,
        )
    except jwt.PyJWTError:
        return None
    if (
        claims.get("iss") != ISSUER
        or claims.get("registry_grant_client") != client
        or claims.get("registry_grant_resource") != form.get("resource")
        or set(str(claims.get("scope", "")).split()) != set(form.get("scope", "").split())
    ):
        return None
    grant = claims.get("registry_grant_id")
    return grant if isinstance(grant, str) else None
