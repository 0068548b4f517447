"""A stand-in OAuth 2 token endpoint that the stand-in products trust.

It knows one client, Coordinator, authenticated by a secret (``client_secret_post``)
or by a private-key JWT assertion (RFC 7523) whose audience is the token URL, and
issues bearer tokens for the client-credentials grant, and for the token-exchange
grant (RFC 8693) of a stand-in Casework's task-grant assertion (:mod:`.grants`): that
token carries the grant, which the stand-in Scheduling requires of a booking. Each
request's grant type, scopes and RFC 8707 ``resource`` go in its ledger (never the
secret or an assertion), so tests can tell which resource a token was asked for.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import parse_qs

import jwt
from quart import request

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.devtools.standins import grants
from registry_coordinator.devtools.standins.server import (
    Answer,
    Call,
    Client,
    Issued,
    Route,
    StandIn,
    Tokens,
)

#: The form fields a token request's ledger entry keeps.
NOTED = ("grant_type", "client_id", "scope", "resource", "subject_token_type")


class IdP(StandIn):
    product = "idp"

    def __init__(self, tokens: Tokens, client: Client | None) -> None:
        self.client = client
        self.issued = 0
        super().__init__(tokens)

    def routes(self) -> list[Route]:
        return [Route("POST", "/oauth2/token", self.issue, open=True, json=False)]

    def noted(self, entry: dict[str, JSON], call: Call) -> None:
        form = _form(call.raw)
        entry["form"] = {k: form[k] for k in NOTED if k in form}

    async def issue(self, call: Call) -> Answer:
        return self._issue(_form(call.raw), request.url.split("?")[0])

    def _issue(self, form: dict[str, str], url: str) -> Answer:
        """Client credentials, or a token exchange, for a client authenticated by
        client_secret_post or private_key_jwt."""
        client = self.client
        grant_type = form.get("grant_type")
        if (
            client is None
            or grant_type not in ("client_credentials", grants.TOKEN_EXCHANGE)
            or form.get("client_id") != client.client_id
        ):
            return Answer(400, {"error": "invalid_client"})
        if client.secret is not None:
            if not hmac.compare_digest(form.get("client_secret", ""), client.secret):
                return Answer(401, {"error": "invalid_client"})
        else:
            try:
                claims = jwt.decode(
                    form.get("client_assertion", ""),
                    client.public_key or "",
                    algorithms=["RS256", "ES256", "EdDSA"],
                    audience=url,
                )
            except jwt.PyJWTError as exc:
                return Answer(401, {"error": "invalid_client", "error_description": str(exc)})
            if claims.get("iss") != client.client_id or claims.get("sub") != client.client_id:
                return Answer(401, {"error": "invalid_client"})
        grant = None
        if grant_type == grants.TOKEN_EXCHANGE:
            grant = grants.exchanged(form, client.client_id)
            if grant is None:
                return Answer(400, {"error": "invalid_grant"})
        self.issued += 1
        token = (
            f"tok-{self.issued}-"
            + hashlib.sha256(repr(sorted(form.items())).encode()).hexdigest()[:16]
        )
        scope = form.get("scope", "")
        self.tokens.issued[token] = Issued(
            time.monotonic() + client.lifetime, scope, form.get("resource"), grant
        )
        self.ledger.applied["tokens"] += 1
        answer = {
            "access_token": token,
            "token_type": "Bearer",
            "expires_in": client.lifetime,
            "scope": scope,
        }
        if grant is not None:
            answer["issued_token_type"] = grants.ACCESS_TOKEN
        return Answer(200, answer)


def _form(raw: bytes) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(raw.decode(errors="replace")).items()}
