"""The operator console's sign-in state in PostgreSQL: sign-ins under way, and sessions.

A sign-in (OpenID Connect's authorization code flow with PKCE) is kept from the moment
the browser is sent to the issuer until it comes back, and is taken once: a second use
of the same login cookie finds nothing. A session holds the bearer token the console
acts with, so the browser holds only a random cookie value, never a token.

Rows are keyed by the SHA-256 of a cookie's value, which the caller computes: the
database never holds a value a browser could present. Nothing expired is ever returned,
and expired rows are purged by the statement that writes the next row of their table,
so neither table grows with sign-ins abandoned half way or sessions never closed. All
instants are the database's clock, the one ``expires_at`` is compared with.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Self

from registry_coordinator.store.database import Database, Row

#: Bytes in a SHA-256 digest: what every key here is.
HASH_BYTES = 32


@dataclass(frozen=True)
class Login:
    """A sign-in under way (``console_take_login``): what the browser's return from the
    issuer is checked against and completed with."""

    state: str
    nonce: str
    verifier: str  # PKCE's code verifier
    return_to: str  # the console's page to go back to once signed in
    expires_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            state=row["state"],
            nonce=row["nonce"],
            verifier=row["verifier"],
            return_to=row["return_to"],
            expires_at=row["expires_at"],
        )


@dataclass(frozen=True)
class Session:
    """A signed-in session (``console_live_session``): the bearer token the console acts
    with, the CSRF token its forms carry, and who signed in."""

    access_token: str
    csrf: str
    subject: str
    expires_at: datetime
    created_at: datetime

    @classmethod
    def from_row(cls, row: Row) -> Self:
        return cls(
            access_token=row["access_token"],
            csrf=row["csrf"],
            subject=row["subject"],
            expires_at=row["expires_at"],
            created_at=row["created_at"],
        )


def _hashed(value: bytes) -> bytes:
    """``value`` if it can be a cookie value's SHA-256; a caller passing the value itself
    (or any other length) is a defect, refused before it reaches the database."""
    if len(value) != HASH_BYTES:
        raise ValueError(
            f"a console key is the {HASH_BYTES}-byte SHA-256 of the cookie's value, not "
            f"{len(value)} bytes: hash the cookie value (hashlib.sha256(value).digest())"
        )
    return value


async def begin_login(
    db: Database,
    login_hash: bytes,
    state: str,
    nonce: str,
    verifier: str,
    return_to: str,
    lifetime: timedelta,
) -> None:
    """Keep a sign-in for ``lifetime`` (the time a person may take at the issuer's page),
    purging expired ones in the same statement."""
    await db.execute(
        "console_begin_login",
        {
            "login_hash": _hashed(login_hash),
            "state": state,
            "nonce": nonce,
            "verifier": verifier,
            "return_to": return_to,
            "lifetime": lifetime,
        },
    )


async def take_login(db: Database, login_hash: bytes) -> Login | None:
    """The sign-in, deleted as it is read so that it is used once; None if there is none
    or it has expired (it is deleted either way)."""
    row = await db.row("console_take_login", {"login_hash": _hashed(login_hash)})
    return None if row is None else Login.from_row(row)


async def open_session(
    db: Database,
    session_hash: bytes,
    token: str,
    csrf: str,
    subject: str,
    expires_at: datetime,
) -> None:
    """Keep a signed-in session until ``expires_at`` (the token's own expiry, at the
    latest), purging expired sessions in the same statement."""
    await db.execute(
        "console_open_session",
        {
            "session_hash": _hashed(session_hash),
            "access_token": token,
            "csrf": csrf,
            "subject": subject,
            "expires_at": expires_at,
        },
    )


async def session(db: Database, session_hash: bytes) -> Session | None:
    """The session, or None if there is none or it has expired: the browser signs in
    again."""
    row = await db.row("console_live_session", {"session_hash": _hashed(session_hash)})
    return None if row is None else Session.from_row(row)


async def close_session(db: Database, session_hash: bytes) -> None:
    """Sign out: the session's cookie no longer names anything, whoever holds it."""
    await db.execute("console_close_session", {"session_hash": _hashed(session_hash)})
