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

from datetime import datetime, timedelta

from registry_coordinator.store.database import Database, Row

#: Bytes in a SHA-256 digest: what every key here is.
HASH_BYTES = 32


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


async def take_login(db: Database, login_hash: bytes) -> Row | None:
    """The sign-in (``state``, ``nonce``, ``verifier``, ``return_to``, ``expires_at``),
    deleted as it is read so that it is used once; None if there is none or it has
    expired (it is deleted either way)."""
    return await db.row("console_take_login", {"login_hash": _hashed(login_hash)})


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


async def session(db: Database, session_hash: bytes) -> Row | None:
    """The session (``access_token``, ``csrf``, ``subject``, ``expires_at``,
    ``created_at``), or None if there is none or it has expired: the browser signs in
    again."""
    return await db.row("console_live_session", {"session_hash": _hashed(session_hash)})


async def close_session(db: Database, session_hash: bytes) -> None:
    """Sign out: the session's cookie no longer names anything, whoever holds it."""
    await db.execute("console_close_session", {"session_hash": _hashed(session_hash)})
