"""Following Casework's result feed, killed between recording a page and moving the cursor.

A follower records each entry of a page as a delivery, then moves the connection's cursor
past them. Should it stop in between — the cursor's statement never run, or run with its
answer lost — the next pass reads the same page again: every entry is kept once (by its
event id), and the cursor ends where the feed ends. Against the stand-in Casework on
loopback and a real PostgreSQL, the cursor's statement failed by
:class:`tests.support.interleave.Failing`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import trio

from registry_coordinator import store
from registry_coordinator.authoring.catalog import builtin_catalog
from registry_coordinator.config import load_config
from registry_coordinator.devtools.standins import Tokens
from registry_coordinator.devtools.standins.casework import Casework
from registry_coordinator.engine.after_commit import AfterCommit
from registry_coordinator.engine.calls import open_products
from registry_coordinator.engine.feeds import Follower
from registry_coordinator.engine.sleepers import Sleepers
from registry_coordinator.engine.timers import Timer
from registry_coordinator.engine.workflows import Workflows
from registry_coordinator.observability.metrics import Metrics
from registry_coordinator.store.database import Database, Unavailable, sync_connection
from tests.support import (
    PARAMETERS,
    STAFF_TOKEN,
    STANDIN_TOKEN,
    Failing,
    connection,
    database,
    free_port,
    write_config,
)

REVIEW = builtin_catalog().products["casework"].results["review-decision"]


@asynccontextmanager
async def following(
    dsn: str, tmp_path: Path
) -> AsyncIterator[tuple[Database, Casework, Follower, httpx.AsyncClient]]:
    """A migrated database, a stand-in Casework on loopback, the follower of the feed of
    a connection bound to it, and a client that asks Casework for reviews."""
    port = free_port()
    casework = Casework(Tokens(STANDIN_TOKEN, STAFF_TOKEN))
    bound = {"reviews": connection("casework", port)}
    config = load_config(write_config(tmp_path, dsn, ["await-review"], connections=bound))
    headers = {
        "Authorization": f"Bearer {STANDIN_TOKEN}",
        "Registry-Casework-Profile": PARAMETERS["casework"]["profile"],
    }
    async with (
        database(dsn) as db,
        trio.open_nursery() as nursery,
        open_products(config.connections) as (products, _),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as client,
    ):
        await nursery.start(casework.serve, "127.0.0.1", port)
        sleepers = Sleepers(
            db, Workflows([]), "holder:1", timedelta(seconds=30), AfterCommit(Metrics())
        )
        timer = Timer(db, timedelta(seconds=60), sleepers)
        yield db, casework, Follower(db, products["reviews"], REVIEW, timer), client
        nursery.cancel_scope.cancel()


async def settled(casework: Casework, client: httpx.AsyncClient, count: int) -> list[str]:
    """``count`` reviews asked for and settled at Casework; their request ids."""
    ids = []
    for n in range(count):
        subject = {
            "source": "applications-registry",
            "type": "application",
            "id": f"application-{len(casework.reviews) + n}",
            "version": "1",
            "digest": "sha256:" + "0" * 64,
        }
        body = {
            "kind": "application-review",
            "subject": subject,
            "requesterReference": "test",
            "context": {"strategy": "submitted", "snapshot": {}},
        }
        created = await client.post(
            "/v1/review-requests", json=body, headers={"Idempotency-Key": f"k-{subject['id']}"}
        )
        assert created.status_code == 201, created.text
        request_id = created.json()["requestId"]
        casework.settle(casework.reviews[request_id], "approved", {})
        ids.append(request_id)
    return ids


def kept(dsn: str) -> list[str]:
    """The keys of the deliveries kept, one row each."""
    with sync_connection(dsn) as conn:
        rows = conn.execute("SELECT key FROM deliveries ORDER BY key").fetchall()
    return [r["key"] for r in rows]


@pytest.mark.trio
@pytest.mark.parametrize("lost", ["before", "after"])
async def test_a_page_recorded_but_its_cursor_not_moved_is_read_again_once(
    dsn: str, tmp_path: Path, lost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_TOKEN", STANDIN_TOKEN)
    async with following(dsn, tmp_path) as (db, casework, follower, client):
        first = await settled(casework, client, 3)
        failing = Failing(db, "move_feed")
        if lost == "before":
            failing.failing_before = 1  # the cursor's statement never ran
        else:
            failing.failing_after = 1  # it committed, and its answer was lost
        interrupted = Follower(failing, follower.product, follower.result, follower.timer)
        with pytest.raises(Unavailable):
            await interrupted.follow()
        assert kept(dsn) == sorted(first)  # the page's entries, recorded before the cursor
        await follower.follow()  # the next pass: the same page again, or the rest of the feed
        assert kept(dsn) == sorted(first)
        ends = casework.feed[-1]["eventId"]
        assert await store.feed_cursor(db, "reviews") == ends
        later = await settled(casework, client, 2)
        await follower.follow()
        assert kept(dsn) == sorted(first + later)
        assert await store.feed_cursor(db, "reviews") == casework.feed[-1]["eventId"]
