"""The console's side of OpenID Connect: discovery, the authorization request, and the
exchange of a code for tokens (authorization code flow with PKCE, as a public client).

The issuer is the one ``auth`` trusts for the API, so the access token a person gets is
checked exactly as an API caller's is (:meth:`Authenticator.authenticate`) and acts under
the same policies. Discovery happens when someone first signs in, not at startup: an issuer
that is down stops sign-in, never the service; a failed read is tried again at most every
:data:`RETRY_DISCOVERY` seconds. Nothing the issuer sends is trusted before it is checked:
the discovery document must name the configured issuer exactly (OpenID Connect Discovery
§4.3), and the ID token must be for this console and carry the sign-in's nonce.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import TypeGuard
from urllib.parse import urlencode

import httpx

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.config import AuthConfig, ConsoleConfig, https_or_loopback
from registry_coordinator.http.auth import Authenticator
from registry_coordinator.http.problems import Problem

RETRY_DISCOVERY = 10.0


def challenge(verifier: str) -> str:
    """The S256 code challenge of a PKCE code verifier (RFC 7636 §4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def random_token() -> str:
    """A fresh unguessable value: 256 bits, URL-safe (also a valid PKCE verifier)."""
    return secrets.token_urlsafe(32)


def _url(value: object) -> TypeGuard[str]:
    """An endpoint the code and the PKCE verifier may be sent to: https, or loopback http."""
    return isinstance(value, str) and https_or_loopback(value)


@dataclass(frozen=True)
class Endpoints:
    authorization: str
    token: str


@dataclass(frozen=True)
class SignedIn:
    """What a completed sign-in gives: the access token to act with, who it names, and
    when it expires (seconds since the epoch)."""

    access_token: str
    subject: str
    expires_at: float


class Issuer:
    def __init__(self, auth: AuthConfig, console: ConsoleConfig, client: httpx.AsyncClient):
        self.auth = auth
        self.console = console
        self.client = client
        self._endpoints: Endpoints | None = None
        self._failure: str | None = None
        self._tried_at = -RETRY_DISCOVERY

    @property
    def enabled(self) -> bool:
        """Whether people sign in at all: not in auth mode none."""
        return self.auth.mode != "none"

    def state(self) -> str:
        """How sign-in stands, in words, for the console's health page."""
        if not self.enabled:
            return "no sign-in: auth mode none, every visitor is the local developer"
        if self.console.client_id is None:
            return "sign-in is not configured: set console.clientId"
        if self._endpoints is not None:
            return f"signing in at {self.auth.issuer} as client {self.console.client_id}"
        if self._failure is not None:
            return f"cannot read {self._discovery_url()}: {self._failure}"
        return f"{self.auth.issuer} is read when someone first signs in"

    def _discovery_url(self) -> str:
        assert self.auth.issuer is not None
        return self.auth.issuer.rstrip("/") + "/.well-known/openid-configuration"

    async def endpoints(self) -> Endpoints:
        """The issuer's authorization and token endpoints, read once from its discovery
        document; a 503 Problem while it cannot be read."""
        if self.console.client_id is None:
            raise Problem(
                503,
                "console.sign-in-unconfigured",
                "nobody can sign in: set console.clientId to the console's client id at "
                f"{self.auth.issuer}, then restart",
            )
        if self._endpoints is None and time.monotonic() - self._tried_at >= RETRY_DISCOVERY:
            self._tried_at = time.monotonic()
            try:
                self._endpoints = await self._discover()
                self._failure = None
            except (httpx.HTTPError, ValueError) as exc:
                self._failure = str(exc) or type(exc).__name__
        if self._endpoints is None:
            raise Problem(
                503,
                "console.issuer-unavailable",
                f"the issuer's discovery document {self._discovery_url()} cannot be used: "
                f"{self._failure}; try again in {RETRY_DISCOVERY:g} s",
            )
        return self._endpoints

    async def _discover(self) -> Endpoints:
        response = await self.client.get(self._discovery_url(), timeout=10)
        response.raise_for_status()
        document = response.json()
        if not isinstance(document, dict) or document.get("issuer") != self.auth.issuer:
            raise ValueError(f"it does not name the issuer {self.auth.issuer} exactly")
        methods = document.get("code_challenge_methods_supported")
        if isinstance(methods, list) and "S256" not in methods:
            raise ValueError("the issuer does not take PKCE code challenges by S256")
        authorization = document.get("authorization_endpoint")
        token = document.get("token_endpoint")
        if not (_url(authorization) and _url(token)):
            raise ValueError(
                "it names no authorization_endpoint and token_endpoint that are https "
                "(plain http only on loopback)"
            )
        return Endpoints(authorization, token)

    async def authorization_url(
        self, redirect_uri: str, state: str, nonce: str, verifier: str
    ) -> str:
        """Where to send the browser to sign in (RFC 6749 §4.1.1, RFC 7636 §4.3)."""
        endpoints = await self.endpoints()
        assert self.console.client_id is not None
        query = {
            "response_type": "code",
            "client_id": self.console.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self.console.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": challenge(verifier),
            "code_challenge_method": "S256",
        }
        separator = "&" if "?" in endpoints.authorization else "?"
        return endpoints.authorization + separator + urlencode(query)

    async def exchange(
        self, auth: Authenticator, code: str, redirect_uri: str, verifier: str, nonce: str
    ) -> SignedIn:
        """Trade an authorization code for tokens, and check them: the ID token is for this
        console and carries ``nonce``; the access token passes as an API caller's would."""
        endpoints = await self.endpoints()
        assert self.console.client_id is not None
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "client_id": self.console.client_id,
            "code_verifier": verifier,
        }
        try:
            response = await self.client.post(endpoints.token, data=form, timeout=10)
            answer: JSON = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise Problem(
                503,
                "console.issuer-unavailable",
                f"the issuer's token endpoint could not be used: {exc or type(exc).__name__}",
            ) from None
        if response.status_code != 200 or not isinstance(answer, dict):
            said = (
                answer.get("error_description") or answer.get("error")
                if isinstance(answer, dict)
                else None
            )
            raise Problem(
                400,
                "console.sign-in-failed",
                f"the issuer refused the sign-in ({response.status_code}: {said}); sign in again",
            )
        access, identity = answer.get("access_token"), answer.get("id_token")
        if not isinstance(access, str) or not isinstance(identity, str):
            raise Problem(
                400, "console.sign-in-failed", "the issuer sent no access token or ID token"
            )
        try:
            claims = await auth.verify(identity, self.console.client_id)
            if not isinstance(claims.get("sub"), str) or not claims["sub"]:
                raise Problem(400, "console.sign-in-failed", "the ID token names nobody (no sub)")
            if claims.get("nonce") != nonce:
                raise Problem(400, "console.sign-in-failed", "the ID token is not for this sign-in")
            access_claims = await auth.verify(access, self.auth.audience)
            if access_claims.get("sub") != claims.get("sub"):
                raise Problem(
                    400,
                    "console.sign-in-failed",
                    "the access token names someone other than the ID token",
                )
        except Problem as refused:
            if refused.code == "console.sign-in-failed":
                raise
            raise Problem(
                400,
                "console.sign-in-failed",
                f"the issuer's tokens did not check out: {refused.detail}",
            ) from None
        return SignedIn(access, str(claims.get("sub", "")), float(access_claims["exp"]))
