"""Faults the tests inject from inside the service, chosen by environment variables.

Crash points: ``COORDINATOR_CRASH_AT=after-claim:3`` makes the process SIGKILL itself
the third time it passes the ``after-claim`` point. Unset (always, outside the tests),
a crash point is one dictionary lookup. Killing from inside is the only way to stop a
process exactly between two chosen statements; a kill from outside lands wherever the
process happens to be, which the fault-injection suite does too.

A stuck event loop: ``COORDINATOR_STALL_ON_USR1=SECONDS`` makes each SIGUSR1 block
the whole Trio loop for that long, so a test can see that the systemd watchdog's
pings come from the loop itself and stop while it is stuck. Unset, nothing listens.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import trio

log = logging.getLogger(__name__)

STALL_SECONDS = float(os.environ.get("COORDINATOR_STALL_ON_USR1") or 0)

_PLAN = os.environ.get("COORDINATOR_CRASH_AT", "")
_POINT, _, _NTH = _PLAN.partition(":")
_COUNTS: dict[str, int] = {}

POINTS = (
    "after-claim",
    "before-commit",
    "mid-transition",
    "after-commit",
    "mid-wake",
    "mid-mark",
    "archive-written",
    "archive-recorded",
    "archive-committed",
    "mid-rotation",
    "mid-erasure",
    "mid-sealing",
    "bulk-settled",
    "bulk-committed",
)


def crash_point(name: str) -> None:
    """Die here, abruptly, if this is the planned point and pass."""
    assert name in POINTS, name
    if name != _POINT:
        return
    _COUNTS[name] = _COUNTS.get(name, 0) + 1
    if _COUNTS[name] == int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)


async def stall_on_signal(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Block the event loop for :data:`STALL_SECONDS` each time SIGUSR1 comes."""
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        task_status.started()
        async for _ in signals:
            log.warning("stalling the event loop for %g s, as asked", STALL_SECONDS)
            time.sleep(STALL_SECONDS)  # blocking the loop is the point
            log.warning("the event loop goes on after its stall")
