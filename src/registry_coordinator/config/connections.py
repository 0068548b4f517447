"""The ``connections`` section, read by the call pools, the result routes and the feeds:
each workflow connection's product, address, identity, pool, timeouts, result polls and
verification of unknown outcomes; and a reviewed external HTTP connection's bounds, as the
real coordinator's ``external_http.rs`` sets them.

Which connections a pinned workflow needs, and whether their parameters fit the catalog, is
judged later against the artifacts; here a connection is read as far as it parses, and the
product kind each names is read leniently (:func:`read_products`) so that later stage can
still tell a missing binding from a broken one.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from datetime import timedelta
from urllib.parse import urlsplit

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader, describe
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.authoring.workflow import NAME
from registry_coordinator.config.identity import ClientCredentials, Identity, read_identity
from registry_coordinator.config.values import (
    read_boolean,
    read_duration,
    read_integer,
    read_secret,
)
from registry_coordinator.semantics.external import (
    MOST,
    PATH,
    QUERY_NAME,
    Reviewed,
    schema_problem,
)
from registry_coordinator.semantics.steps import Verification

EXTERNAL = "external-http"


@dataclass(frozen=True)
class Completions:
    """How a product that pushes completion events (Casework's review.completed)
    authenticates them: the static secret its destination is configured with, presented
    as a bearer token or in a header of its own, and the recipient binding it names."""

    secret: str = field(repr=False)
    header: str  # "authorization": Bearer <secret>; any other: the raw secret in it
    recipient_binding: str | None


@dataclass(frozen=True)
class Rate:
    """A connection's request rate: ``per_second`` on average, ``burst`` at once."""

    per_second: int
    burst: int


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
    #: The requests per second it takes (engine.pacing); None: as many as the pool sends.
    rate: Rate | None = None
    #: Whether a retry-same or cancel of a run whose mutation over it is in doubt takes
    #: effect only once a second operator approves it (``http.approvals``).
    four_eyes: bool = False

    def binding(self) -> dict[str, JSON]:
        """What a request sealed over this connection is bound to, without a secret: its
        address, the identity it is sent as (a static token by kind alone: a rotated token
        is the same identity), and the connection-bound parameters sealed into it. Kept
        with each sealing, so that a connection edited since is seen (``doctor``, ``/ready``,
        ``retry-same``)."""
        return {
            "connection": self.name,
            "baseUrl": self.base_url,
            "identity": _identity(self.identity),
            "parameters": dict(self.parameters),
        }

    def read_schedule(self, reads: int, only_read: bool) -> timedelta:
        """How long after its ``reads``-th read a waiting run reads its result again: a
        backoff from :attr:`result_poll_first` for a result that only a read tells,
        else the slow fallback poll behind its product's pushes and feed."""
        if not only_read:
            return self.result_poll
        backoff: timedelta = self.result_poll_first * 2 ** min(reads, 20)
        return min(self.result_poll, backoff)


def _identity(identity: Identity | None) -> JSON:
    if identity is None:
        return None
    if isinstance(identity, ClientCredentials):
        return {
            "tokenUrl": identity.token_url,
            "clientId": identity.client_id,
            "resource": identity.resource,
            "scopes": list(identity.scopes),
        }
    return {"kind": type(identity).__name__.lower()}


def read_products(value: JSON) -> dict[str, str | None] | None:
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


def read_connections(reader: Reader, value: JSON) -> dict[str, ConnectionConfig]:
    """Every connection that parses, by name; each problem of the others is reported."""
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
        read = _external_connection if item.get("product") == EXTERNAL else _product_connection
        connection = read(reader, name, item, at, what)
        if connection is not None:
            found[name] = connection
    return found


#: The fields a Registry Stack product's connection may give beside the required ones.
_PRODUCT_OPTIONAL = [
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
    "rate",
    "fourEyes",
]


def _product_connection(
    reader: Reader, name: str, item: dict[str, JSON], at: DataPath, what: str
) -> ConnectionConfig | None:
    """A connection to a Registry Stack product of the catalog, with its identity there."""
    reader.fields(item, at, what, ["product", "baseUrl", "identity"], _PRODUCT_OPTIONAL)
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
    identity = read_identity(reader, item.get("identity"), (*at, "identity"), what)
    observation = None
    if "observationIdentity" in item:
        where = (*at, "observationIdentity")
        observation = read_identity(reader, item["observationIdentity"], where, what)
    webhook = (
        read_secret(reader, item, "webhookSecret", at, what) if "webhookSecret" in item else None
    )
    pool = read_integer(reader, item, "poolSize", at, 4, 1, 256)
    least = timedelta(milliseconds=100)
    connect = read_duration(reader, item, "connectTimeout", at, timedelta(seconds=5), least)
    request = read_duration(reader, item, "requestTimeout", at, timedelta(seconds=30), least)
    limit = read_integer(reader, item, "responseLimit", at, 1 << 20, 1024, 64 << 20)
    second = timedelta(seconds=1)
    poll = read_duration(reader, item, "resultPoll", at, timedelta(minutes=10), second)
    first = read_duration(reader, item, "resultPollFirst", at, timedelta(seconds=10), second)
    feed = read_duration(reader, item, "feedPoll", at, timedelta(seconds=30), second)
    parameters = _parameters(reader, item.get("parameters", {}), (*at, "parameters"), what)
    completions = (
        _completions(reader, item["completions"], (*at, "completions"), what)
        if "completions" in item
        else None
    )
    verification = _verification(reader, item.get("verification", {}), at, what)
    rate = _rate(reader, item, at, what)
    four_eyes = read_boolean(reader, item, "fourEyes", at, False)
    if not (product and base_url and identity):
        return None
    return ConnectionConfig(
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
        rate=rate,
        four_eyes=four_eyes,
    )


def _external_connection(
    reader: Reader, name: str, item: dict[str, JSON], at: DataPath, what: str
) -> ConnectionConfig | None:
    """A reviewed external HTTP connection, as the real coordinator's ``external_http.rs``
    bounds one: a base URL that is HTTPS (or numeric loopback HTTP), one to sixteen exact
    relative paths, the query parameters a read may send (none if omitted), a schema
    every answer must fit, an attempt of at most two seconds and an answer of at most
    64 KiB, and an identity of its own or none (a public read), never task authority."""
    optional = ["identity", "queryParameters", "poolSize", "connectTimeout"]
    optional += ["requestTimeout", "responseLimit", "rate"]
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
        identity = read_identity(reader, item["identity"], (*at, "identity"), what)
        if getattr(identity, "task_authority", None) is not None:
            reader.report(
                "config.invalid-value",
                f"{what} is an external read, which never runs under Casework's task authority",
                "remove taskAuthority: an external read has its own read identity, or none",
                (*at, "identity", "oauth2", "taskAuthority"),
            )
            identity = None
    pool = read_integer(reader, item, "poolSize", at, 4, 1, 256)
    least, most = timedelta(milliseconds=1), timedelta(seconds=2)
    connect = read_duration(reader, item, "connectTimeout", at, most, least, most)
    request = read_duration(reader, item, "requestTimeout", at, most, least, most)
    limit = read_integer(reader, item, "responseLimit", at, 65536, 1, 65536)
    rate = _rate(reader, item, at, what)
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
        rate=rate,
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
    secret = read_secret(reader, data, "secret", path, f"{what} completions")
    header = reader.string(data, "header", path, f"{what} completions") or "Authorization"
    binding = reader.string(data, "recipientBinding", path, f"{what} completions")
    if secret is None:
        return None
    return Completions(secret, header.lower(), binding)


#: The highest request rate a connection may be given, per second and at once.
MOST_PER_SECOND = 10_000


def _rate(reader: Reader, item: dict[str, JSON], at: DataPath, what: str) -> Rate | None:
    """The requests per second (and at once, ``burst``: a second's worth unless given) the
    product takes over this connection; None: as many as the pool sends."""
    if "rate" not in item:
        return None
    path = (*at, "rate")
    data = reader.mapping(item["rate"], path, f"{what} rate")
    if data is None:
        return None
    reader.fields(data, path, f"{what} rate", ["perSecond"], ["burst"])
    if "perSecond" not in data:
        return None
    per_second = read_integer(reader, data, "perSecond", path, 1, 1, MOST_PER_SECOND)
    burst = read_integer(reader, data, "burst", path, per_second, 1, MOST_PER_SECOND)
    return Rate(per_second, burst)


def _verification(reader: Reader, value: JSON, at: DataPath, what: str) -> Verification:
    """How often the product is asked about a call whose outcome is unknown (its receipt,
    or the identical request) before the run is held, and how far apart."""
    path = (*at, "verification")
    data = reader.mapping(value, path, f"{what} verification")
    if data is None:
        return Verification()
    reader.fields(data, path, f"{what} verification", [], ["attempts", "spacing"])
    attempts = read_integer(reader, data, "attempts", path, Verification.attempts, 0, 20)
    spacing = read_duration(
        reader, data, "spacing", path, Verification.spacing, timedelta(seconds=1)
    )
    return Verification(attempts, spacing)
