"""The configuration file as a whole: its top-level fields, each section read by its own
module, and what a reading hands the later stages when the structure is broken (the pins
and the product kind each connection names), so one pass reports everything.

Relative paths are taken from the file's directory, so a file and the artifacts beside it
can move together.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.diagnostics import Refused
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath, SourceMap, load_yaml, read_source
from registry_coordinator.config.audit import (
    AuditConfig,
    RetentionConfig,
    read_audit,
    read_retention,
)
from registry_coordinator.config.auth import AuthConfig, read_auth
from registry_coordinator.config.connections import (
    ConnectionConfig,
    read_connections,
    read_products,
)
from registry_coordinator.config.console import ConsoleConfig, read_console
from registry_coordinator.config.custody import CustodyConfig, read_custody
from registry_coordinator.config.database import DatabaseConfig, read_database
from registry_coordinator.config.engine import (
    EngineConfig,
    PinnedWorkflow,
    read_engine,
    read_workflows,
)
from registry_coordinator.config.problems import Problems
from registry_coordinator.config.tracing import TracingConfig, read_tracing
from registry_coordinator.config.values import (
    read_integer,
)


@dataclass(frozen=True)
class Config:
    file: Path
    database: DatabaseConfig
    host: str
    port: int
    workflows: tuple[PinnedWorkflow, ...]
    connections: dict[str, ConnectionConfig]
    engine: EngineConfig
    request_body_limit: int
    auth: AuthConfig
    console: ConsoleConfig
    audit: AuditConfig
    retention: RetentionConfig
    tracing: TracingConfig = field(default_factory=TracingConfig)
    #: The listener's certificate chain and key: it serves HTTPS itself (None: plain HTTP,
    #: on loopback or behind a reverse proxy that terminates TLS).
    tls: ListenTls | None = None
    #: Where /metrics and /ready are served instead of the public listener (None: there).
    admin: tuple[str, int] | None = None
    #: The key-encryption keys personal data's data keys are wrapped under.
    custody: CustodyConfig = field(default_factory=CustodyConfig)

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


@dataclass(frozen=True)
class ListenTls:
    certificate: Path  # PEM: the server's certificate, then its chain
    key: Path  # PEM, unencrypted


@dataclass(frozen=True)
class ConfigReading:
    """A configuration file read as far as its structure allows."""

    config: Config | None  # None when the structure has a problem
    pins: tuple[PinnedWorkflow, ...]  # the pinned workflows that parsed
    #: The product kind each well-named connection names (None where it does not say one
    #: readably); None when the connections section is not a mapping at all.
    products: dict[str, str | None] | None
    problems: Problems
    #: The connections that parsed, whatever else is wrong with the file.
    connections: dict[str, ConnectionConfig] = field(default_factory=dict)
    #: The database and the listen address where their sections parsed, whatever else is
    #: wrong with the file: what it points at can be looked at in the same pass.
    database: DatabaseConfig | None = None
    listen: tuple[str, int] | None = None


def load_config(path: Path) -> Config:
    """Read and validate a configuration file; raises :class:`Refused` with every problem
    of its structure (the commands that run workflows use ``load_service``, which adds
    the artifacts' and the bindings')."""
    reading = read_config(path)
    reading.problems.refuse()
    assert reading.config is not None
    return reading.config


def read_config(path: Path) -> ConfigReading:
    """Read a configuration file, collecting its structural problems rather than raising."""
    try:
        document, source = load_yaml(read_source(path), str(path))
    except Refused as refused:  # nothing in it can be looked at
        problems = Problems(SourceMap(str(path)))
        problems.add("configuration", refused.diagnostics)
        return ConfigReading(None, (), None, problems)
    reader = Reader(source)
    base = path.resolve().parent
    root = reader.mapping(document, (), "the configuration") or {}
    reader.fields(
        root,
        (),
        "the configuration",
        ["database", "workflows", "auth"],
        [
            "listen",
            "connections",
            "engine",
            "limits",
            "console",
            "audit",
            "retention",
            "tracing",
            "custody",
        ],
    )
    database = read_database(reader, root.get("database"), base)
    before = len(reader.diagnostics)
    host, port, tls, admin = _listen(reader, root.get("listen", {}), base)
    listen = (host, port) if len(reader.diagnostics) == before else None
    workflows = read_workflows(reader, root.get("workflows"), base)
    connections = read_connections(reader, root.get("connections", {}))
    engine = read_engine(reader, root.get("engine", {}))
    limits = reader.mapping(root.get("limits", {}), ("limits",), "limits") or {}
    reader.fields(limits, ("limits",), "limits", [], ["requestBody"])
    body_limit = read_integer(reader, limits, "requestBody", ("limits",), 64 * 1024, 1024, 16 << 20)
    auth = read_auth(reader, root.get("auth"), base, host) if "auth" in root else None
    console = read_console(reader, root.get("console", {}), auth)
    audit = read_audit(reader, root.get("audit", {}))
    retention = read_retention(reader, root.get("retention", {}), base, audit)
    tracing = read_tracing(reader, root.get("tracing", {}))
    custody = read_custody(reader, root.get("custody", {}))
    problems = Problems(source)
    problems.add("configuration", reader.diagnostics)
    products = read_products(root.get("connections", {}))
    if problems:
        return ConfigReading(None, workflows, products, problems, connections, database, listen)
    assert database is not None and engine is not None and auth is not None
    config = Config(
        path,
        database,
        host,
        port,
        workflows,
        connections,
        engine,
        body_limit,
        auth,
        console,
        audit,
        retention,
        tracing,
        tls,
        admin,
        custody,
    )
    return ConfigReading(config, workflows, products, problems, connections, database, listen)


def _listen(
    reader: Reader, value: JSON, base: Path
) -> tuple[str, int, ListenTls | None, tuple[str, int] | None]:
    path: DataPath = ("listen",)
    data = reader.mapping(value, path, "listen") or {}
    reader.fields(data, path, "listen", [], ["host", "port", "tls", "admin"])
    host = reader.string(data, "host", path, "listen") or "127.0.0.1"
    port = read_integer(reader, data, "port", path, 8080, 0, 65535)
    tls = _tls(reader, data, base) if "tls" in data else None
    return host, port, tls, _admin(reader, data, port) if "admin" in data else None


def _admin(reader: Reader, data: dict[str, JSON], public: int) -> tuple[str, int] | None:
    """The admin listener: /metrics and /ready for the machines that watch the service,
    off the address callers reach (plain HTTP, like a scrape target)."""
    path: DataPath = ("listen", "admin")
    admin = reader.mapping(data["admin"], path, "listen.admin") or {}
    if not reader.fields(admin, path, "listen.admin", ["port"], ["host"]):
        return None
    host = reader.string(admin, "host", path, "listen.admin") or "127.0.0.1"
    port = read_integer(reader, admin, "port", path, 9090, 1, 65535)
    if port == public:
        reader.report(
            "config.invalid-value",
            f"listen.admin.port {port} is listen.port too",
            "give the admin listener a port of its own",
            (*path, "port"),
        )
        return None
    return host, port


def _tls(reader: Reader, data: dict[str, JSON], base: Path) -> ListenTls | None:
    """The listener's certificate and key, loaded once here as the listener will load
    them, so that a wrong path, a key of another certificate or an encrypted key is said
    with the file rather than when the first caller connects."""
    path: DataPath = ("listen", "tls")
    tls = reader.mapping(data["tls"], path, "listen.tls") or {}
    if not reader.fields(tls, path, "listen.tls", ["certificate", "key"]):
        return None
    certificate = reader.string(tls, "certificate", path, "listen.tls")
    key = reader.string(tls, "key", path, "listen.tls")
    if certificate is None or key is None:
        return None
    found = ListenTls((base / certificate).resolve(), (base / key).resolve())
    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(found.certificate, found.key, password=_no_password)
    except (OSError, ssl.SSLError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        reader.report(
            "config.invalid-value",
            f"listen.tls: {found.certificate} and {found.key} cannot serve TLS: {why}",
            "give a PEM certificate chain and its unencrypted PEM private key",
            path,
        )
        return None
    return found


def _no_password() -> str:
    raise ValueError("the key is encrypted, and the listener cannot ask for its password")
