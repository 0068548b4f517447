"""Result feeds: following a product's list of completions, one cursor per connection.

A product that lists completed results on a feed (Casework's ``GET /v1/review-results``,
per a result's ``delivery.feed`` in the catalog) is read by one follower per connection:
every ``feedPoll``, page after page from the connection's cursor until the feed has no
more. Each entry is recorded as a delivery, once per event id (``deliveries``), which
wakes every run waiting for its key — so one page read wakes every run it names, where
each of them would otherwise read its own result at its slow poll. The woken runs then
read their results from the product, as after any delivery.

The cursor is kept in the database (``feed_cursors``), and moved on only after the
page's entries are recorded: a follower killed in between reads the page again, and its
entries are duplicates. Several processes may follow one feed: each moves the cursor
only from where it found it (compare and set), and a page two of them read is recorded
once. A cursor the product no longer knows (Casework's 410 ``review.result-expired``)
starts the feed again from its beginning, deduplicated as ever.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlencode

import trio

from registry_coordinator import store
from registry_coordinator.authoring.canonical import JSON, UnusableJson, strict_json
from registry_coordinator.authoring.catalog import Feed, Result, builtin_catalog
from registry_coordinator.engine.backoff import DATABASE_OUTAGE
from registry_coordinator.engine.calls import Product
from registry_coordinator.engine.timers import Timer
from registry_coordinator.semantics.steps import Reply, ReplyKind, Request, bind
from registry_coordinator.store.database import Database, Unavailable

log = logging.getLogger(__name__)

#: Pages read in one pass at most, so a long backlog is read over several passes.
PAGES_A_PASS = 50


class FeedUnusable(Exception):
    """A feed page that is not the product's page shape: the pass stops, and the cursor
    stays where it was."""


@dataclass(frozen=True)
class Follower:
    """The follower of one connection's result feed."""

    db: Database
    product: Product
    result: Result
    timer: Timer

    @property
    def feed(self) -> Feed:
        assert self.result.feed is not None
        return self.result.feed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        outages = 0
        while True:
            try:
                await self.follow()
                outages = 0
                await trio.sleep(self.product.config.feed_poll.total_seconds())
            except Unavailable as exc:
                outages += 1
                log.warning("database unavailable while following a feed: %s", exc)
                await trio.sleep(DATABASE_OUTAGE.pause(outages))

    async def follow(self) -> int:
        """One pass: read pages from the cursor until the feed has no more (or
        :data:`PAGES_A_PASS`); returns how many runs the entries woke."""
        name = self.product.config.name
        woken = 0
        for _ in range(PAGES_A_PASS):
            cursor = await store.feed_cursor(self.db, name)
            reply = await self._page(cursor)
            if reply.kind is ReplyKind.RESPONSE and reply.status == 410 and cursor is not None:
                log.warning("feed %s no longer knows its cursor: reading it from its start", name)
                await store.move_feed(self.db, name, cursor, None)
                continue
            if reply.kind is not ReplyKind.RESPONSE or reply.status != 200:
                log.warning(
                    "feed %s could not be read: %s",
                    name,
                    reply.detail or f"answered {reply.status}",
                )
                break
            try:
                entries, following = self._entries(reply.body)
            except FeedUnusable as exc:
                log.warning("feed %s gave a page that cannot be used: %s", name, exc)
                break
            for event_id, key in entries:
                delivery = store.Delivery(name, event_id, self.result.name, key, None)
                _, woke = await store.record_delivery(self.db, delivery)
                woken += woke
            # The entries are recorded: the cursor moves past them (to the last one's,
            # where the feed says no more: the next page begins after it).
            last = following or (entries[-1][0] if entries else cursor)
            if last != cursor:
                await store.move_feed(self.db, name, cursor, last)
            if following is None:
                break
        if woken:
            self.timer.runnable()
        return woken

    async def _page(self, cursor: str | None) -> Reply:
        feed = self.feed
        query = {feed.cursor: cursor} if cursor is not None else {}
        target = f"{feed.path}?{urlencode({**query, 'limit': feed.limit})}"
        request = bind(
            self.result.fetch,
            Request("GET", target, None, None),
            self.product.config.parameters,
        )
        async with self.product.limiter:
            return await self.product.read(request)

    def _entries(self, body: bytes) -> tuple[list[tuple[str, str]], str | None]:
        """A page's (event id, key) entries and the cursor of the next page, if any."""
        feed = self.feed
        try:
            page = strict_json(body)
        except UnusableJson as exc:
            raise FeedUnusable(str(exc)) from None
        items = page.get(feed.items) if isinstance(page, dict) else None
        if not isinstance(items, list):
            raise FeedUnusable(f"no {feed.items} list")
        entries = []
        for item in items:
            event_id, key = _member(item, feed.event_id), _member(item, feed.key)
            if event_id is None or key is None:
                raise FeedUnusable(f"an entry without {feed.event_id} and {feed.key}")
            entries.append((event_id, key))
        following = page.get(feed.next)
        if following is not None and not isinstance(following, str):
            raise FeedUnusable(f"{feed.next} is not a string")
        return entries, following or None


def _member(item: JSON, name: str) -> str | None:
    value = item.get(name) if isinstance(item, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= 500 else None


def followers(db: Database, products: dict[str, Product], timer: Timer) -> list[Follower]:
    """A follower for each connection whose product lists a result on a feed."""
    found = []
    catalog = builtin_catalog()
    for product in products.values():
        kind = catalog.products.get(product.config.product)
        for result in kind.results.values() if kind else ():
            if result.feed is not None:
                found.append(Follower(db, product, result, timer))
    return found
