"""Coordinator's service identities at the products it calls.

A connection authenticates either with a static bearer token or with OAuth 2
client credentials (client secret, or a private-key JWT assertion, RFC 7523).
Tokens are fetched only when a call is about to be sent, cached until shortly
before they expire, and fetched once however many calls wait for them.
"""

from __future__ import annotations

import time
import uuid
from typing import Protocol

import httpx
import jwt
import trio

from registry_coordinator.engine.config import Bearer, ClientCredentials, Identity
from registry_coordinator.errors import CoordinatorError, ExitCode

#: A token is renewed this long before the expiry its endpoint announced.
RENEW_BEFORE = 30.0


class IdentityUnavailable(CoordinatorError):
    """The token endpoint could not be reached: the call was not sent."""

    exit_code = ExitCode.UNAVAILABLE


class IdentityRefused(CoordinatorError):
    """The token endpoint refused Coordinator's credentials: an operator must fix them."""


class Credentials(Protocol):
    async def authorization(self) -> str:
        """The Authorization header value for the next request."""
        ...


class StaticBearer:
    def __init__(self, identity: Bearer) -> None:
        self._header = f"Bearer {identity.token}"

    async def authorization(self) -> str:
        return self._header


class OAuth2Client:
    def __init__(self, identity: ClientCredentials, client: httpx.AsyncClient) -> None:
        self.identity = identity
        self.client = client
        self._token: str | None = None
        self._expires = 0.0
        self._lock = trio.Lock()
        self.fetched = 0  # tokens fetched, for metrics and tests

    async def authorization(self) -> str:
        async with self._lock:
            if self._token is None or time.monotonic() >= self._expires - RENEW_BEFORE:
                await self._fetch()
            return f"Bearer {self._token}"

    async def _fetch(self) -> None:
        ident = self.identity
        form = {"grant_type": "client_credentials", "client_id": ident.client_id}
        if ident.scopes:
            form["scope"] = " ".join(ident.scopes)
        if ident.audience:
            form["audience"] = ident.audience
        if ident.client_secret is not None:
            form["client_secret"] = ident.client_secret
        else:
            form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            form["client_assertion"] = self._assertion()
        try:
            response = await self.client.post(ident.token_url, data=form)
        except httpx.HTTPError as exc:
            raise IdentityUnavailable(f"token endpoint {ident.token_url}: {exc!r}") from None
        if response.status_code in (400, 401, 403):
            raise IdentityRefused(
                f"token endpoint {ident.token_url} answered {response.status_code}: "
                + response.text[:200]
            )
        try:
            body = response.json()
            token, lifetime = body["access_token"], float(body.get("expires_in", 300))
        except (ValueError, KeyError, TypeError):
            raise IdentityUnavailable(
                f"token endpoint {ident.token_url} answered {response.status_code} without a token"
            ) from None
        self._token = str(token)
        self._expires = time.monotonic() + lifetime
        self.fetched += 1

    def _assertion(self) -> str:
        ident = self.identity
        now = int(time.time())
        claims = {
            "iss": ident.client_id,
            "sub": ident.client_id,
            "aud": ident.token_url,
            "jti": uuid.uuid4().hex,
            "iat": now,
            "exp": now + 60,
        }
        headers = {"kid": ident.key_id} if ident.key_id else None
        assert ident.private_key is not None
        return jwt.encode(claims, ident.private_key, algorithm=ident.algorithm, headers=headers)


def credentials(identity: Identity, client: httpx.AsyncClient) -> Credentials:
    if isinstance(identity, Bearer):
        return StaticBearer(identity)
    return OAuth2Client(identity, client)
