"""Callers of the API with tokens signed here with real keys (Ed25519, RSA and P-256) whose
public halves are in a JWKS file the service is configured with, the policies they are
judged by, and a request made with one."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER
from tests.support.processes import Service

#: The signing keys by key id, with their algorithms: made once per test process.
KEYS: dict[str, tuple[str, Any]] = {
    "ed": ("EdDSA", Ed25519PrivateKey.generate()),
    "rsa": ("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
    "ec": ("ES256", ec.generate_private_key(ec.SECP256R1())),
}


#: Which callers may do what: the policies of the services these tokens call.
POLICIES = [
    {
        "client": "case-portal",
        "scopes": ["coordinator.runs"],
        "workflows": ["timed-choice"],
        "actions": ["start", "read", "cancel"],
    },
    {
        "client": "other-portal",
        "scopes": ["coordinator.runs"],
        "workflows": ["*"],
        "actions": ["start", "read"],
    },
    {
        "client": "case-portal",
        "scopes": ["coordinator.deadlines"],
        "workflows": ["deadline"],
        "actions": ["start", "read"],
    },
    {"client": "registry-operators", "scopes": ["coordinator.operate"], "operator": True},
]


def jwt_auth(directory: Path) -> dict[str, Any]:
    """A service's ``auth`` that trusts the tokens :func:`token` signs, judged by
    :data:`POLICIES` (the key set written in ``directory``)."""
    return {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "jwksFile": str(jwks(directory)),
        "maxLifetime": "PT1H",
        "policies": POLICIES,
    }


def jwks(directory: Path) -> Path:
    """The public halves of :data:`KEYS`, written as ``jwks.json`` in ``directory``."""
    entries = []
    for kid, (algorithm, key) in KEYS.items():
        public = jwt.get_algorithm_by_name(algorithm).to_jwk(key.public_key(), as_dict=True)
        entries.append({**public, "kid": kid, "alg": algorithm, "use": "sig"})
    path = directory / "jwks.json"
    path.write_text(json.dumps({"keys": entries}))
    return path


def token(
    client: str,
    scopes: str = "coordinator.runs",
    *,
    kid: str = "ed",
    key: Any = None,
    **claims: Any,
) -> str:
    """A token for ``client`` with ``scopes``, signed with the key ``kid`` (or with ``key``
    under that key id), its ``claims`` over the usual ones."""
    algorithm, signing = KEYS[kid]
    now = int(time.time())
    body = {
        "iss": DEVELOPMENT_ISSUER,
        "aud": DEVELOPMENT_AUDIENCE,
        "client_id": client,
        "scope": scopes,
        "iat": now,
        "exp": now + 300,
        "jti": uuid.uuid4().hex,
        **claims,
    }
    return jwt.encode(body, key or signing, algorithm=algorithm, headers={"kid": kid})


def call(service: Service, method: str, path: str, bearer: str | None, **kwargs: Any) -> Any:
    """``method path`` at the service, with ``bearer`` as its token if given."""
    headers = kwargs.pop("headers", {})
    if bearer is not None:
        headers["Authorization"] = f"Bearer {bearer}"
    return service.http.request(method, path, headers=headers, **kwargs)
