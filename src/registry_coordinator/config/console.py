"""The ``console`` section, read by ``http.console``: how people sign in at the issuer of
``auth`` (OpenID Connect with PKCE, a public client with no secret to keep), the scopes
asked for, and the https origin browsers reach the console at.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.fields import Reader
from registry_coordinator.authoring.source import DataPath
from registry_coordinator.config.auth import AuthConfig
from registry_coordinator.config.values import (
    https_or_loopback,
)


@dataclass(frozen=True)
class ConsoleConfig:
    """How the operator console signs people in at the issuer of ``auth`` (OpenID Connect,
    authorization code with PKCE, as a public client: there is no secret to keep)."""

    client_id: str | None  # None: no sign-in (auth mode none, or no console section)
    public_url: str | None  # where browsers reach this service; None: as each request says
    scopes: tuple[str, ...]  # asked for at sign-in: openid and the scopes the policies name


def read_console(reader: Reader, value: JSON, auth: AuthConfig | None) -> ConsoleConfig:
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
