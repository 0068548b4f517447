"""ISO 8601 durations of fixed length.

Years and months are refused: their length depends on the calendar, and a run's
deadlines and timeouts must be exact instants that an auditor can recompute.
"""

from __future__ import annotations

import re
from datetime import timedelta

from registry_coordinator.errors import CoordinatorError

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:\.\d{1,6})?)S)?)?$"
)
_CALENDAR = re.compile(r"^P[^T]*\d[YM]")


class DurationError(CoordinatorError, ValueError):
    """A duration that is not ISO 8601, or not of fixed length."""


def parse_duration(text: str) -> timedelta:
    """Parse ``P14D``, ``PT30M``, ``P1DT12H``, ``P2W``; refuse ``P1M`` and ``P1Y``."""
    match = _DURATION.match(text)
    if match is None:
        if _CALENDAR.match(text):
            raise DurationError(
                f"{text!r} uses years or months, whose length varies; write days instead (P30D)"
            )
        raise DurationError(f"{text!r} is not an ISO 8601 duration such as P14D, PT30M or P1DT12H")
    parts = {name: float(value) if value else 0.0 for name, value in match.groupdict().items()}
    try:
        return timedelta(**parts)
    except OverflowError:
        raise DurationError(f"{text!r} is too long to be a duration") from None


def format_duration(value: timedelta) -> str:
    """The shortest ISO 8601 spelling of a non-negative timedelta (days, not weeks)."""
    if value < timedelta(0):
        raise ValueError("negative durations have no ISO 8601 form here")
    days, rest = divmod(value, timedelta(days=1))
    hours, rest = divmod(rest, timedelta(hours=1))
    minutes, rest = divmod(rest, timedelta(minutes=1))
    seconds, micros = divmod(rest // timedelta(microseconds=1), 1_000_000)
    text = "P" + (f"{days}D" if days else "")
    clock = ""
    if hours:
        clock += f"{hours}H"
    if minutes:
        clock += f"{minutes}M"
    if seconds or micros:
        clock += str(seconds) + (f".{micros:06d}".rstrip("0") if micros else "") + "S"
    if clock:
        text += "T" + clock
    return text if text != "P" else "PT0S"
