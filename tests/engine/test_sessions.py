"""The console's sign-in state in PostgreSQL: a sign-in is taken once, nothing expired is
returned and the next write purges it, a closed session is gone, and a key that is not
a SHA-256 is refused, saying how to hash it."""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta

import pytest

from registry_coordinator.store import sessions
from registry_coordinator.store.database import sync_connection
from tests.support import database

LIFETIME = timedelta(minutes=10)


def key() -> bytes:
    """A cookie value's hash, as the console computes it."""
    return hashlib.sha256(secrets.token_bytes(32)).digest()


def kept(dsn: str, table: str) -> int:
    with sync_connection(dsn) as conn:
        row = conn.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
    assert row is not None
    return int(row["n"])


@pytest.mark.trio
async def test_a_sign_in_is_taken_once(dsn: str) -> None:
    login = key()
    async with database(dsn) as db:
        await sessions.begin_login(db, login, "st-1", "no-1", "ve-1", "/console/runs", LIFETIME)
        first = await sessions.take_login(db, login)
        again = await sessions.take_login(db, login)
        unknown = await sessions.take_login(db, key())
    assert first is not None
    assert (first.state, first.nonce, first.verifier, first.return_to) == (
        "st-1",
        "no-1",
        "ve-1",
        "/console/runs",
    )
    assert first.expires_at > datetime.now(UTC)
    assert again is None and unknown is None
    assert kept(dsn, "console_logins") == 0


@pytest.mark.trio
async def test_an_expired_sign_in_is_not_returned_and_the_next_one_purges_it(dsn: str) -> None:
    expired, abandoned, live = key(), key(), key()
    async with database(dsn) as db:
        await sessions.begin_login(db, expired, "s", "n", "v", "/console", -LIFETIME)
        assert await sessions.take_login(db, expired) is None
        await sessions.begin_login(db, abandoned, "s", "n", "v", "/console", -LIFETIME)
        assert kept(dsn, "console_logins") == 1
        await sessions.begin_login(db, live, "s", "n", "v", "/console", LIFETIME)
        assert kept(dsn, "console_logins") == 1
        assert await sessions.take_login(db, live) is not None


@pytest.mark.trio
async def test_a_session_is_returned_until_it_expires_or_is_closed(dsn: str) -> None:
    signed_in, other = key(), key()
    until = datetime.now(UTC) + timedelta(hours=1)
    async with database(dsn) as db:
        await sessions.open_session(db, signed_in, "token-1", "csrf-1", "alice", until)
        await sessions.open_session(db, other, "token-2", "csrf-2", "bob", until)
        found = await sessions.session(db, signed_in)
        await sessions.close_session(db, signed_in)
        closed = await sessions.session(db, signed_in)
        still = await sessions.session(db, other)
    assert found is not None
    assert (found.access_token, found.csrf, found.subject) == (
        "token-1",
        "csrf-1",
        "alice",
    )
    assert found.expires_at == until and found.created_at <= datetime.now(UTC)
    assert closed is None
    assert still is not None and still.subject == "bob"


@pytest.mark.trio
async def test_an_expired_session_is_not_returned_and_the_next_one_purges_it(dsn: str) -> None:
    expired, live = key(), key()
    past = datetime.now(UTC) - timedelta(seconds=1)
    async with database(dsn) as db:
        await sessions.open_session(db, expired, "token-1", "csrf-1", "alice", past)
        assert await sessions.session(db, expired) is None
        assert kept(dsn, "console_sessions") == 1
        await sessions.open_session(db, live, "token-2", "csrf-2", "alice", past + LIFETIME)
        assert kept(dsn, "console_sessions") == 1
        assert await sessions.session(db, live) is not None


@pytest.mark.trio
async def test_a_cookie_value_passed_unhashed_is_refused_naming_the_fix(dsn: str) -> None:
    async with database(dsn) as db:
        with pytest.raises(ValueError, match="SHA-256 of the cookie's value, not 43 bytes"):
            await sessions.session(db, secrets.token_urlsafe(32).encode())
        with pytest.raises(ValueError, match="hash the cookie value"):
            await sessions.begin_login(db, b"short", "s", "n", "v", "/console", LIFETIME)
    assert kept(dsn, "console_logins") == 0
