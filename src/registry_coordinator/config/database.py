"""The ``database`` section, read by the store: a connection string by reference, or the
embedded cluster's data directory, the pool's size, and the high-water mark's file, which
lets a database restored from a backup be recognised (``engine.high_water``).

Reading it never connects (``coordinator token --config`` reads the file too): a connection
string is judged by psycopg's own parser of libpq's syntax, without the event loop's
database layer, and one that carries a password is refused, since secrets are never
values in the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class DatabaseConfig:
    dsn: str | None  # resolved; None in embedded mode
    embedded: Path | None  # the embedded cluster's data directory
    pool_size: int
    #: The high-water mark outside the database (``engine.high_water``); None: a restored
    #: database cannot be recognised, which ``doctor`` warns of.
    high_water: Path | None = None


def read_database(reader: Reader, value: JSON, base: Path) -> DatabaseConfig | None:
    path: DataPath = ("database",)
    data = reader.mapping(value, path, "database")
    if data is None:
        return None
    reader.fields(data, path, "database", [], ["dsn", "embedded", "poolSize", "highWaterMark"])
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
        embedded = reader.mapping(data["embedded"], (*path, "embedded"), "embedded") or {}
        reader.fields(embedded, (*path, "embedded"), "embedded", ["dataDirectory"])
        directory = reader.string(embedded, "dataDirectory", (*path, "embedded"), "embedded")
        data_directory = (base / directory).resolve() if directory else None
        return DatabaseConfig(None, data_directory, pool_size, high_water)
    dsn = reader.string(data, "dsn", path, "database")
    if dsn is None:
        return None
    if not dsn.startswith(("env:", "file:")):
        try:
            secret = has_password(dsn)
        except ValueError:
            _malformed(reader, "dsn is not a PostgreSQL connection string", path)
            return None
        if wrong := port_problem(dsn):
            _malformed(reader, f"dsn: {wrong}", path)
            return None
        if secret:
            reader.report(
                "config.secret-literal",
                "dsn holds a password, and secrets must not be written in the configuration",
                "put the connection string in an environment variable or file: dsn: env:NAME",
                (*path, "dsn"),
            )
            return None
        return DatabaseConfig(dsn, None, pool_size, high_water)
    try:
        resolved = resolve_secret(dsn)
    except ValueError as exc:
        reader.report(
            "config.secret-unavailable",
            f"dsn: {exc}",
            "set the variable or create the file before starting",
            (*path, "dsn"),
        )
        return None
    try:
        wrong = port_problem(resolved)
    except ValueError:
        wrong = "it is not a PostgreSQL connection string"
    if wrong:  # said without the value, which may hold a password
        _malformed(reader, f"the dsn {dsn} names: {wrong}", path)
        return None
    return DatabaseConfig(resolved, None, pool_size, high_water)


def _malformed(reader: Reader, message: str, path: DataPath) -> None:
    reader.report(
        "config.invalid-value",
        message,
        "write postgresql://user@host:port/database",
        (*path, "dsn"),
    )
