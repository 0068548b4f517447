"""The high-water mark against a real database: a request waits for an advance that began
after it asked, many share one, the mark never goes down, and a mark is never held against
another database or read when it is not one."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import trio

from registry_coordinator.engine.high_water import (
    FORMAT,
    HighWater,
    Mark,
    MarkUnusable,
    judge,
    read_mark,
    write_mark,
)
from registry_coordinator.store import timeline
from tests.support import database


@pytest.mark.trio
async def test_every_waiter_is_released_by_an_advance_begun_after_it_asked(
    dsn: str, tmp_path: Path
) -> None:
    path = tmp_path / "mark.json"
    async with database(dsn) as db:
        mark = HighWater(db, path)
        seen: list[tuple[int, int]] = []  # (the database's epoch when asked, the mark's after)

        async def send() -> None:
            asked = (await timeline.timeline(db)).epoch
            await mark.passed()
            stored = read_mark(path)
            assert stored is not None
            seen.append((asked, stored.epoch))

        async with trio.open_nursery() as nursery:
            await nursery.start(mark.run)
            async with trio.open_nursery() as senders:
                for _ in range(20):
                    senders.start_soon(send)
            await send()  # and one more alone, after them
            nursery.cancel_scope.cancel()
        line = await timeline.timeline(db)
    assert len(seen) == 21
    assert all(after > asked for asked, after in seen), seen
    assert line.epoch <= 20 / 2 + 1  # twenty at once shared advances, the last had its own
    assert read_mark(path) == Mark(line.installation, line.epoch)


@pytest.mark.trio
async def test_without_a_mark_nothing_is_advanced(dsn: str) -> None:
    async with database(dsn) as db:
        mark = HighWater(db, None)
        async with trio.open_nursery() as nursery:
            await nursery.start(mark.run)
            await mark.passed()
        assert (await timeline.timeline(db)).epoch == 0


def test_the_mark_never_goes_down_and_names_its_database(tmp_path: Path) -> None:
    path = tmp_path / "mark.json"
    mine = uuid.uuid4()
    assert read_mark(path) is None
    assert write_mark(path, Mark(mine, 5)) == Mark(mine, 5)
    assert write_mark(path, Mark(mine, 3)) == Mark(mine, 5)  # lower: the higher is kept
    assert read_mark(path) == Mark(mine, 5)
    with pytest.raises(MarkUnusable, match="belongs to database"):
        write_mark(path, Mark(uuid.uuid4(), 9))
    assert read_mark(path) == Mark(mine, 5)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        json.dumps(
            {
                "format": "other/v1",
                "installation": "0b8d6e6c-3f7a-4c1e-9d2a-5b6f7e8d9c0a",
                "epoch": 1,
            }
        ),
        json.dumps({"format": FORMAT, "installation": "not-a-uuid", "epoch": 1}),
        json.dumps({"format": FORMAT, "installation": str(uuid.uuid4()), "epoch": "1"}),
        json.dumps([1, 2]),
    ],
    ids=["empty", "not-json", "another-format", "bad-installation", "bad-epoch", "a-list"],
)
def test_a_mark_this_build_did_not_write_is_refused_in_one_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "mark.json"
    path.write_text(text)
    with pytest.raises(MarkUnusable, match="is not one this build wrote"):
        read_mark(path)


@pytest.mark.trio
async def test_judging_a_mark_ahead_holds_runs_once_and_keeps_the_recovery_open(
    dsn: str, tmp_path: Path
) -> None:
    path = tmp_path / "mark.json"
    async with database(dsn) as db:
        assert await judge(db, path, "test") is None  # no mark yet: one is made
        line = await timeline.timeline(db)
        assert read_mark(path) == Mark(line.installation, 0)
        write_mark(path, Mark(line.installation, 4))  # as if the database went back
        restore = await judge(db, path, "test")
        assert restore is not None and (restore.database_epoch, restore.mark_epoch) == (0, 4)
        assert (await timeline.timeline(db)).epoch == 4  # up to the mark: judged once
        again = await judge(db, path, "test")
        assert again is not None and again.number == restore.number  # still open
        assert await timeline.end_restore(db, "test", "reviewed") == restore.number
        assert await judge(db, path, "test") is None
