"""A stand-in OpenID Connect issuer: sign-in for the console in the demo and the tests.

It serves the authorization code flow with PKCE (RFC 6749 section 4.1, RFC 7636 with
S256 only, OpenID Connect Core) for public clients, on loopback at
``http://127.0.0.1:PORT`` — that string, without a trailing slash, is its issuer URL.
There are no passwords: the sign-in page lists the people below, one button each, and
the one pressed is signed in.

========  ======================  =======================  ==================================
person    client (token's         scopes                   name (ID token's ``name``)
          ``client_id``)
========  ======================  =======================  ==================================
``ada``   ``registry-operators``  ``coordinator.operate``  Ada Lindqvist (operator)
``bo``    ``registry-operators``  ``coordinator.operate``  Bo Jensen (second operator)
``sam``   ``case-portal``         ``coordinator.runs``     Sam Okafor (caseworker supervisor)
========  ======================  =======================  ==================================

The clients and scopes are those of the policies in config/coordinator.example.yaml and
the demo's configuration, so ada and bo act as operators (two, for four eyes) and sam
as the case portal.

Invariants:

- Tokens are signed with the Ed25519 development key of :mod:`..http.auth`, loaded once
  at start; ``/jwks`` serves the set :func:`~..http.auth.development_key` wrote beside
  it then, so a Coordinator configured with ``auth.jwksFile`` (that file) or
  ``auth.jwksUrl`` (``/jwks``) verifies every token this issuer signs.
- An authorization request is checked whole before anything is shown, and a bad one is
  answered with a 400 page naming the parameter: the issuer never redirects to a
  ``redirect_uri`` it has not accepted, and it accepts only http(s) URLs on 127.0.0.1
  or localhost.
- A code is random, lives 60 s, is bound to the request's client, redirect URI, nonce
  and code challenge and to the person, and is spent by its first presentation at the
  token endpoint, whether that succeeds or not: a second presentation is refused. (The
  tokens are JWTs, so those issued for a reused code cannot be revoked.)
- Every token endpoint answer, refusals included, carries ``Cache-Control: no-store``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import jwt
import trio
from quart import Response, request
from quart_trio import QuartTrio

from registry_coordinator.devtools.standins import serve_app
from registry_coordinator.http.auth import development_key, jwks_path
from registry_coordinator.http.requests import read_whole_body

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
CODE_LIFETIME = 60.0  # seconds
TOKEN_LIFETIME = 3600  # seconds, unless the issuer is told otherwise
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost"})
#: RFC 7636 section 4.1: 43 to 128 unreserved characters.
VERIFIER = re.compile(r"[A-Za-z0-9\-._~]{43,128}")
#: BASE64URL(SHA-256(verifier)) without padding is always 43 characters.
CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
#: RFC 6749 appendix A: client ids, states and nonces are visible ASCII.
VISIBLE = re.compile(r"[\x20-\x7e]+")


@dataclass(frozen=True)
class Person:
    login: str
    client: str
    scopes: tuple[str, ...]
    name: str


PEOPLE = {
    person.login: person
    for person in (
        Person("ada", "registry-operators", ("coordinator.operate",), "Ada Lindqvist (operator)"),
        Person("bo", "registry-operators", ("coordinator.operate",), "Bo Jensen (second operator)"),
        Person("sam", "case-portal", ("coordinator.runs",), "Sam Okafor (caseworker supervisor)"),
    )
}
SCOPES = ("openid", "profile", *sorted({s for p in PEOPLE.values() for s in p.scopes}))


def s256(verifier: str) -> str:
    """The S256 code challenge of a code verifier (RFC 7636 section 4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


class BadRequest(Exception):
    """An authorization request the issuer will not act on, and the parameter at fault."""

    def __init__(self, parameter: str, problem: str) -> None:
        super().__init__(f"{parameter} {problem}")
        self.parameter = parameter
        self.problem = problem


class TokenRefused(Exception):
    """A token request refused with an RFC 6749 section 5.2 error code."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error = error
        self.status = status


def _one(parameters: Mapping[str, list[str]], name: str) -> str:
    """A parameter that must be present, once (RFC 6749 section 3.1), and not empty."""
    given = parameters.get(name, [])
    if not given or not given[0]:
        raise BadRequest(name, "is missing")
    if len(given) > 1:
        raise BadRequest(name, "is given more than once; send it once")
    return given[0]


def _visible(parameters: Mapping[str, list[str]], name: str) -> str:
    value = _one(parameters, name)
    if not VISIBLE.fullmatch(value):
        raise BadRequest(name, "must be visible ASCII characters only")
    return value


@dataclass(frozen=True)
class Authorization:
    """An authorization request that passed every check: what a code is bound to."""

    client_id: str
    redirect_uri: str
    scope: str
    state: str
    nonce: str
    code_challenge: str

    @classmethod
    def read(cls, parameters: Mapping[str, list[str]]) -> Authorization:
        """The request in ``parameters``; raises :class:`BadRequest` for the first
        parameter that is missing, repeated or wrong. The client and its redirect URI
        come first: until they are accepted nothing may be sent to the redirect URI."""
        client_id = _visible(parameters, "client_id")
        redirect_uri = _one(parameters, "redirect_uri")
        _check_redirect(redirect_uri)
        if (response_type := _one(parameters, "response_type")) != "code":
            raise BadRequest("response_type", f"is {response_type!r}: it must be code")
        scope = _one(parameters, "scope")
        unknown = sorted(set(scope.split()) - set(SCOPES))
        if unknown:
            raise BadRequest(
                "scope", f"names {', '.join(unknown)}: ask only for {', '.join(SCOPES)}"
            )
        if "openid" not in scope.split():
            raise BadRequest("scope", "must include openid: this is an OpenID Connect issuer")
        state = _visible(parameters, "state")
        nonce = _visible(parameters, "nonce")
        challenge = _one(parameters, "code_challenge")
        if not CHALLENGE.fullmatch(challenge):
            raise BadRequest(
                "code_challenge",
                "must be the 43-character base64url SHA-256 of the code verifier (RFC 7636 S256)",
            )
        if (method := _one(parameters, "code_challenge_method")) != "S256":
            raise BadRequest("code_challenge_method", f"is {method!r}: it must be S256")
        return cls(client_id, redirect_uri, scope, state, nonce, challenge)

    def fields(self) -> dict[str, str]:
        """The request's parameters, as the sign-in page's forms carry them to approval."""
        return {
            "response_type": "code",
            "client_id": self.client_id,
            "redirect_uri": self.redirect_uri,
            "scope": self.scope,
            "state": self.state,
            "nonce": self.nonce,
            "code_challenge": self.code_challenge,
            "code_challenge_method": "S256",
        }


def _check_redirect(uri: str) -> None:
    try:
        parts = urlsplit(uri)
        hostname = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        raise BadRequest("redirect_uri", f"{uri!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or hostname not in LOOPBACK_HOSTS:
        raise BadRequest(
            "redirect_uri",
            f"{uri!r} is not an http(s) URL on 127.0.0.1 or localhost, "
            "the only redirect URIs this stand-in accepts",
        )
    if parts.fragment or parts.username is not None:
        raise BadRequest("redirect_uri", f"{uri!r} must have no fragment and no user name")


def _redirect(uri: str, **parameters: str) -> str:
    """``uri`` with ``parameters`` added to its query (RFC 6749 section 4.1.2)."""
    parts = urlsplit(uri)
    query = urlencode([*parse_qsl(parts.query, keep_blank_values=True), *parameters.items()])
    return urlunsplit(parts._replace(query=query))


@dataclass
class Grant:
    """An issued code: the request it answers, who approved it, until when it is good."""

    authorization: Authorization
    person: Person
    expires: float  # time.monotonic()
    spent: bool = False


class StandInIssuer:
    """The issuer's app and its codes (in memory, lost on restart)."""

    def __init__(self, port: int, key_path: Path, audience: str, lifetime: int) -> None:
        if not 0 < port < 65536:
            raise ValueError(f"the issuer's port must be 1 to 65535 (its URL names it), not {port}")
        if lifetime <= 0:
            raise ValueError(f"the issuer's token lifetime must be positive, not {lifetime} s")
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.audience = audience
        self.lifetime = lifetime
        self.key, self.key_id, _ = development_key(key_path)
        self.jwks = jwks_path(key_path).read_bytes()
        self.codes: dict[str, Grant] = {}
        self.app = self._build()

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the issuer URL once listening."""
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_app, self.app, HOST, self.port)
            task_status.started(self.url)

    def discovery(self) -> dict[str, Any]:
        """OpenID Connect Discovery 1.0 section 3, for what this issuer does."""
        return {
            "issuer": self.url,
            "authorization_endpoint": f"{self.url}/authorize",
            "token_endpoint": f"{self.url}/token",
            "jwks_uri": f"{self.url}/jwks",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code"],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["EdDSA"],
            "subject_types_supported": ["public"],
            "scopes_supported": list(SCOPES),
            "token_endpoint_auth_methods_supported": ["none"],
            "claims_supported": ["iss", "aud", "sub", "exp", "iat", "nonce", "name"],
        }

    def _build(self) -> QuartTrio:
        app = QuartTrio("standin-issuer")
        app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
        app.before_request(read_whole_body)  # a refused token request keeps its connection

        @app.route("/.well-known/openid-configuration", methods=["GET"])
        async def discovery() -> Response:
            return Response(json.dumps(self.discovery()), content_type="application/json")

        @app.route("/jwks", methods=["GET"])
        async def jwks() -> Response:
            return Response(self.jwks, content_type="application/jwk-set+json")

        @app.route("/authorize", methods=["GET"])
        async def authorize() -> Response:
            try:
                authorization = Authorization.read(request.args.to_dict(flat=False))
            except BadRequest as refused:
                return _page(400, "Sign-in request refused", _refusal(refused))
            return _page(200, "Sign in to Registry Coordinator", self._sign_in(authorization))

        @app.route("/authorize/approve", methods=["GET"])
        async def approve() -> Response:
            parameters = request.args.to_dict(flat=False)
            try:
                authorization = Authorization.read(parameters)
                login = _one(parameters, "person")
                person = PEOPLE.get(login)
                if person is None:
                    raise BadRequest("person", f"{login!r} is not one of {', '.join(PEOPLE)}")
            except BadRequest as refused:
                return _page(400, "Sign-in request refused", _refusal(refused))
            code = self._issue_code(authorization, person)
            location = _redirect(authorization.redirect_uri, code=code, state=authorization.state)
            return Response(
                "", status=303, headers={"Location": location, "Cache-Control": "no-store"}
            )

        @app.route("/token", methods=["POST"])
        async def token() -> Response:
            try:
                answer = self._exchange(await self._token_form())
            except TokenRefused as refused:
                body = {"error": refused.error, "error_description": str(refused)}
                log.info("refused a token request: %s: %s", refused.error, refused)
                return _no_store(refused.status, body)
            return _no_store(200, answer)

        return app

    def _sign_in(self, authorization: Authorization) -> str:
        hidden = "".join(
            f'<input type="hidden" name="{name}" value="{escape(value)}">'
            for name, value in authorization.fields().items()
        )
        people = "".join(
            f'<li><form method="get" action="/authorize/approve">{hidden}'
            f'<input type="hidden" name="person" value="{p.login}">'
            f"<p><strong>{escape(p.name)}</strong>: client {p.client}, "
            f"scopes {' '.join(p.scopes)}</p>"
            f'<button type="submit">Sign in as {p.login}</button></form></li>'
            for p in PEOPLE.values()
        )
        return (
            f"<p><strong>{escape(authorization.client_id)}</strong> asks who you are, and will "
            f"receive the answer at {escape(authorization.redirect_uri)}.</p>"
            f"<p>This is the stand-in issuer at {self.url}, for development: there are no "
            f"passwords. Choose whom to sign in as.</p><ul>{people}</ul>"
        )

    def _issue_code(self, authorization: Authorization, person: Person) -> str:
        now = time.monotonic()
        self.codes = {code: g for code, g in self.codes.items() if g.expires > now}
        code = secrets.token_urlsafe(32)
        self.codes[code] = Grant(authorization, person, now + CODE_LIFETIME)
        log.info("issued a code for %s to client %s", person.login, authorization.client_id)
        return code

    async def _token_form(self) -> Mapping[str, list[str]]:
        if request.mimetype != "application/x-www-form-urlencoded":
            raise TokenRefused(
                "invalid_request", "send the token request as application/x-www-form-urlencoded"
            )
        form = (await request.form).to_dict(flat=False)
        if "client_secret" in form or "Authorization" in request.headers:
            raise TokenRefused(
                "invalid_client",
                "clients of this issuer are public (token_endpoint_auth_method none): "
                "send no client secret",
                401,
            )
        return form

    def _exchange(self, form: Mapping[str, list[str]]) -> dict[str, Any]:
        """The tokens for an authorization code, or :class:`TokenRefused` saying why not."""
        try:
            grant_type = _one(form, "grant_type")
            code, redirect_uri, client_id, verifier = (
                _one(form, name) for name in ("code", "redirect_uri", "client_id", "code_verifier")
            )
        except BadRequest as missing:
            raise TokenRefused("invalid_request", str(missing)) from None
        if grant_type != "authorization_code":
            raise TokenRefused(
                "unsupported_grant_type", f"grant_type {grant_type!r}: only authorization_code"
            )
        if not VERIFIER.fullmatch(verifier):
            raise TokenRefused(
                "invalid_request",
                "code_verifier must be 43 to 128 characters of A-Z a-z 0-9 - . _ ~ (RFC 7636)",
            )
        grant = self.codes.get(code)
        if grant is None:
            raise TokenRefused("invalid_grant", "the code is unknown: sign in again")
        if grant.spent:
            raise TokenRefused("invalid_grant", "the code was already used: sign in again")
        grant.spent = True
        if grant.expires <= time.monotonic():
            raise TokenRefused("invalid_grant", "the code has expired: sign in again")
        authorization = grant.authorization
        if client_id != authorization.client_id:
            raise TokenRefused("invalid_grant", "the code was issued to another client_id")
        if redirect_uri != authorization.redirect_uri:
            raise TokenRefused(
                "invalid_grant", "redirect_uri is not the one the code was issued for"
            )
        if not hmac.compare_digest(s256(verifier), authorization.code_challenge):
            raise TokenRefused(
                "invalid_grant", "code_verifier does not match the code_challenge (S256)"
            )
        person = grant.person
        log.info("issued tokens for %s to client %s", person.login, client_id)
        return {
            "access_token": self._sign(
                self.audience,
                person,
                client_id=person.client,
                scope=" ".join(person.scopes),
                jti=uuid.uuid4().hex,
            ),
            "id_token": self._sign(client_id, person, nonce=authorization.nonce, name=person.name),
            "token_type": "Bearer",
            "expires_in": self.lifetime,
            "scope": " ".join(person.scopes),
        }

    def _sign(self, audience: str, person: Person, **claims: str) -> str:
        """A JWT about ``person`` for ``audience``, living the token lifetime."""
        now = int(time.time())
        body = {
            "iss": self.url,
            "aud": audience,
            "sub": person.login,
            "iat": now,
            "exp": now + self.lifetime,
            **claims,
        }
        return jwt.encode(body, self.key, algorithm="EdDSA", headers={"kid": self.key_id})


def _refusal(refused: BadRequest) -> str:
    return (
        f"<p>The parameter <code>{refused.parameter}</code> {escape(refused.problem)}.</p>"
        "<p>Nothing was sent back to the application. Start the sign-in again from it.</p>"
    )


def _page(status: int, title: str, body: str) -> Response:
    """A page with no script, no style and no framing allowed."""
    document = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title></head><body><main><h1>{title}</h1>{body}</main></body></html>"
    )
    headers = {
        "Content-Security-Policy": "default-src 'none'; base-uri 'none'; frame-ancestors 'none'",
        "Cache-Control": "no-store",
    }
    return Response(
        document, status=status, content_type="text/html; charset=utf-8", headers=headers
    )


def _no_store(status: int, body: dict[str, Any]) -> Response:
    """A token endpoint answer (RFC 6749 section 5.1: never cached)."""
    headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
    return Response(
        json.dumps(body), status=status, content_type="application/json", headers=headers
    )
