"""Caller authentication and policies.

Callers present OAuth 2 bearer JWTs (RS256, ES256 or EdDSA) from the configured
issuer. Their signatures are checked against the issuer's JWKS (a file, or an
https URL fetched with httpx). Issuer, audience, expiry and a maximum lifetime
are enforced.

The JWKS is re-read on a schedule (``auth.jwksRefresh``, sooner when the URL's
Cache-Control max-age says so; a file is parsed again when its content changed),
so a key the issuer removes is refused without a restart. A token naming a key id
not seen yet also causes a read, at most once every 30 seconds, so forged key ids
cannot make Coordinator hammer the issuer. When reads fail, the last good set is
used for ``auth.jwksMaxStale``; after that tokens are refused with 503 until a
read succeeds, and ``/ready`` says so.

A caller is its client id; what it may do comes from the configured policies
whose client matches and whose scopes the token carries: start and see runs of
some workflows, cancel its own runs, or — with ``operator: true`` — everything.
Being allowed to start a workflow grants nothing at the products it calls.
An action is recorded with the caller's actor: the client, or — for a token whose
``sub`` names a person signed in through a client, as the console's do — that
person and the client.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import jwt
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import format_instant
from registry_coordinator.config import ACTIONS, MINIMUM_JWKS_REFRESH, AuthConfig, Policy
from registry_coordinator.http.problems import Problem

ALGORITHMS = ("RS256", "ES256", "EdDSA")
REFRESH_AT_MOST_EVERY = 30.0
LOCAL_DEVELOPER = "local-developer"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Caller:
    client: str
    policies: tuple[Policy, ...]
    subject: str | None = None  # the token's sub: the person, when one signed in at a client

    @property
    def actor(self) -> str:
        """Who took an action, as the run's history records it: the client, or the person
        and the client they signed in through (a console's token names its client)."""
        if self.subject is None or self.subject == self.client:
            return self.client
        return f"{self.subject} ({self.client})"

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

    def workflows_for(self, action: str) -> frozenset[str] | None:
        """The workflows whose runs this caller may take ``action`` on (None: all), the
        rule of :meth:`may` for a listing, which cannot ask run by run."""
        assert action in ACTIONS, action
        if self.operator:
            return None
        granted = [p.workflows for p in self.policies if action in p.actions]
        if any("*" in workflows for workflows in granted):
            return None
        return frozenset().union(*granted)

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
    """The issuer's signing keys, kept current so that a key the issuer withdraws stops
    working without a restart.

    :meth:`run` re-reads the set on a schedule. A token naming a key id the set lacks
    causes a read too, at most once every 30 s, so that a new key works at once but
    forged key ids cannot make Coordinator hammer the issuer. While reads fail the last
    good set is used until it is ``jwksMaxStale`` old; after that every token is refused
    (503) rather than checked against keys the issuer may have withdrawn meanwhile.
    """

    def __init__(self, config: AuthConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self.client = client
        self.source = str(config.jwks_file or config.jwks_url)
        self._keys: dict[str, jwt.PyJWK] = {}
        self._document: bytes | None = None  # the good set as read: parsed again if changed
        self._good_at: float | None = None  # monotonic: when a read last gave a good set
        self._good_wall: datetime | None = None  # the same instant, to show
        self._failure: str | None = None  # why the latest read failed; None if it did not
        self._read_at = -REFRESH_AT_MOST_EVERY
        self._lock = trio.Lock()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read the set, report started, then re-read it every ``jwksRefresh`` (sooner when
        a URL's Cache-Control max-age says so) until cancelled."""
        interval = await self._refresh()
        task_status.started()
        while True:
            await trio.sleep(interval)
            interval = await self._refresh()

    async def key(self, key_id: str) -> jwt.PyJWK | None:
        """The key named ``key_id``, or None when the set lacks it; raises a 503 Problem
        when no set was read recently enough to be trusted."""
        if key_id not in self._keys or not self._trusted():
            async with self._lock:
                if time.monotonic() - self._read_at >= REFRESH_AT_MOST_EVERY:
                    await self._read()
        if not self._trusted():
            raise Problem(
                503,
                "auth.keys-unavailable",
                "the issuer's key set could not be read for longer than allowed; try again later",
            )
        return self._keys.get(key_id)

    async def check(self) -> dict[str, JSON]:
        """Read the set now, once, and say how it stands (``coordinator doctor``)."""
        await self._refresh()
        return self.readiness()

    def readiness(self) -> dict[str, JSON]:
        """The key set's part of /ready: ok while a set with keys was read recently enough
        to be trusted (never before the first good read)."""
        trusted = self._trusted()
        if not trusted:
            detail = self._unavailable()
        elif self._failure is not None:
            assert self._good_wall is not None
            until = format_instant(self._good_wall + self.config.jwks_max_stale)
            detail = (
                f"cannot read {self.source}: {self._failure}; "
                f"the last good set is used until {until}"
            )
        else:
            detail = f"{len(self._keys)} keys from {self.source}"
        return {
            "ok": trusted and bool(self._keys),
            "keys": len(self._keys),
            "refreshedAt": format_instant(self._good_wall) if self._good_wall else None,
            "detail": detail,
        }

    def _trusted(self) -> bool:
        return (
            self._good_at is not None
            and time.monotonic() - self._good_at <= self.config.jwks_max_stale.total_seconds()
        )

    def _unavailable(self) -> str:
        failure = f": {self._failure}" if self._failure else ""
        if self._good_wall is None:
            return f"no key set has been read from {self.source} yet{failure}"
        since = format_instant(self._good_wall)
        return f"the key set from {self.source} was last read at {since}, too long ago{failure}"

    async def _refresh(self) -> float:
        async with self._lock:
            return await self._read()

    async def _read(self) -> float:
        """Read the set once, keeping the last good one if that fails; the seconds until the
        next scheduled read."""
        self._read_at = time.monotonic()
        interval = self.config.jwks_refresh.total_seconds()
        try:
            document, fresh_for = await self._fetch()
            if document != self._document:
                self._keys = _parse(document)
                self._document = document
                kids = ", ".join(sorted(self._keys)) or "none"
                log.info("read %d keys from %s: %s", len(self._keys), self.source, kids)
        except (OSError, ValueError, httpx.HTTPError) as exc:
            self._failure = _why(exc)
            log.warning("cannot read the issuer's key set from %s: %s", self.source, self._failure)
            return interval
        self._good_at, self._good_wall = self._read_at, datetime.now(UTC).replace(microsecond=0)
        self._failure = None
        if fresh_for is None:
            return interval
        return max(MINIMUM_JWKS_REFRESH.total_seconds(), min(interval, fresh_for))

    async def _fetch(self) -> tuple[bytes, float | None]:
        """The set as published, and for a URL how much longer its answer may be used."""
        if self.config.jwks_file is not None:
            return await trio.Path(self.config.jwks_file).read_bytes(), None
        assert self.config.jwks_url is not None
        response = await self.client.get(self.config.jwks_url)
        response.raise_for_status()
        return response.content, _fresh_for(response.headers)


def _parse(document: bytes) -> dict[str, jwt.PyJWK]:
    """The usable keys with a key id in a JWKS; ValueError when it is not a JWKS. A set
    without usable keys is taken as the issuer's word: every token is then refused."""
    data = json.loads(document)
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError('not a JWKS: expected {"keys": [...]}')
    keys = {}
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        try:
            key = jwt.PyJWK(entry)
        except jwt.PyJWTError:
            continue  # a kind of key this build does not verify with
        if key.key_id:
            keys[key.key_id] = key
    return keys


def _fresh_for(headers: httpx.Headers) -> float | None:
    """How many more seconds an answer may be used: its Cache-Control max-age less its
    Age (RFC 9111); None without a max-age."""
    for directive in headers.get("Cache-Control", "").split(","):
        name, _, value = directive.strip().partition("=")
        value = value.strip('"')
        if name.lower() == "max-age" and value.isdigit():
            age = headers.get("Age", "")
            return int(value) - (int(age) if age.isdigit() else 0)
    return None


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"the issuer answered {exc.response.status_code}"
    return str(exc) or type(exc).__name__


class Authenticator:
    def __init__(self, config: AuthConfig, client: httpx.AsyncClient) -> None:
        self.config = config
        self.keys = KeySet(config, client)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Keep the issuer's key set current (:meth:`KeySet.run`); auth mode none has none,
        and returns once started."""
        if self.config.mode == "none":
            task_status.started()
            return
        await self.keys.run(task_status=task_status)

    def readiness(self) -> dict[str, JSON]:
        """The key set's part of /ready (:meth:`KeySet.readiness`); always ok in mode none."""
        if self.config.mode == "none":
            return {"ok": True, "keys": 0, "refreshedAt": None, "detail": "auth mode none"}
        return self.keys.readiness()

    async def verify(self, token: str, audience: str | None) -> dict[str, JSON]:
        """The claims of a JWT the configured issuer signed for ``audience``, checked:
        algorithm, key, signature, issuer, audience, expiry; a 401 Problem saying which
        check failed otherwise. Access tokens and the console's ID tokens both pass here."""
        config = self.config
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
                audience=audience,
                issuer=config.issuer,
                options={"require": ["exp", "iat", "iss", "aud"]},
                leeway=30,
            )
        except jwt.ExpiredSignatureError:
            raise Problem(401, "auth.expired", "the token has expired") from None
        except jwt.InvalidAudienceError:
            raise Problem(401, "auth.wrong-audience", f"the token is not for {audience}") from None
        except jwt.InvalidIssuerError:
            raise Problem(
                401, "auth.wrong-issuer", f"the token was not issued by {config.issuer}"
            ) from None
        except jwt.PyJWTError as exc:
            raise Problem(401, "auth.invalid-token", f"the token is not valid: {exc}") from None
        return claims

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
        claims = await self.verify(header[7:].strip(), config.audience)
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
        subject = claims.get("sub")
        return Caller(client, policies, subject if isinstance(subject, str) else None)


def _scopes(claims: dict[str, JSON]) -> frozenset[str]:
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
