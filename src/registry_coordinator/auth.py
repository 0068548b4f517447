"""Caller authentication and policies.

Callers present OAuth 2 bearer JWTs (RS256, ES256 or EdDSA) from the configured
issuer. Their signatures are checked against the issuer's JWKS (a file, or an
https URL fetched with httpx), re-read when a token names a key id not seen yet —
at most once every 30 seconds, so forged key ids cannot make Coordinator hammer
the issuer. Issuer, audience, expiry and a maximum lifetime are enforced.

A caller is its client id; what it may do comes from the configured policies
whose client matches and whose scopes the token carries: start and see runs of
some workflows, cancel its own runs, or — with ``operator: true`` — everything.
Being allowed to start a workflow grants nothing at the products it calls.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .config import ACTIONS, AuthConfig, Policy
from .problems import Problem

ALGORITHMS = ("RS256", "ES256", "EdDSA")
REFRESH_AT_MOST_EVERY = 30.0
LOCAL_DEVELOPER = "local-developer"


@dataclass(frozen=True)
class Caller:
    client: str
    policies: tuple[Policy, ...]

    @property
    def operator(self) -> bool:
        return any(p.operator for p in self.policies)

    def may(self, action: str, workflow: str | None = None) -> bool:
        assert action in ACTIONS, action
        if self.operator:
            return True
        return any(
            action in p.actions
            and (workflow is None or "*" in p.workflows or workflow in p.workflows)
            for p in self.policies
        )

    def require(self, action: str, workflow: str | None = None) -> None:
        if not self.may(action, workflow):
            what = f"{action} {workflow}" if workflow else action
            raise Problem(
                403, "auth.forbidden", f"client {self.client} has no policy that allows: {what}"
            )

    def require_operator(self) -> None:
        if not self.operator:
            raise Problem(403, "auth.operator-required", f"client {self.client} is not an operator")


class KeySet:
    """The issuer's signing keys, re-read when a token names an unknown key id."""

    def __init__(self, config: AuthConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self.client = client
        self._keys: dict[str, jwt.PyJWK] = {}
        self._read_at = -REFRESH_AT_MOST_EVERY
        self._lock = trio.Lock()

    async def key(self, key_id: str) -> jwt.PyJWK | None:
        async with self._lock:
            if (
                key_id not in self._keys
                and time.monotonic() - self._read_at >= REFRESH_AT_MOST_EVERY
            ):
                await self._read()
            return self._keys.get(key_id)

    async def _read(self) -> None:
        self._read_at = time.monotonic()
        try:
            if self.config.jwks_file is not None:
                text = await trio.Path(self.config.jwks_file).read_text()
                data: Any = json.loads(text)
            else:
                assert self.config.jwks_url is not None
                response = await self.client.get(self.config.jwks_url)
                response.raise_for_status()
                data = response.json()
            keys = jwt.PyJWKSet.from_dict(data).keys
        except (OSError, ValueError, httpx.HTTPError, jwt.PyJWKSetError):
            return  # keep the keys we had; the token is refused as unknown-key
        self._keys = {k.key_id: k for k in keys if k.key_id}


class Authenticator:
    def __init__(self, config: AuthConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self.keys = KeySet(config, client)

    async def authenticate(self, header: str | None) -> Caller:
        config = self.config
        if config.mode == "none":
            return Caller(
                LOCAL_DEVELOPER,
                (Policy(LOCAL_DEVELOPER, frozenset(), frozenset(), frozenset(), True),),
            )
        if not header or not header.startswith("Bearer "):
            raise Problem(
                401,
                "auth.missing-token",
                "send Authorization: Bearer <token> from the configured issuer",
            )
        token = header[7:].strip()
        try:
            unverified = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Problem(401, "auth.invalid-token", "the token is not a JWT") from None
        algorithm, key_id = unverified.get("alg"), unverified.get("kid")
        if algorithm not in ALGORITHMS:
            raise Problem(
                401, "auth.invalid-token", f"tokens must be signed with {', '.join(ALGORITHMS)}"
            )
        key = await self.keys.key(str(key_id)) if key_id else None
        if key is None:
            raise Problem(
                401, "auth.unknown-key", "the token's key id is not in the issuer's key set"
            )
        if key.algorithm_name != algorithm:
            raise Problem(
                401,
                "auth.invalid-token",
                f"the token says {algorithm}, but its key {key_id} is for {key.algorithm_name}",
            )
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=config.audience,
                issuer=config.issuer,
                options={"require": ["exp", "iat", "iss", "aud"]},
                leeway=30,
            )
        except jwt.ExpiredSignatureError:
            raise Problem(401, "auth.expired", "the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Problem(
                401, "auth.wrong-audience", f"the token is not for {config.audience}"
            ) from None
        except jwt.InvalidIssuerError:
            raise Problem(
                401, "auth.wrong-issuer", f"the token was not issued by {config.issuer}"
            ) from None
        except jwt.PyJWTError as exc:
            raise Problem(401, "auth.invalid-token", f"the token is not valid: {exc}") from None
        lifetime = float(claims["exp"]) - float(claims["iat"])
        if lifetime > config.max_lifetime.total_seconds():
            raise Problem(
                401,
                "auth.lifetime-too-long",
                f"tokens may live at most {config.max_lifetime.total_seconds():g} s",
            )
        client = claims.get("client_id") or claims.get("azp") or claims.get("sub")
        if not isinstance(client, str) or not client:
            raise Problem(401, "auth.invalid-token", "the token names no client")
        scopes = _scopes(claims)
        policies = tuple(p for p in config.policies if p.client == client and p.scopes <= scopes)
        return Caller(client, policies)


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    scope = claims.get("scope", claims.get("scp", ""))
    if isinstance(scope, str):
        return frozenset(scope.split())
    if isinstance(scope, list):
        return frozenset(s for s in scope if isinstance(s, str))
    return frozenset()


# --- development tokens (coordinator token) ------------------------------------------------

DEVELOPMENT_ISSUER = "http://localhost/coordinator-development"
DEVELOPMENT_AUDIENCE = "registry-coordinator"


def jwks_path(key_path: Path) -> Path:
    """Where the public half of a development key is published: beside it."""
    return key_path.with_name(key_path.stem + ".jwks.json")


def development_key(key_path: Path) -> tuple[Ed25519PrivateKey, str, bool]:
    """The Ed25519 development key at ``key_path`` and its key id; created (with its JWKS
    beside it) when missing. For the demo and tests only: never a production issuer."""
    created = not key_path.exists()
    if created:
        key_path.parent.mkdir(parents=True, exist_ok=True)
        fresh = Ed25519PrivateKey.generate()
        pem = fresh.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        descriptor = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(pem)
    loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"{key_path} is not an Ed25519 private key")
    raw = loaded.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    key_id = hashlib.sha256(raw).hexdigest()[:16]
    public = {
        "kty": "OKP",
        "crv": "Ed25519",
        "alg": "EdDSA",
        "use": "sig",
        "kid": key_id,
        "x": base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
    jwks_path(key_path).write_text(json.dumps({"keys": [public]}, indent=2) + "\n")
    return loaded, key_id, created


def mint(
    key_path: Path,
    client: str,
    scopes: list[str],
    lifetime: float,
    issuer: str = DEVELOPMENT_ISSUER,
    audience: str = DEVELOPMENT_AUDIENCE,
) -> str:
    """A short-lived token signed by the development key."""
    key, key_id, _ = development_key(key_path)
    now = int(time.time())
    claims = {
        "iss": issuer,
        "aud": audience,
        "sub": client,
        "client_id": client,
        "scope": " ".join(scopes),
        "iat": now,
        "exp": now + int(lifetime),
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": key_id})
