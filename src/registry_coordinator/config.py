"""The service configuration: one YAML file, every problem reported at once.

Relative paths are taken from the configuration file's directory, so a file and
the artifacts beside it can move together. Secrets are never values in the file:
fields that hold one take ``env:NAME`` or ``file:/path`` and are resolved when
the file is read, so a missing secret stops startup with the field's position.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from .database import has_password
from .diagnostics import Refused
from .fields import Reader, describe
from .source import DataPath, load_yaml, read_source

JSON = Any


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str | None  # resolved; None in embedded mode
    embedded: Path | None  # the embedded cluster's data directory
    pool_size: int


@dataclass(frozen=True)
class PinnedWorkflow:
    artifact: Path
    digest: str
    path: DataPath  # where in the configuration it was pinned


@dataclass(frozen=True)
class EngineConfig:
    workers: int
    lease: timedelta
    sweep_interval: timedelta


@dataclass(frozen=True)
class Config:
    file: Path
    database: DatabaseConfig
    host: str
    port: int
    workflows: tuple[PinnedWorkflow, ...]
    engine: EngineConfig
    request_body_limit: int


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


def load_config(path: Path) -> Config:
    """Read and validate a configuration file; raises :class:`Refused` with every problem."""
    document, source = load_yaml(read_source(path), str(path))
    reader = Reader(source)
    base = path.resolve().parent
    root = reader.mapping(document, (), "the configuration") or {}
    reader.fields(
        root, (), "the configuration", ["database", "workflows"], ["listen", "engine", "limits"]
    )
    database = _database(reader, root.get("database"), base)
    host, port = _listen(reader, root.get("listen", {}))
    workflows = _workflows(reader, root.get("workflows"), base)
    engine = _engine(reader, root.get("engine", {}))
    limits = reader.mapping(root.get("limits", {}), ("limits",), "limits") or {}
    reader.fields(limits, ("limits",), "limits", [], ["requestBody"])
    body_limit = _integer(reader, limits, "requestBody", ("limits",), 64 * 1024, 1024, 16 << 20)
    if reader.diagnostics:
        raise Refused(reader.diagnostics)
    assert database is not None and engine is not None
    return Config(path, database, host, port, workflows, engine, body_limit)


def _integer(
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


def _database(reader: Reader, value: JSON, base: Path) -> DatabaseConfig | None:
    path: DataPath = ("database",)
    data = reader.mapping(value, path, "database")
    if data is None:
        return None
    reader.fields(data, path, "database", [], ["dsn", "embedded", "poolSize"])
    pool_size = _integer(reader, data, "poolSize", path, 10, 2, 200)
    if ("dsn" in data) == ("embedded" in data):
        reader.report(
            "config.invalid-value",
            "database needs exactly one of dsn and embedded",
            "give dsn: env:NAME for a PostgreSQL server, or embedded: {dataDirectory: DIR}",
            path,
        )
        return None
    if "embedded" in data:
        embedded = reader.mapping(data["embedded"], (*path, "embedded"), "embedded") or {}
        reader.fields(embedded, (*path, "embedded"), "embedded", ["dataDirectory"])
        directory = reader.string(embedded, "dataDirectory", (*path, "embedded"), "embedded")
        return DatabaseConfig(None, (base / directory).resolve() if directory else None, pool_size)
    dsn = reader.string(data, "dsn", path, "database")
    if dsn is None:
        return None
    if not dsn.startswith(("env:", "file:")):
        try:
            secret = has_password(dsn)
        except ValueError:
            reader.report(
                "config.invalid-value",
                "dsn is not a PostgreSQL connection string",
                "write postgresql://user@host:port/database",
                (*path, "dsn"),
            )
            return None
        if secret:
            reader.report(
                "config.secret-literal",
                "dsn holds a password, and secrets must not be written in the configuration",
                "put the connection string in an environment variable or file: dsn: env:NAME",
                (*path, "dsn"),
            )
            return None
        return DatabaseConfig(dsn, None, pool_size)
    try:
        return DatabaseConfig(resolve_secret(dsn), None, pool_size)
    except ValueError as exc:
        reader.report(
            "config.secret-unavailable",
            f"dsn: {exc}",
            "set the variable or create the file before starting",
            (*path, "dsn"),
        )
        return None


def _listen(reader: Reader, value: JSON) -> tuple[str, int]:
    path: DataPath = ("listen",)
    data = reader.mapping(value, path, "listen") or {}
    reader.fields(data, path, "listen", [], ["host", "port"])
    host = reader.string(data, "host", path, "listen") or "127.0.0.1"
    return host, _integer(reader, data, "port", path, 8080, 0, 65535)


def _workflows(reader: Reader, value: JSON, base: Path) -> tuple[PinnedWorkflow, ...]:
    path: DataPath = ("workflows",)
    if not isinstance(value, list):
        if value is not None:
            reader.report(
                "field.type",
                f"workflows must be a list, not {describe(value)}",
                "list pinned artifacts: '- artifact: FILE' and 'digest: sha256:...'",
                path,
            )
        return ()
    pinned = []
    for index, item in enumerate(value):
        at = (*path, index)
        data = reader.mapping(item, at, "a pinned workflow")
        if data is None or not reader.fields(data, at, "a pinned workflow", ["artifact", "digest"]):
            continue
        artifact = reader.string(data, "artifact", at, "a pinned workflow")
        digest = reader.string(data, "digest", at, "a pinned workflow")
        if digest is not None and not (digest.startswith("sha256:") and len(digest) == 71):
            reader.report(
                "config.invalid-value",
                f"digest {digest!r} is not sha256:<64 hex digits>",
                "paste the digest coordinator package printed",
                (*at, "digest"),
            )
            continue
        if artifact and digest:
            pinned.append(PinnedWorkflow((base / artifact).resolve(), digest, at))
    return tuple(pinned)


def _engine(reader: Reader, value: JSON) -> EngineConfig | None:
    path: DataPath = ("engine",)
    data = reader.mapping(value, path, "engine")
    if data is None:
        return None
    reader.fields(data, path, "engine", [], ["workers", "lease", "sweepInterval"])
    workers = _integer(reader, data, "workers", path, 4, 1, 256)
    lease = reader.duration(data, "lease", path, "engine") if "lease" in data else None
    sweep = (
        reader.duration(data, "sweepInterval", path, "engine") if "sweepInterval" in data else None
    )
    lease = lease or timedelta(seconds=30)
    sweep = sweep or timedelta(seconds=30)
    for name, duration, low in (("lease", lease, 2), ("sweepInterval", sweep, 1)):
        if duration < timedelta(seconds=low):
            reader.report(
                "config.invalid-value",
                f"{name} must be at least {low} seconds",
                f"give {name} a duration such as PT30S",
                (*path, name),
            )
    return EngineConfig(workers, lease, sweep)
