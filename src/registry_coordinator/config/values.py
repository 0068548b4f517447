"""What every section's fields are made of: secrets given by reference, whole numbers and
durations within bounds, URLs that are https or loopback.

Each reader reports a problem at the field's path and hands back a default (or None), so a
section goes on being read after a mistake and one pass reports every problem of the file.
A secret is resolved when the file is read, so a missing one stops startup with the
field's position rather than at first use.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath


def resolve_secret(reference: str) -> str:
    """The value behind ``env:NAME`` or ``file:/path``; raises ValueError saying what is missing."""
    if reference.startswith("env:"):
        name = reference[4:]
        value = os.environ.get(name)
        if not value:
            raise ValueError(f"the environment variable {name} is not set")
        return value
    if reference.startswith("file:"):
        path = Path(reference[5:])
        try:
            return path.read_text("utf-8").rstrip("\n")
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    raise ValueError("a secret must be a reference: env:NAME or file:/path")


LOOPBACK = ("127.0.0.1", "::1", "localhost")


def port_valid(url: str) -> bool:
    """Whether the URL's port, if it names one, is one (urlsplit checks it only when asked);
    a URL that does not split at all is :func:`https_or_loopback`'s to refuse."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return True
    try:
        parts.port  # noqa: B018
    except ValueError:
        return False
    return True


def https_or_loopback(url: str) -> bool:
    """An https URL, or plain http to this machine's loopback (for development)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unclosed [IPv6 address
        return False
    return bool(host) and (parts.scheme == "https" or (parts.scheme == "http" and host in LOOPBACK))


def read_integer(
    reader: Reader,
    data: dict[str, JSON],
    name: str,
    path: DataPath,
    default: int,
    low: int,
    high: int,
) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        reader.report(
            "config.invalid-value",
            f"{name} must be a whole number from {low} to {high}, not {describe(value)}",
            f"give {name} a value from {low} to {high}",
            (*path, name),
        )
        return default
    return value


def read_boolean(
    reader: Reader, data: dict[str, JSON], name: str, path: DataPath, default: bool
) -> bool:
    value = data.get(name, default)
    if not isinstance(value, bool):
        reader.report(
            "config.invalid-value",
            f"{name} must be true or false, not {describe(value)}",
            f"give {name}: true, or leave it out",
            (*path, name),
        )
        return default
    return value


def read_duration(
    reader: Reader,
    data: dict[str, JSON],
    name: str,
    path: DataPath,
    default: timedelta,
    low: timedelta,
    high: timedelta | None = None,
) -> timedelta:
    if name not in data:
        return default
    value = reader.duration(data, name, path, str(path[0]) if path else "the configuration")
    if value is None:
        return default
    if value < low:
        reader.report(
            "config.invalid-value",
            f"{name} must be at least {low.total_seconds():g} seconds",
            f"give {name} a longer duration",
            (*path, name),
        )
    if high is not None and value > high:
        reader.report(
            "config.invalid-value",
            f"{name} must be at most {high.total_seconds():g} seconds",
            f"give {name} a shorter duration",
            (*path, name),
        )
    return value


def read_secret(
    reader: Reader, data: dict[str, JSON], name: str, path: DataPath, what: str
) -> str | None:
    """A field that holds a secret: only a reference is accepted, and it must resolve."""
    reference = reader.string(data, name, path, what)
    if reference is None:
        return None
    if not reference.startswith(("env:", "file:")):
        reader.report(
            "config.secret-literal",
            f"{what} {name} is written in the configuration, but it is a secret",
            f"give a reference instead: {name}: env:NAME or {name}: file:/path",
            (*path, name),
        )
        return None
    try:
        return resolve_secret(reference)
    except ValueError as exc:
        reader.report(
            "config.secret-unavailable",
            f"{what} {name}: {exc}",
            "set the variable or create the file before starting",
            (*path, name),
        )
        return None
