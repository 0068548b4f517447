"""Coordinator's service identities at the products it calls.

A connection authenticates either with a static bearer token or with OAuth 2
client credentials (client secret, or a private-key JWT assertion, RFC 7523), asking
for a token meant for the product's resource (RFC 8707 ``resource``), as the
Registry Stack products' token endpoints issue them.
Tokens are fetched only when a call is about to be sent, cached until shortly
before they expire, and fetched once however many calls wait for them — but for a call
that runs under Casework's task authority (:class:`TaskGrants`), whose token is had
anew, through the grant a person approved, for each sending.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx
import jwt
import trio

from registry_coordinator.config import Bearer, ClientCredentials, Identity, TaskAuthority
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
        """The Authorization header value for the next request ("" to send none)."""
        ...


class Anonymous:
    """No identity of its own (an external connection's public read): no credential is
    presented, and never a caller's."""

    async def authorization(self) -> str:
        return ""


class StaticBearer:
    def __init__(self, identity: Bearer) -> None:
        self._header = f"Bearer {identity.token}"

    async def authorization(self) -> str:
        return self._header


#: The grant types and token types of an RFC 8693 exchange.
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN = "urn:ietf:params:oauth:token-type:jwt"
ACCESS_TOKEN = "urn:ietf:params:oauth:token-type:access_token"
#: The one scope a bootstrap token asks Casework for: asserting a task grant.
ASSERT_GRANTS = "casework:grants:assert"


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
                ident = self.identity
                form = self.form("client_credentials", ident.scopes, ident.resource)
                body = await self.token(form)
                self._token, self._expires = _token_of(body, ident.token_url)
                self.fetched += 1
            return f"Bearer {self._token}"

    def form(
        self, grant_type: str, scopes: tuple[str, ...], resource: str | None
    ) -> dict[str, str]:
        """A token request's form: the grant, the client's own authentication (its secret,
        or a private-key JWT assertion), its scopes and its RFC 8707 resource."""
        ident = self.identity
        form = {"grant_type": grant_type, "client_id": ident.client_id}
        if ident.client_secret is not None:
            form["client_secret"] = ident.client_secret
        else:
            form["client_assertion_type"] = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
            form["client_assertion"] = self._assertion()
        if scopes:
            form["scope"] = " ".join(scopes)
        if resource:
            form["resource"] = resource
        return form

    async def token(self, form: dict[str, str]) -> dict[str, object]:
        """The token endpoint's answer to ``form``: IdentityUnavailable when it cannot be
        had now, IdentityRefused when the endpoint refused Coordinator's credentials."""
        url = self.identity.token_url
        try:
            response = await self.client.post(url, data=form)
        except httpx.HTTPError as exc:
            raise IdentityUnavailable(f"token endpoint {url}: {exc!r}") from None
        if response.status_code in (400, 401, 403):
            raise IdentityRefused(
                f"token endpoint {url} answered {response.status_code}: " + response.text[:200]
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != 200 or not isinstance(body, dict):
            raise IdentityUnavailable(
                f"token endpoint {url} answered {response.status_code} without a token"
            )
        return body

    def _assertion(self) -> str:
        ident = self.identity
        now = int(time.time())
        claims = {
            "iss": ident.client_id,
            "sub": ident.client_id,
            "aud": ident.assertion_audience or ident.token_url,
            "jti": uuid.uuid4().hex,
            "iat": now,
            "exp": now + 60,
        }
        headers = {"kid": ident.key_id} if ident.key_id else None
        assert ident.private_key is not None
        return jwt.encode(claims, ident.private_key, algorithm=ident.algorithm, headers=headers)


def _token_of(body: dict[str, object], url: str) -> tuple[str, float]:
    token, lifetime = body.get("access_token"), body.get("expires_in", 300)
    if not isinstance(token, str) or not isinstance(lifetime, int | float):
        raise IdentityUnavailable(f"token endpoint {url} answered without a token")
    return token, time.monotonic() + float(lifetime)


@dataclass(frozen=True)
class Grant:
    """An approval a person gave at Casework for one task: its id and its deadline (unix
    seconds). A reference, never a credential."""

    id: str
    expires_at: int


class TaskGrants:
    """Tokens had under Casework's task authority, one for each sending of a call: a
    bootstrap token for Casework, Casework's assertion of the grant, and that assertion
    exchanged (RFC 8693) for a token of the connection's resource and scopes. Nothing is
    cached: a grant may be withdrawn at any time, and a restart must ask again."""

    def __init__(self, oauth2: OAuth2Client) -> None:
        assert oauth2.identity.task_authority is not None
        self.oauth2 = oauth2
        self.authority = oauth2.identity.task_authority
        self.exchanged = 0  # tokens had under the authority, for tests

    async def authorization(self, grant: Grant) -> str:
        oauth2, authority = self.oauth2, self.authority
        if time.time() >= grant.expires_at:
            raise IdentityRefused(f"task grant {grant.id} has passed its deadline")
        bootstrap = await oauth2.token(
            oauth2.form("client_credentials", (ASSERT_GRANTS,), authority.bootstrap_resource)
        )
        token, _ = _token_of(bootstrap, oauth2.identity.token_url)
        assertion = await self._assertion(f"Bearer {token}", grant)
        ident = oauth2.identity
        form = oauth2.form(TOKEN_EXCHANGE, ident.scopes, ident.resource)
        form |= {
            "subject_token": assertion,
            "subject_token_type": JWT_TOKEN,
            "requested_token_type": ACCESS_TOKEN,
        }
        exchanged = await oauth2.token(form)
        wrong = exchange_problems(exchanged, ident.scopes)
        if wrong:
            raise IdentityRefused(f"the token exchange for grant {grant.id}: {wrong}")
        exchanged_token, _ = _token_of(exchanged, ident.token_url)
        self.exchanged += 1
        return f"Bearer {exchanged_token}"

    async def _assertion(self, bearer: str, grant: Grant) -> str:
        """Casework's signed assertion of ``grant``, checked before it is exchanged to be
        the one asked for (:func:`assertion_problems`)."""
        url = f"{self.authority.base_url}/v1/task-grants/{grant.id}/assertion"
        client = self.oauth2.client
        try:
            response = await client.post(url, headers={"Authorization": bearer})
        except httpx.HTTPError as exc:
            raise IdentityUnavailable(f"Casework's task grants at {url}: {exc!r}") from None
        if response.status_code in (408, 429) or response.status_code >= 500:
            raise IdentityUnavailable(f"Casework answered {response.status_code} for {url}")
        if response.status_code != 200:
            raise IdentityRefused(
                f"Casework refused to assert grant {grant.id} ({response.status_code})"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
        ident = self.oauth2.identity
        wrong = assertion_problems(
            body,
            grant,
            self.authority,
            ident.client_id,
            ident.resource or "",
            ident.scopes,
            int(time.time()),
        )
        if wrong:
            raise IdentityRefused(f"Casework's assertion of grant {grant.id}: {wrong}")
        assert isinstance(body, dict)
        return str(body["assertion"])


#: The signing algorithms an assertion of Casework's may name (never none, never a MAC).
ASSERTION_ALGORITHMS = frozenset({"EdDSA", "ES256", "ES384", "RS256", "RS384"})
#: The longest an assertion may live.
ASSERTION_LIFETIME = 60


def assertion_problems(
    body: object,
    grant: Grant,
    authority: TaskAuthority,
    client_id: str,
    resource: str,
    scopes: tuple[str, ...],
    now: int,
) -> str | None:
    """Why Casework's answer is not the assertion of ``grant`` Coordinator asked for (None
    when it is), as the platform's exchange client judges one before exchanging it: a
    closed ``{assertion, expiresAt, grantExpiresAt}``, the grant's own deadline, a compact
    JWT living at most a minute and not past the grant, signed with an asymmetric key it
    names, whose claims name this authority, the agent, this client, resource and scopes
    exactly, and the grant with its deadline. Its signature is the token endpoint's to
    check; nothing of it is said in the answer but which claim was wrong."""
    if not isinstance(body, dict) or set(body) != {"assertion", "expiresAt", "grantExpiresAt"}:
        return "the answer is not {assertion, expiresAt, grantExpiresAt}"
    jwt_text, expires = body["assertion"], body["expiresAt"]
    if body["grantExpiresAt"] != grant.expires_at:
        return "it names another deadline of the grant"
    if not isinstance(expires, int) or isinstance(expires, bool):
        return "its expiresAt is not a number of seconds"
    if not now < expires <= min(grant.expires_at, now + ASSERTION_LIFETIME):
        return "it has expired, or lives longer than a minute or than the grant"
    if not isinstance(jwt_text, str) or not 0 < len(jwt_text) <= 32768 or not jwt_text.isascii():
        return "the assertion is not a bounded JWT"
    try:
        header = jwt.get_unverified_header(jwt_text)
        claims = jwt.decode(jwt_text, options={"verify_signature": False})
    except jwt.PyJWTError:
        return "the assertion is not a compact JWT"
    if (
        header.get("alg") not in ASSERTION_ALGORITHMS
        or header.get("typ") != "JWT"
        or not isinstance(header.get("kid"), str)
        or not header["kid"]
    ):
        return "the assertion's header names no supported key and algorithm"
    expected = {
        "iss": authority.issuer,
        "sub": authority.subject,
        "aud": authority.exchange_audience,
        "exp": expires,
        "registry_actor_kind": "agent",
        "registry_grant_id": grant.id,
        "registry_grant_client": client_id,
        "registry_grant_resource": resource,
        "registry_grant_exp": grant.expires_at,
    }
    wrong = sorted(name for name, value in expected.items() if claims.get(name) != value)
    issued, start = claims.get("iat"), claims.get("nbf", now)
    if not isinstance(issued, int) or not now - ASSERTION_LIFETIME <= issued <= now:
        wrong.append("iat")
    if not isinstance(start, int) or start > now:
        wrong.append("nbf")
    if not isinstance(claims.get("jti"), str) or not claims["jti"]:
        wrong.append("jti")
    stated = str(claims.get("scope", "")).split(" ")
    if sorted(stated) != sorted(scopes):
        wrong.append("scope")
    return f"it names another {', '.join(wrong)}" if wrong else None


def exchange_problems(answer: Mapping[str, object], scopes: tuple[str, ...]) -> str | None:
    """Why a token exchange's answer is not the access token asked for: another issued
    token type, a token type other than Bearer, or fewer scopes than asked for."""
    if answer.get("issued_token_type") != ACCESS_TOKEN:
        return "it did not issue an access token"
    if str(answer.get("token_type", "")).lower() != "bearer":
        return "it did not issue a bearer token"
    granted = answer.get("scope")
    if granted is not None and not set(scopes) <= set(str(granted).split()):
        return "it granted fewer scopes than asked for"
    return None


def credentials(identity: Identity | None, client: httpx.AsyncClient) -> Credentials:
    if identity is None:
        return Anonymous()
    if isinstance(identity, Bearer):
        return StaticBearer(identity)
    return OAuth2Client(identity, client)


def task_grants(identity: Identity | None, client: httpx.AsyncClient) -> TaskGrants | None:
    """The task-grant authority of a connection's identity, if it names one."""
    if isinstance(identity, ClientCredentials) and identity.task_authority is not None:
        return TaskGrants(OAuth2Client(identity, client))
    return None
