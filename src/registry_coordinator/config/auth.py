"""The ``auth`` section, read by ``http.auth``: callers' JWTs checked against a key set
(a file, or an https URL re-read on a schedule), issuer and audience, and the policies that
say who may start, read and cancel which runs, or act as an operator. ``mode: none`` is for
local development and only on a loopback address.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.values import (
    LOOPBACK,
    https_or_loopback,
    read_duration,
)

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


DEFAULT_MAX_LIFETIME = timedelta(hours=1)  # auth.maxLifetime; also coordinator token's cap
#: The shortest interval between scheduled reads of the issuer's key set.
MINIMUM_JWKS_REFRESH = timedelta(seconds=1)


def read_auth(reader: Reader, value: JSON, base: Path, host: str) -> AuthConfig | None:
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
    lifetime = read_duration(
        reader, data, "maxLifetime", path, DEFAULT_MAX_LIFETIME, timedelta(seconds=10)
    )
    refresh = read_duration(
        reader, data, "jwksRefresh", path, timedelta(minutes=5), MINIMUM_JWKS_REFRESH
    )
    # Twice the refresh at least, so that a failed read is retried before tokens are refused.
    least = 2 * refresh
    max_stale = read_duration(
        reader, data, "jwksMaxStale", path, max(timedelta(hours=1), least), least
    )
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
