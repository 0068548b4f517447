"""The service configuration: one YAML file, every problem reported at once.

A file is looked at in stages: its structure here (:func:`read_config`), then the
pinned workflows' artifacts and the connections they are bound to
(``engine.workflows.load_service``). Each stage appends to one :class:`Problems`, and a
broken structure still hands the later stages what did parse (the pins, the product
kind each connection names), so that one run reports everything instead of each
stage's problems only once the last stage's are fixed.

Relative paths are taken from the configuration file's directory, so a file and
the artifacts beside it can move together. Secrets are never values in the file:
fields that hold one take ``env:NAME`` or ``file:/path`` and are resolved when
the file is read, so a missing secret stops startup with the field's position.

Reading it never connects (``coordinator token --config`` reads it too): a connection
string is judged by psycopg's own parser of libpq's syntax, without the event loop's
database layer.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from psycopg.conninfo import conninfo_to_dict

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.diagnostics import Diagnostic, Refused, sort_key
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath, SourceMap, load_yaml, read_source
from registry_coordinator.authoring.workflow import NAME
from registry_coordinator.semantics.checkpoints import UnusableKey, signing_key
from registry_coordinator.semantics.external import (
    MOST,
    PATH,
    QUERY_NAME,
    Reviewed,
    schema_problem,
)
from registry_coordinator.semantics.steps import Verification

#: The product kind of a reviewed external HTTP connection (:mod:`semantics.external`).
EXTERNAL = "external-http"


def has_password(dsn: str) -> bool:
    """Whether a connection string carries a password; ValueError if it is not one."""
    try:
        return bool(conninfo_to_dict(dsn).get("password"))
    except psycopg.ProgrammingError as exc:
        raise ValueError(str(exc)) from None


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
    shutdown_grace: timedelta


@dataclass(frozen=True)
class Bearer:
    """A static token the operator provisioned for Coordinator at this product."""

    token: str = field(repr=False)


@dataclass(frozen=True)
class TaskAuthority:
    """Casework as the authority a connection's calls run under when a person approved a
    task grant for them: Coordinator proves itself to Casework (a bootstrap token for
    ``bootstrap_resource``), has Casework assert the grant, and exchanges the assertion
    at the token endpoint (RFC 8693) for a token of the connection's resource."""

    base_url: str  # Casework's
    issuer: str  # the assertion's iss
    subject: str  # its sub: the agent principal the grant names
    exchange_audience: str  # its aud: the token endpoint that exchanges it
    bootstrap_resource: str  # the resource of the token Casework is asked with


@dataclass(frozen=True)
class ClientCredentials:
    """OAuth 2 client credentials, authenticated by a secret or a private-key JWT, for a
    token meant for one resource (RFC 8707), as the products' token endpoints issue them."""

    token_url: str
    client_id: str
    client_secret: str | None = field(repr=False)
    private_key: str | None = field(repr=False)  # PEM
    key_id: str | None
    algorithm: str
    scopes: tuple[str, ...]
    resource: str | None  # the RFC 8707 resource indicator asked for
    assertion_audience: str | None  # the client assertion's aud; None: the token URL
    task_authority: TaskAuthority | None = None


Identity = Bearer | ClientCredentials


@dataclass(frozen=True)
class Completions:
    """How a product that pushes completion events (Casework's review.completed)
    authenticates them: the static secret its destination is configured with, presented
    as a bearer token or in a header of its own, and the recipient binding it names."""

    secret: str = field(repr=False)
    header: str  # "authorization": Bearer <secret>; any other: the raw secret in it
    recipient_binding: str | None


@dataclass(frozen=True)
class ConnectionConfig:
    name: str
    product: str
    base_url: str
    identity: Identity | None  # None: an external connection's public read
    webhook_secret: str | None = field(repr=False)
    pool_size: int
    connect_timeout: timedelta
    request_timeout: timedelta
    response_limit: int
    result_poll: timedelta  # how often a waiting run reads its result if no webhook comes
    path: DataPath
    #: The connection-bound parameters' values (the catalog's ``parameters``), by name.
    parameters: dict[str, JSON] = field(default_factory=dict)
    #: The read-only identity receipt lookups are made with (None: ``identity``).
    observation: Identity | None = None
    completions: Completions | None = None
    verification: Verification = field(default_factory=Verification)
    #: The first read of a result its product makes known only when read; each later
    #: read waits twice as long as the one before, up to ``result_poll``.
    result_poll_first: timedelta = timedelta(seconds=10)
    feed_poll: timedelta = timedelta(seconds=30)  # how often a result feed is read
    #: An external connection's review: what may be read, and what its answers must fit.
    external: Reviewed | None = None

    def read_schedule(self, reads: int, only_read: bool) -> timedelta:
        """How long after its ``reads``-th read a waiting run reads its result again: a
        backoff from :attr:`result_poll_first` for a result that only a read tells,
        else the slow fallback poll behind its product's pushes and feed."""
        if not only_read:
            return self.result_poll
        backoff: timedelta = self.result_poll_first * 2 ** min(reads, 20)
        return min(self.result_poll, backoff)


ACTIONS = ("start", "read", "cancel")


@dataclass(frozen=True)
class Policy:
    """What a client holding some scopes may do: start and see runs of some workflows,
    or everything, as an operator."""

    client: str
    scopes: frozenset[str]
    workflows: frozenset[str]  # "*" for all
    actions: frozenset[str]
    operator: bool


@dataclass(frozen=True)
class AuthConfig:
    mode: str  # "jwt", or "none" for local development on a loopback address only
    jwks_file: Path | None
    jwks_url: str | None
    issuer: str | None
    audience: str | None
    max_lifetime: timedelta
    policies: tuple[Policy, ...]
    jwks_refresh: timedelta  # how often the key set is re-read (a URL's max-age may shorten it)
    jwks_max_stale: timedelta  # how long the last good set is used while reads fail


@dataclass(frozen=True)
class ConsoleConfig:
    """How the operator console signs people in at the issuer of ``auth`` (OpenID Connect,
    authorization code with PKCE, as a public client: there is no secret to keep)."""

    client_id: str | None  # None: no sign-in (auth mode none, or no console section)
    public_url: str | None  # where browsers reach this service; None: as each request says
    scopes: tuple[str, ...]  # asked for at sign-in: openid and the scopes the policies name


@dataclass(frozen=True)
class AuditConfig:
    """How run heads are signed into checkpoints (none are made without a key)."""

    signing_key: Ed25519PrivateKey | None = field(repr=False)
    checkpoint_every: timedelta


@dataclass(frozen=True)
class RetentionConfig:
    """When ended runs leave the hot tables for verified bundles in ``directory``."""

    archive_after: timedelta | None  # None: ended runs stay
    directory: Path | None
    batch: int  # runs per transaction
    every: timedelta  # between passes, while nothing is due


@dataclass(frozen=True)
class TracingConfig:
    """Whether spans are made, and where they are sent over OTLP/HTTP (None: nowhere but
    the process; the exporter needs the ``otlp`` extra)."""

    enabled: bool = False
    otlp_endpoint: str | None = None
    service_name: str = "registry-coordinator"


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
    tracing: TracingConfig = TracingConfig()


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


Stage = Literal["configuration", "workflows", "connections"]
#: The stages a configuration is looked at in, in the order they are reported.
STAGES: tuple[Stage, ...] = ("configuration", "workflows", "connections")


class Problems:
    """Every problem one configuration file has, collected by each stage that looks at it
    (rather than raised at the first), each pointing at the field of the file it is about."""

    def __init__(self, source: SourceMap) -> None:
        self.source = source
        self._found: dict[Stage, list[Diagnostic]] = {stage: [] for stage in STAGES}

    def report(self, stage: Stage, code: str, message: str, repair: str, path: DataPath) -> None:
        """A problem with the field at ``path`` of this file (or its nearest ancestor)."""
        position = self.source.at(path)
        self._found[stage].append(Diagnostic(code, message, repair, self.source.file, position))

    def add(self, stage: Stage, diagnostics: Iterable[Diagnostic]) -> None:
        self._found[stage].extend(diagnostics)

    def of(self, stage: Stage) -> list[Diagnostic]:
        """One stage's problems, in the order of the file."""
        return sorted(self._found[stage], key=sort_key)

    def all(self) -> list[Diagnostic]:
        return [d for stage in STAGES for d in self.of(stage)]

    def __bool__(self) -> bool:
        return any(self._found.values())

    def refuse(self) -> None:
        """Raise :class:`Refused` with every problem, if there is one."""
        if self:
            raise Refused(self.all())


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
        ],
    )
    database = _database(reader, root.get("database"), base)
    host, port = _listen(reader, root.get("listen", {}))
    workflows = _workflows(reader, root.get("workflows"), base)
    connections = _connections(reader, root.get("connections", {}))
    engine = _engine(reader, root.get("engine", {}))
    limits = reader.mapping(root.get("limits", {}), ("limits",), "limits") or {}
    reader.fields(limits, ("limits",), "limits", [], ["requestBody"])
    body_limit = _integer(reader, limits, "requestBody", ("limits",), 64 * 1024, 1024, 16 << 20)
    auth = _auth(reader, root.get("auth"), base, host) if "auth" in root else None
    console = _console(reader, root.get("console", {}), auth)
    audit = _audit(reader, root.get("audit", {}))
    retention = _retention(reader, root.get("retention", {}), base, audit)
    tracing = _tracing(reader, root.get("tracing", {}))
    problems = Problems(source)
    problems.add("configuration", reader.diagnostics)
    products = _products(root.get("connections", {}))
    if problems:
        return ConfigReading(None, workflows, products, problems, connections)
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
    )
    return ConfigReading(config, workflows, products, problems, connections)


def _products(value: JSON) -> dict[str, str | None] | None:
    """The product kind each connection names, read leniently: whatever else is wrong with
    a connection, whether a workflow's connection is there, and of which kind, can be told."""
    if not isinstance(value, dict):
        return None
    products: dict[str, str | None] = {}
    for name, entry in value.items():
        if NAME.match(name):
            product = entry.get("product") if isinstance(entry, dict) else None
            products[name] = product if isinstance(product, str) else None
    return products


def _audit(reader: Reader, value: JSON) -> AuditConfig:
    """The key checkpoints are signed with, by reference, and how often they are made."""
    path: DataPath = ("audit",)
    data = reader.mapping(value, path, "audit") or {}
    reader.fields(data, path, "audit", [], ["signingKey", "checkpointEvery"])
    every = _duration(
        reader, data, "checkpointEvery", path, timedelta(minutes=1), timedelta(seconds=1)
    )
    pem = _secret(reader, data, "signingKey", path, "audit")
    if pem is None:
        return AuditConfig(None, every)
    try:
        return AuditConfig(signing_key(pem), every)
    except UnusableKey as exc:
        reader.report(
            "config.invalid-value",
            f"audit signingKey cannot sign checkpoints: {exc}",
            "make one with: openssl genpkey -algorithm ed25519 -out audit-key.pem",
            (*path, "signingKey"),
        )
        return AuditConfig(None, every)


def _retention(reader: Reader, value: JSON, base: Path, audit: AuditConfig) -> RetentionConfig:
    """How long ended runs stay in the hot tables, and where their bundles go."""
    path: DataPath = ("retention",)
    data = reader.mapping(value, path, "retention") or {}
    required = ["archiveAfter", "directory"] if data else []
    reader.fields(data, path, "retention", required, ["batch", "every"])
    after = reader.duration(data, "archiveAfter", path, "retention")
    directory = reader.string(data, "directory", path, "retention")
    batch = _integer(reader, data, "batch", path, 20, 1, 1000)
    every = _duration(reader, data, "every", path, timedelta(minutes=5), timedelta(seconds=1))
    if after is not None and audit.signing_key is None:
        reader.report(
            "config.invalid-value",
            "retention archives runs to bundles proven by a signed checkpoint, and audit has "
            "no signingKey",
            "give audit: {signingKey: file:/path/to/audit-key.pem}",
            (*path, "archiveAfter"),
        )
    return RetentionConfig(after, (base / directory).resolve() if directory else None, batch, every)


def _tracing(reader: Reader, value: JSON) -> TracingConfig:
    """Whether spans are made and where they go; an endpoint with tracing off is refused,
    since the operator who wrote it expects traces that would never be sent."""
    path: DataPath = ("tracing",)
    data = reader.mapping(value, path, "tracing") or {}
    reader.fields(data, path, "tracing", [], ["enabled", "otlpEndpoint", "serviceName"])
    enabled = data.get("enabled", False)
    if not isinstance(enabled, bool):
        reader.report(
            "field.type",
            f"tracing enabled must be true or false, not {describe(enabled)}",
            "write enabled: true",
            (*path, "enabled"),
        )
        enabled = False
    endpoint = reader.string(data, "otlpEndpoint", path, "tracing")
    if endpoint is not None and not _port_valid(endpoint):
        reader.report(
            "config.invalid-value",
            f"tracing otlpEndpoint {endpoint!r} has a port that is not a number from 0 to "
            "65535, so no span could be sent",
            "give the collector's port, e.g. https://otel.example.org:4318",
            (*path, "otlpEndpoint"),
        )
        endpoint = None
    elif endpoint is not None and not https_or_loopback(endpoint):
        reader.report(
            "config.invalid-value",
            f"tracing otlpEndpoint {endpoint!r} is not an https URL, and spans carry run "
            "and workflow names that must not travel in clear",
            "give the collector's https URL, e.g. https://otel.example.org:4318; plain http "
            "is allowed only to 127.0.0.1, ::1 or localhost",
            (*path, "otlpEndpoint"),
        )
        endpoint = None
    elif endpoint is not None and not enabled:
        reader.report(
            "config.invalid-value",
            "tracing otlpEndpoint is given, and tracing is not enabled, so no span would "
            "be sent there",
            "set tracing.enabled: true to send spans there, or remove otlpEndpoint",
            (*path, "otlpEndpoint"),
        )
    name = reader.string(data, "serviceName", path, "tracing")
    if name is not None and not name.strip():
        reader.report(
            "config.invalid-value",
            "tracing serviceName is empty",
            "give the name traces are grouped by, e.g. serviceName: registry-coordinator",
            (*path, "serviceName"),
        )
        name = None
    return TracingConfig(enabled, endpoint, name or TracingConfig.service_name)


LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_MAX_LIFETIME = timedelta(hours=1)  # auth.maxLifetime; also coordinator token's cap
#: The shortest interval between scheduled reads of the issuer's key set.
MINIMUM_JWKS_REFRESH = timedelta(seconds=1)


def _auth(reader: Reader, value: JSON, base: Path, host: str) -> AuthConfig | None:
    path: DataPath = ("auth",)
    data = reader.mapping(value, path, "auth")
    if data is None:
        return None
    mode = reader.string(data, "mode", path, "auth")
    if mode == "none":
        reader.fields(data, path, "auth", ["mode"])
        if host not in LOOPBACK:
            reader.report(
                "config.invalid-value",
                f"auth mode none lets every caller act as an operator, and listen.host {host} "
                "is not a loopback address",
                "configure auth: {mode: jwt, ...}, or listen on 127.0.0.1 for local development",
                (*path, "mode"),
            )
        no_keys = timedelta(0)  # mode none reads no key set
        return AuthConfig(
            "none", None, None, None, None, DEFAULT_MAX_LIFETIME, (), no_keys, no_keys
        )
    optional = ["jwksFile", "jwksUrl", "maxLifetime", "jwksRefresh", "jwksMaxStale"]
    reader.fields(data, path, "auth", ["mode", "issuer", "audience", "policies"], optional)
    if mode != "jwt":
        reader.report(
            "config.invalid-value",
            f"auth mode {mode!r} is not jwt or none",
            "write auth: {mode: jwt, ...}",
            (*path, "mode"),
        )
        return None
    if ("jwksFile" in data) == ("jwksUrl" in data):
        reader.report(
            "config.invalid-value",
            "auth needs exactly one of jwksFile and jwksUrl",
            "give the JWKS of the token issuer as a file or an https URL",
            path,
        )
        return None
    jwks_file = reader.string(data, "jwksFile", path, "auth")
    jwks_url = reader.string(data, "jwksUrl", path, "auth")
    if jwks_url is not None and not https_or_loopback(jwks_url):
        reader.report(
            "config.invalid-value",
            f"auth jwksUrl {jwks_url!r} is not an https URL, and the keys that decide who "
            "may act must not be open to tampering on the way",
            "serve the JWKS over https; plain http is allowed only to 127.0.0.1, ::1 or "
            "localhost, for development",
            (*path, "jwksUrl"),
        )
    lifetime = _duration(
        reader, data, "maxLifetime", path, DEFAULT_MAX_LIFETIME, timedelta(seconds=10)
    )
    refresh = _duration(
        reader, data, "jwksRefresh", path, timedelta(minutes=5), MINIMUM_JWKS_REFRESH
    )
    # Twice the refresh at least, so that a failed read is retried before tokens are refused.
    least = 2 * refresh
    max_stale = _duration(reader, data, "jwksMaxStale", path, max(timedelta(hours=1), least), least)
    policies = _policies(reader, data.get("policies"), path)
    return AuthConfig(
        "jwt",
        (base / jwks_file).resolve() if jwks_file else None,
        jwks_url,
        reader.string(data, "issuer", path, "auth"),
        reader.string(data, "audience", path, "auth"),
        lifetime,
        policies,
        refresh,
        max_stale,
    )


def _console(reader: Reader, value: JSON, auth: AuthConfig | None) -> ConsoleConfig:
    """The console's sign-in: its client id at the issuer, and where browsers reach it."""
    path: DataPath = ("console",)
    data = reader.mapping(value, path, "console") or {}
    reader.fields(data, path, "console", [], ["clientId", "publicUrl", "scopes"])
    client_id = reader.string(data, "clientId", path, "console")
    public_url = reader.string(data, "publicUrl", path, "console")
    if public_url is not None:
        public_url = public_url.rstrip("/")
        if not https_or_loopback(public_url) or urlsplit(public_url).path:
            reader.report(
                "config.invalid-value",
                f"console publicUrl {public_url!r} is not an https origin (scheme, host and "
                "port only), and the console's session cookie must not travel in clear",
                "give the https origin browsers use, e.g. https://coordinator.example.org; "
                "plain http is allowed only to 127.0.0.1, ::1 or localhost",
                (*path, "publicUrl"),
            )
    scopes = data.get("scopes")
    if scopes is not None and not (
        isinstance(scopes, list) and all(isinstance(s, str) and s.strip() for s in scopes)
    ):
        reader.report(
            "field.type",
            "console scopes must be a list of scope names",
            "write scopes: [openid, coordinator.operate]",
            (*path, "scopes"),
        )
        scopes = None
    if scopes is None:
        named = {scope for p in auth.policies for scope in p.scopes} if auth else set()
        scopes = ["openid", *sorted(named)]
    elif "openid" not in scopes:
        scopes = ["openid", *scopes]
    if auth is not None and auth.mode == "none":
        client_id = None  # nobody signs in: every caller is the local developer
    return ConsoleConfig(client_id, public_url, tuple(scopes))


def _policies(reader: Reader, items: JSON, path: DataPath) -> tuple[Policy, ...]:
    """auth's policies: who may start, read and cancel which runs, or act as an operator."""
    policies = []
    if not isinstance(items, list):
        reader.report(
            "field.type",
            "auth policies must be a list",
            "list one policy per client",
            (*path, "policies"),
        )
        items = []
    for index, item in enumerate(items):
        at = (*path, "policies", index)
        entry = reader.mapping(item, at, "a policy")
        if entry is None:
            continue
        reader.fields(
            entry, at, "a policy", ["client"], ["scopes", "workflows", "actions", "operator"]
        )
        lists = {}
        for name in ("scopes", "workflows", "actions"):
            got = entry.get(name, [])
            if not isinstance(got, list) or not all(isinstance(x, str) for x in got):
                reader.report(
                    "field.type",
                    f"a policy's {name} must be a list of strings",
                    f"write {name}: [a, b]",
                    (*at, name),
                )
                got = []
            lists[name] = frozenset(got)
        unknown = lists["actions"] - set(ACTIONS)
        if unknown:
            reader.report(
                "config.invalid-value",
                f"unknown actions {sorted(unknown)}; a policy grants {', '.join(ACTIONS)}",
                "operators get every action with operator: true",
                (*at, "actions"),
            )
        operator = entry.get("operator", False)
        if not isinstance(operator, bool):
            reader.report(
                "field.type",
                "operator must be true or false",
                "write operator: true",
                (*at, "operator"),
            )
            operator = False
        client = reader.string(entry, "client", at, "a policy")
        if client:
            policies.append(
                Policy(client, lists["scopes"], lists["workflows"], lists["actions"], operator)
            )
    return tuple(policies)


def _port_valid(url: str) -> bool:
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
    reader.fields(data, path, "engine", [], ["workers", "lease", "sweepInterval", "shutdownGrace"])
    workers = _integer(reader, data, "workers", path, 4, 1, 256)
    lease = _duration(reader, data, "lease", path, timedelta(seconds=30), timedelta(seconds=2))
    sweep = _duration(
        reader, data, "sweepInterval", path, timedelta(seconds=30), timedelta(seconds=1)
    )
    grace = _duration(reader, data, "shutdownGrace", path, timedelta(seconds=10), timedelta(0))
    return EngineConfig(workers, lease, sweep, grace)


def _duration(
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


def _secret(
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


def _connections(reader: Reader, value: JSON) -> dict[str, ConnectionConfig]:
    path: DataPath = ("connections",)
    data = reader.mapping(value, path, "connections") or {}
    found = {}
    for name, entry in data.items():
        at = (*path, name)
        what = f"connection {name}"
        if not NAME.match(name):
            reader.report(
                "connection.bad-name",
                f"the connection name {name!r} does not match {NAME.pattern}",
                "use the workflow's local connection name",
                at,
                key=True,
            )
            continue
        item = reader.mapping(entry, at, what)
        if item is None:
            continue
        if item.get("product") == EXTERNAL:
            reviewed = _external_connection(reader, name, item, at, what)
            if reviewed is not None:
                found[name] = reviewed
            continue
        optional = [
            "webhookSecret",
            "poolSize",
            "connectTimeout",
            "requestTimeout",
            "resultPoll",
            "resultPollFirst",
            "feedPoll",
            "responseLimit",
            "parameters",
            "observationIdentity",
            "completions",
            "verification",
        ]
        reader.fields(item, at, what, ["product", "baseUrl", "identity"], optional)
        product = reader.string(item, "product", at, what)
        base_url = reader.string(item, "baseUrl", at, what)
        if base_url is not None and not base_url.startswith(("http://", "https://")):
            reader.report(
                "config.invalid-value",
                f"{what} baseUrl must be an http or https URL",
                "write the product's base URL, e.g. https://casework.example",
                (*at, "baseUrl"),
            )
            base_url = None
        identity = _identity(reader, item.get("identity"), (*at, "identity"), what)
        observation = None
        if "observationIdentity" in item:
            where = (*at, "observationIdentity")
            observation = _identity(reader, item["observationIdentity"], where, what)
        webhook = (
            _secret(reader, item, "webhookSecret", at, what) if "webhookSecret" in item else None
        )
        pool = _integer(reader, item, "poolSize", at, 4, 1, 256)
        least = timedelta(milliseconds=100)
        connect = _duration(reader, item, "connectTimeout", at, timedelta(seconds=5), least)
        request = _duration(reader, item, "requestTimeout", at, timedelta(seconds=30), least)
        limit = _integer(reader, item, "responseLimit", at, 1 << 20, 1024, 64 << 20)
        second = timedelta(seconds=1)
        poll = _duration(reader, item, "resultPoll", at, timedelta(minutes=10), second)
        first = _duration(reader, item, "resultPollFirst", at, timedelta(seconds=10), second)
        feed = _duration(reader, item, "feedPoll", at, timedelta(seconds=30), second)
        parameters = _parameters(reader, item.get("parameters", {}), (*at, "parameters"), what)
        completions = (
            _completions(reader, item["completions"], (*at, "completions"), what)
            if "completions" in item
            else None
        )
        verification = _verification(reader, item.get("verification", {}), at, what)
        if product and base_url and identity:
            found[name] = ConnectionConfig(
                name,
                product,
                base_url.rstrip("/"),
                identity,
                webhook,
                pool,
                connect,
                request,
                limit,
                poll,
                at,
                parameters,
                observation,
                completions,
                verification,
                min(first, poll),
                feed,
            )
    return found


def _external_connection(
    reader: Reader, name: str, item: dict[str, JSON], at: DataPath, what: str
) -> ConnectionConfig | None:
    """A reviewed external HTTP connection, as the real coordinator's ``external_http.rs``
    bounds one: a base URL that is HTTPS (or numeric loopback HTTP), one to sixteen exact
    relative paths, the query parameters a read may send (none if omitted), a schema
    every answer must fit, an attempt of at most two seconds and an answer of at most
    64 KiB, and an identity of its own or none (a public read), never task authority."""
    optional = ["identity", "queryParameters", "poolSize", "connectTimeout"]
    optional += ["requestTimeout", "responseLimit"]
    reader.fields(item, at, what, ["product", "baseUrl", "paths", "responseSchema"], optional)
    base_url = _external_base(reader, reader.string(item, "baseUrl", at, what), at, what)
    paths = _reviewed_names(reader, item, "paths", at, what, PATH, required=True)
    query = _reviewed_names(reader, item, "queryParameters", at, what, QUERY_NAME)
    schema = item.get("responseSchema")
    wrong = schema_problem(schema)
    if wrong is not None and "responseSchema" in item:
        reader.report(
            "config.invalid-value",
            f"{what} responseSchema: {wrong}",
            "write a local JSON Schema 2020-12 for the whole answer, {status, body}",
            (*at, "responseSchema"),
        )
    identity = None
    if "identity" in item:
        identity = _identity(reader, item["identity"], (*at, "identity"), what)
        if getattr(identity, "task_authority", None) is not None:
            reader.report(
                "config.invalid-value",
                f"{what} is an external read, which never runs under Casework's task authority",
                "remove taskAuthority: an external read has its own read identity, or none",
                (*at, "identity", "oauth2", "taskAuthority"),
            )
            identity = None
    pool = _integer(reader, item, "poolSize", at, 4, 1, 256)
    least, most = timedelta(milliseconds=1), timedelta(seconds=2)
    connect = _duration(reader, item, "connectTimeout", at, most, least, most)
    request = _duration(reader, item, "requestTimeout", at, most, least, most)
    limit = _integer(reader, item, "responseLimit", at, 65536, 1, 65536)
    if base_url is None or paths is None or query is None or wrong is not None:
        return None
    if "identity" in item and identity is None:
        return None
    return ConnectionConfig(
        name,
        EXTERNAL,
        base_url,
        identity,
        None,
        pool,
        connect,
        request,
        limit,
        timedelta(minutes=10),
        at,
        external=Reviewed(frozenset(paths), frozenset(query), schema),
    )


def _external_base(reader: Reader, url: str | None, at: DataPath, what: str) -> str | None:
    """An external connection's base URL, if it is one a read may go to: HTTPS, or HTTP on
    a numeric loopback address; no credentials, query or fragment; no empty path segment;
    no link-local host (where cloud metadata services answer)."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        address = (
            ipaddress.ip_address(host) if host.replace(".", "").isdigit() or ":" in host else None
        )
    except ValueError:
        parts, host, address = None, "", None
    problem = None
    if parts is None or parts.scheme not in ("http", "https") or not host:
        problem = "must be an absolute http or https URL"
    elif any(c.isspace() or c == "\\" for c in url):
        problem = "must hold no whitespace or backslash"
    elif parts.username is not None or parts.query or parts.fragment or "?" in url or "#" in url:
        problem = "must carry no credentials, query or fragment"
    elif "//" in parts.path:
        problem = "must have no empty path segment"
    elif parts.scheme == "http" and (address is None or not address.is_loopback):
        problem = "must be HTTPS, or HTTP on a numeric loopback address (127.0.0.1, [::1])"
    elif address is not None and address.is_link_local:
        problem = "names a link-local address, where cloud metadata services answer"
    if problem is not None:
        reader.report(
            "config.invalid-value",
            f"{what} baseUrl {problem}",
            "write the reviewed service's base URL, e.g. https://directory.example/v2",
            (*at, "baseUrl"),
        )
        return None
    return url.rstrip("/")


def _reviewed_names(
    reader: Reader,
    item: dict[str, JSON],
    name: str,
    at: DataPath,
    what: str,
    grammar: re.Pattern[str],
    *,
    required: bool = False,
) -> list[str] | None:
    """One to sixteen distinct names of an external connection's review (paths, or query
    parameters), each of ``grammar``; an omitted optional list is empty."""
    if name not in item and not required:
        return []
    value = item.get(name)
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MOST
        or len(set(map(str, value))) != len(value)
        or not all(isinstance(v, str) and grammar.match(v) for v in value)
    ):
        example = "[offices, offices/districts]" if name == "paths" else "[district]"
        reader.report(
            "config.invalid-value",
            f"{what} {name} must list 1 to {MOST} distinct "
            + (
                "relative paths (no leading slash, no . or .. segment)"
                if name == "paths"
                else "query parameter names"
            ),
            f"write {name}: {example}",
            (*at, name),
        )
        return None
    return [str(v) for v in value]


def _parameters(reader: Reader, value: JSON, path: DataPath, what: str) -> dict[str, JSON]:
    """The values of the product's connection-bound parameters (which ones a connection
    needs, and whether each fits, is checked against the pinned workflows' catalog)."""
    data = reader.mapping(value, path, f"{what} parameters")
    if data is None:
        return {}
    for name, given in data.items():
        if isinstance(given, dict | list) or given is None:
            reader.report(
                "field.type",
                f"{what} parameter {name} must be a string, number or boolean, "
                f"not {describe(given)}",
                f"write {name}: VALUE",
                (*path, name),
            )
    return {k: v for k, v in data.items() if not isinstance(v, dict | list) and v is not None}


def _completions(reader: Reader, value: JSON, path: DataPath, what: str) -> Completions | None:
    """The secret a product's pushed completion events carry (Casework's destination
    configuration: a bearer token, or a header of its own), and its recipient binding."""
    data = reader.mapping(value, path, f"{what} completions")
    if data is None:
        return None
    reader.fields(data, path, f"{what} completions", ["secret"], ["header", "recipientBinding"])
    secret = _secret(reader, data, "secret", path, f"{what} completions")
    header = reader.string(data, "header", path, f"{what} completions") or "Authorization"
    binding = reader.string(data, "recipientBinding", path, f"{what} completions")
    if secret is None:
        return None
    return Completions(secret, header.lower(), binding)


def _verification(reader: Reader, value: JSON, at: DataPath, what: str) -> Verification:
    """How often the product is asked about a call whose outcome is unknown (its receipt,
    or the identical request) before the run is held, and how far apart."""
    path = (*at, "verification")
    data = reader.mapping(value, path, f"{what} verification")
    if data is None:
        return Verification()
    reader.fields(data, path, f"{what} verification", [], ["attempts", "spacing"])
    attempts = _integer(reader, data, "attempts", path, Verification.attempts, 0, 20)
    spacing = _duration(reader, data, "spacing", path, Verification.spacing, timedelta(seconds=1))
    return Verification(attempts, spacing)


def _identity(reader: Reader, value: JSON, path: DataPath, what: str) -> Identity | None:
    data = reader.mapping(value, path, f"{what} identity")
    if data is None:
        return None
    if len(data) != 1 or next(iter(data)) not in ("bearer", "oauth2"):
        reader.report(
            "config.invalid-value",
            f"{what} identity must be one of bearer or oauth2",
            "write identity: {bearer: env:NAME} or identity: {oauth2: {...}}",
            path,
        )
        return None
    if "bearer" in data:
        token = _secret(reader, data, "bearer", path, what)
        return Bearer(token) if token else None
    at = (*path, "oauth2")
    item = reader.mapping(data["oauth2"], at, f"{what} oauth2") or {}
    if "audience" in item:
        reader.report(
            "config.invalid-value",
            f"{what} oauth2 audience is no longer sent: the products' token endpoints take "
            "the RFC 8707 resource indicator",
            "write resource: with the product's resource (its token audience), and "
            "assertionAudience: only if the issuer wants another aud in the client assertion",
            (*at, "audience"),
        )
    optional = [
        "clientSecret",
        "privateKey",
        "keyId",
        "algorithm",
        "scopes",
        "resource",
        "assertionAudience",
        "audience",
        "taskAuthority",
    ]
    reader.fields(item, at, f"{what} oauth2", ["tokenUrl", "clientId"], optional)
    if ("clientSecret" in item) == ("privateKey" in item):
        reader.report(
            "config.invalid-value",
            f"{what} oauth2 needs exactly one of clientSecret and privateKey",
            "give clientSecret (client_secret_post) or privateKey (private_key_jwt)",
            at,
        )
        return None
    secret = _secret(reader, item, "clientSecret", at, what) if "clientSecret" in item else None
    key = _secret(reader, item, "privateKey", at, what) if "privateKey" in item else None
    algorithm = reader.string(item, "algorithm", at, what) or "RS256"
    if algorithm not in ("RS256", "ES256", "EdDSA"):
        reader.report(
            "config.invalid-value",
            f"{what} algorithm {algorithm!r} is not RS256, ES256 or EdDSA",
            "choose the algorithm of the private key",
            (*at, "algorithm"),
        )
    scopes = item.get("scopes", [])
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        reader.report(
            "field.type",
            f"{what} scopes must be a list of strings",
            "write scopes: [scope.one, scope.two]",
            (*at, "scopes"),
        )
        scopes = []
    token_url = reader.string(item, "tokenUrl", at, what)
    client_id = reader.string(item, "clientId", at, what)
    authority = (
        _task_authority(reader, item["taskAuthority"], (*at, "taskAuthority"), what)
        if "taskAuthority" in item
        else None
    )
    if not token_url or not client_id or not (secret or key):
        return None
    return ClientCredentials(
        token_url,
        client_id,
        secret,
        key,
        reader.string(item, "keyId", at, what),
        algorithm,
        tuple(scopes),
        reader.string(item, "resource", at, what),
        reader.string(item, "assertionAudience", at, what),
        authority,
    )


def _task_authority(reader: Reader, value: JSON, path: DataPath, what: str) -> TaskAuthority | None:
    """Casework's task-grant authority for a connection's calls (all fields required)."""
    data = reader.mapping(value, path, f"{what} taskAuthority")
    if data is None:
        return None
    names = ["baseUrl", "issuer", "subject", "exchangeAudience", "bootstrapResource"]
    if not reader.fields(data, path, f"{what} taskAuthority", names):
        return None
    found = [reader.string(data, name, path, f"{what} taskAuthority") for name in names]
    if not all(found):
        return None
    base_url = str(found[0])
    if not base_url.startswith(("http://", "https://")):
        reader.report(
            "config.invalid-value",
            f"{what} taskAuthority baseUrl must be Casework's http or https URL",
            "write Casework's base URL, e.g. https://casework.example",
            (*path, "baseUrl"),
        )
        return None
    return TaskAuthority(base_url.rstrip("/"), *(str(v) for v in found[1:]))
