"""How Coordinator proves itself to a product (a connection's ``identity``), read by
``engine.identity``: a bearer token the operator provisioned, or OAuth 2 client
credentials, by a secret or a private-key JWT, for one RFC 8707 resource, optionally under
Casework's task authority. Every secret is a reference, and none is ever in a repr.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    read_secret,
)


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


def read_identity(reader: Reader, value: JSON, path: DataPath, what: str) -> Identity | None:
    """A connection's identity at its product: a provisioned bearer token, or OAuth 2."""
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
        token = read_secret(reader, data, "bearer", path, what)
        return Bearer(token) if token else None
    return _oauth2(reader, data["oauth2"], (*path, "oauth2"), what)


#: The fields of an ``oauth2`` identity beside ``tokenUrl`` and ``clientId``.
_OAUTH2_OPTIONAL = [
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


def _oauth2(reader: Reader, value: JSON, at: DataPath, what: str) -> ClientCredentials | None:
    """Client credentials at a product's token endpoint, by a secret or a private key."""
    item = reader.mapping(value, at, f"{what} oauth2") or {}
    if "audience" in item:
        reader.report(
            "config.invalid-value",
            f"{what} oauth2 audience is no longer sent: the products' token endpoints take "
            "the RFC 8707 resource indicator",
            "write resource: with the product's resource (its token audience), and "
            "assertionAudience: only if the issuer wants another aud in the client assertion",
            (*at, "audience"),
        )
    reader.fields(item, at, f"{what} oauth2", ["tokenUrl", "clientId"], _OAUTH2_OPTIONAL)
    if ("clientSecret" in item) == ("privateKey" in item):
        reader.report(
            "config.invalid-value",
            f"{what} oauth2 needs exactly one of clientSecret and privateKey",
            "give clientSecret (client_secret_post) or privateKey (private_key_jwt)",
            at,
        )
        return None
    secret = read_secret(reader, item, "clientSecret", at, what) if "clientSecret" in item else None
    key = read_secret(reader, item, "privateKey", at, what) if "privateKey" in item else None
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
