"""How the console answers: pages from Jinja2 templates, the headers every answer carries,
and the static assets, all from the package (no CDN: the machines may have no internet).

Templates are autoescaped and strict (an undefined name is an error, not an empty
string). Every answer carries a Content-Security-Policy that allows no inline script or
style and nothing from elsewhere; the one thing beyond ``'self'`` is
``'wasm-unsafe-eval'``, which lets the vendored Graphviz (Viz.js) compile its
WebAssembly while ``eval`` stays blocked. Assets are served under a path holding the
hash of them all, so a browser may keep them for a year and an upgrade is seen at once.
Pages carry an ETag of their body: the live view asks again with If-None-Match and gets
304 while nothing changed.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import resources

import jinja2
from quart import Response, request

from registry_coordinator.authoring.canonical import JSON
from registry_coordinator.authoring.expressions import format_instant

CSP = (
    "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make the browser send Origin: null
    "X-Frame-Options": "DENY",
}
_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


@cache
def assets() -> dict[str, bytes]:
    """Every static asset by its name under ``static/`` (vendored ones as ``vendor/...``)."""
    root = resources.files(__package__).joinpath("static")
    found: dict[str, bytes] = {}
    for entry in root.iterdir():
        if entry.is_dir():
            for inner in entry.iterdir():
                if inner.is_file():
                    found[f"{entry.name}/{inner.name}"] = inner.read_bytes()
        elif entry.is_file() and not entry.name.endswith(".json"):
            found[entry.name] = entry.read_bytes()
    return found


@cache
def asset_version() -> str:
    """A hash over every asset: the path segment that makes their URLs immutable."""
    digest = hashlib.sha256()
    for name, content in sorted(assets().items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()[:12]


def asset_url(name: str) -> str:
    if name not in assets():
        raise KeyError(f"no console asset {name}")
    return f"/console/assets/{asset_version()}/{name}"


def asset(version: str, name: str) -> Response | None:
    """The asset ``name`` for a URL of this version; None for anything else."""
    content = assets().get(name)
    if content is None or version != asset_version():
        return None
    suffix = name[name.rfind(".") :]
    response = Response(content, content_type=_TYPES.get(suffix, "application/octet-stream"))
    response.headers.update(HEADERS)
    response.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    return response


def _instant(value: datetime | None) -> str:
    return format_instant(value) if value is not None else "—"


def _ago(value: datetime | None) -> str:
    """How long ago, in the largest whole unit: what an operator scans a list by."""
    if value is None:
        return "—"
    seconds = int((datetime.now(UTC) - value).total_seconds())
    if seconds < 0:
        return "in the future"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"


def span(value: timedelta | None) -> str:
    """A duration in its two largest units, or milliseconds under a second: how long a run
    or a step took, or has been waiting."""
    if value is None:
        return "—"
    seconds = value.total_seconds()
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size} {unit}")
            whole %= size
    return " ".join(parts[:2])


def _pretty(value: JSON) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("registry_coordinator.http.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(instant=_instant, ago=_ago, pretty=_pretty, span=span)
    env.globals.update(asset=asset_url)
    return env


def html(template: str, status: int = 200, **values: object) -> Response:
    """A page: the template rendered, with the console's headers and an ETag of its body,
    answered 304 when the browser already holds exactly this."""
    body = environment().get_template(template).render(**values).encode()
    tag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    if status == 200 and request.headers.get("If-None-Match") == tag:
        response = Response(b"", status=304)
    else:
        response = Response(body, status=status, content_type="text/html; charset=utf-8")
    response.headers.update(HEADERS)
    response.headers["Cache-Control"] = "no-store" if status != 200 else "no-cache, private"
    if status == 200:
        response.headers["ETag"] = tag
    return response


def redirect(location: str, status: int = 303) -> Response:
    response = Response(b"", status=status, headers={"Location": location})
    response.headers.update(HEADERS)
    response.headers["Cache-Control"] = "no-store"
    return response
