"""The ``database`` section, read by the store: a connection string by reference, or the
embedded cluster's data directory, the pool's size, and the high-water mark's file, which
lets a database restored from a backup be recognised (``engine.high_water``); and, where
``dsn`` leads through a connection pooler in transaction mode (PgBouncer's
``pool_mode = transaction``), ``pooler: transaction`` and the ``sessionDsn`` that the
one thing needing a session of its own, LISTEN, connects to (``store.poolers``).

Reading it never connects (``coordinator token --config`` reads the file too): a connection
string is judged by psycopg's own parser of libpq's syntax, without the event loop's
database layer, and one that carries a password is refused, since secrets are never
values in the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import psycopg
from psycopg.abc import ConnDict
from psycopg.conninfo import conninfo_to_dict

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    read_integer,
    resolve_secret,
)


def has_password(dsn: str) -> bool:
    """Whether a connection string carries a password; ValueError if it is not one."""
    return bool(_parsed(dsn).get("password"))


def _parsed(dsn: str) -> ConnDict:
    try:
        return conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise ValueError(str(exc)) from None


def port_problem(dsn: str) -> str | None:
    """What is wrong with a connection string's ports, which libpq judges only as it
    connects — where a refusal would look like an outage, and a service restarted on it
    would be refused again and again."""
    ports = str(_parsed(dsn).get("port") or "")
    for port in ports.split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"its port {port!r} is not a port number (1 to 65535)"
    return None


#: What stands between ``dsn`` and PostgreSQL, as far as a session goes.
Pooler = Literal["none", "transaction"]
POOLERS: tuple[Pooler, ...] = ("none", "transaction")


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str | None  # resolved; None in embedded mode
    embedded: Path | None  # the embedded cluster's data directory
    pool_size: int
    #: The high-water mark outside the database (``engine.high_water``); None: a restored
    #: database cannot be recognised, which ``doctor`` warns of.
    high_water: Path | None = None
    #: The schema owner's connection string, which ``migrate`` (and only it) uses; None:
    #: ``migrate`` connects as ``serve`` does (one role for both).
    migration_dsn: str | None = field(default=None, repr=False)
    #: ``"transaction"`` where ``dsn`` leads through a pooler in transaction mode, which
    #: keeps nothing of a session between transactions; ``"none"`` (a session each).
    pooler: Pooler = "none"
    #: Where LISTEN connects, a session that stays its own (PostgreSQL directly, or a
    #: pooler's session-mode pool); None: ``dsn``. Needed with ``pooler: transaction``.
    session_dsn: str | None = field(default=None, repr=False)


def read_database(reader: Reader, value: JSON, base: Path) -> DatabaseConfig | None:
    path: DataPath = ("database",)
    data = reader.mapping(value, path, "database")
    if data is None:
        return None
    known = ["dsn", "embedded", "poolSize", "highWaterMark", "migrationDsn", "pooler", "sessionDsn"]
    reader.fields(data, path, "database", [], known)
    pool_size = read_integer(reader, data, "poolSize", path, 10, 2, 200)
    mark = reader.string(data, "highWaterMark", path, "database")
    high_water = (base / mark).resolve() if mark else None
    if ("dsn" in data) == ("embedded" in data):
        reader.report(
            "config.invalid-value",
            "database needs exactly one of dsn and embedded",
            "give dsn: env:NAME for a PostgreSQL server, or embedded: {dataDirectory: DIR}",
            path,
        )
        return None
    if "embedded" in data:
        for session_field in ("pooler", "sessionDsn"):
            if session_field in data:
                reader.report(
                    "config.invalid-value",
                    f"database.{session_field} is for a dsn, and the embedded database has none",
                    f"remove {session_field}, or give dsn instead of embedded",
                    (*path, session_field),
                )
        embedded = reader.mapping(data["embedded"], (*path, "embedded"), "embedded") or {}
        reader.fields(embedded, (*path, "embedded"), "embedded", ["dataDirectory"])
        directory = reader.string(embedded, "dataDirectory", (*path, "embedded"), "embedded")
        data_directory = (base / directory).resolve() if directory else None
        return DatabaseConfig(None, data_directory, pool_size, high_water)
    dsn = _read_dsn(reader, data, "dsn", path)
    owner = _read_dsn(reader, data, "migrationDsn", path) if "migrationDsn" in data else None
    session = _read_dsn(reader, data, "sessionDsn", path) if "sessionDsn" in data else None
    pooler = _read_pooler(reader, data, path)
    if pooler == "transaction" and "sessionDsn" not in data:
        reader.report(
            "config.invalid-value",
            "database.pooler: transaction needs database.sessionDsn: LISTEN must keep a "
            "session of its own, which a transaction-mode pool does not give",
            "set sessionDsn to PostgreSQL directly, or to a session-mode pool of the pooler",
            (*path, "pooler"),
        )
    if dsn is None or pooler is None:
        return None
    return DatabaseConfig(dsn, None, pool_size, high_water, owner, pooler, session)


def _read_pooler(reader: Reader, data: dict[str, JSON], path: DataPath) -> Pooler | None:
    pooler = reader.string(data, "pooler", path, "database") or "none"
    for known in POOLERS:
        if pooler == known:
            return known
    reader.report(
        "config.invalid-value",
        f"database.pooler {pooler!r} is not one of {', '.join(POOLERS)}",
        "write pooler: transaction where dsn leads through PgBouncer's transaction mode",
        (*path, "pooler"),
    )
    return None


def _read_dsn(reader: Reader, data: dict[str, JSON], name: str, path: DataPath) -> str | None:
    """A connection string by reference (or literal, without a password), resolved."""
    dsn = reader.string(data, name, path, "database")
    if dsn is None:
        return None
    at = (*path, name)
    if not dsn.startswith(("env:", "file:")):
        try:
            secret = has_password(dsn)
        except ValueError:
            _malformed(reader, f"{name} is not a PostgreSQL connection string", at)
            return None
        if wrong := port_problem(dsn):
            _malformed(reader, f"{name}: {wrong}", at)
            return None
        if secret:
            reader.report(
                "config.secret-literal",
                f"{name} holds a password, and secrets must not be written in the configuration",
                f"put the connection string in an environment variable or file: {name}: env:NAME",
                at,
            )
            return None
        return dsn
    try:
        resolved = resolve_secret(dsn)
    except ValueError as exc:
        reader.report(
            "config.secret-unavailable",
            f"{name}: {exc}",
            "set the variable or create the file before starting",
            at,
        )
        return None
    try:
        wrong = port_problem(resolved)
    except ValueError:
        wrong = "it is not a PostgreSQL connection string"
    if wrong:  # said without the value, which may hold a password
        _malformed(reader, f"the {name} {dsn} names: {wrong}", at)
        return None
    return resolved


def _malformed(reader: Reader, message: str, at: DataPath) -> None:
    reader.report(
        "config.invalid-value",
        message,
        "write postgresql://user@host:port/database",
        at,
    )
