"""Crash points: where the crash tests kill the service, chosen by an environment variable.

``COORDINATOR_CRASH_AT=after-claim:3`` makes the process SIGKILL itself the third
time it passes the ``after-claim`` point. Unset (always, outside the tests), a
crash point is one dictionary lookup. Killing from inside is the only way to stop
a process exactly between two chosen statements; a kill from outside lands
wherever the process happens to be, which the fault-injection suite does too.
"""

from __future__ import annotations

import os
import signal

_PLAN = os.environ.get("COORDINATOR_CRASH_AT", "")
_POINT, _, _NTH = _PLAN.partition(":")
_COUNTS: dict[str, int] = {}

POINTS = ("after-claim", "before-commit", "mid-transition", "after-commit")


def crash_point(name: str) -> None:
    """Die here, abruptly, if this is the planned point and pass."""
    assert name in POINTS, name
    if name != _POINT:
        return
    _COUNTS[name] = _COUNTS.get(name, 0) + 1
    if _COUNTS[name] == int(_NTH or 1):
        os.kill(os.getpid(), signal.SIGKILL)
