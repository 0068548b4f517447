"""Who is looking at the console, and whether a form they sent is theirs.

A signed-in person holds one cookie: a random session id, HttpOnly, SameSite=Strict,
Secure (and ``__Host-``) when the console is served over https. The database keeps only
its SHA-256 (a leaked table opens no session) with the access token, which stays on the
server: no token ever reaches the page's JavaScript or localStorage. Every request
checks that token again exactly as the API checks a bearer token, so an expired token or
a withdrawn key ends the session, and the person acts under the API's policies.

Every form that changes something carries the session's CSRF token and must come from
the console's own origin (the browser's Origin header); either missing is refused 403.
In auth mode none nobody signs in: the visitor is the local developer, and the CSRF token
is a random cookie the form must repeat (a page elsewhere can neither read it nor set it).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from quart import Response, g, request

from registry_coordinator.config import LOOPBACK
from registry_coordinator.http.auth import Caller
from registry_coordinator.http.console.issuer import random_token
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.store import sessions

CSRF_COOKIE = "console-csrf"


@dataclass(frozen=True)
class Visitor:
    caller: Caller
    csrf: str
    signed_in: bool  # a person signed in; False in auth mode none
    new_csrf_cookie: bool = False  # auth mode none: the CSRF cookie must be set on the answer


class SignInNeeded(Exception):
    """The visitor must sign in first (no session, or its token no longer checks out)."""


def digest(value: str) -> bytes:
    return hashlib.sha256(value.encode()).digest()


def secure(context: Context) -> bool:
    """Whether the console is served over https, so its cookies are Secure."""
    public = context.issuer.console.public_url
    return (public or request.host_url).startswith("https://")


def origin(context: Context) -> str:
    """This console's origin, as browsers name it in the Origin header."""
    public = context.issuer.console.public_url
    parts = urlsplit(public or request.host_url)
    return f"{parts.scheme}://{parts.netloc}"


def session_cookie(context: Context) -> str:
    return "__Host-console-session" if secure(context) else "console-session"


def login_cookie(context: Context) -> str:
    """The cookie that ties a sign-in in progress to this browser; ``__Host-`` under https,
    so that no other host of the domain can plant one (a login CSRF)."""
    return "__Host-console-login" if secure(context) else "console-login"


def set_cookie(
    context: Context, response: Response, name: str, value: str, **options: object
) -> None:
    """Set a console cookie: HttpOnly, Strict unless said otherwise, Secure over https; a
    ``__Host-`` cookie is for the whole origin (the prefix requires Path=/)."""
    path = "/" if name.startswith("__Host-") else "/console"
    response.set_cookie(
        name,
        value,
        path=path,
        httponly=True,
        secure=secure(context),
        samesite=str(options.pop("samesite", "Strict")),
        **options,  # type: ignore[arg-type]
    )


async def visitor(context: Context) -> Visitor:
    """Who sent this request: the signed-in person's caller, or the local developer in auth
    mode none; raises :class:`SignInNeeded` when someone must sign in first. Named in the
    request's access log line."""
    found = await _visitor(context)
    g.caller = found.caller.actor
    return found


async def _visitor(context: Context) -> Visitor:
    if not context.issuer.enabled:
        if urlsplit(request.host_url).hostname not in LOOPBACK:
            # auth mode none listens on loopback only; a page elsewhere reaching it by a
            # name of its own (DNS rebinding) must not pass for the console's origin.
            raise Problem(
                403,
                "console.forged-request",
                f"in auth mode none the console answers only on a loopback address, not "
                f"{request.host}: open it at 127.0.0.1 or localhost",
            )
        caller = await context.auth.authenticate(None)
        csrf = request.cookies.get(CSRF_COOKIE)
        if csrf:
            return Visitor(caller, csrf, signed_in=False)
        return Visitor(caller, random_token(), signed_in=False, new_csrf_cookie=True)
    cookie = request.cookies.get(session_cookie(context))
    if not cookie:
        raise SignInNeeded
    kept = await sessions.session(context.db, digest(cookie))
    if kept is None:
        raise SignInNeeded
    try:
        caller = await context.auth.authenticate(f"Bearer {kept.access_token}")
    except Problem as refused:
        if refused.status != 401:
            raise  # 503: the issuer's keys cannot be read; not the visitor's doing
        await sessions.close_session(context.db, digest(cookie))
        raise SignInNeeded from None
    return Visitor(caller, kept.csrf, signed_in=True)


def sign_in_location() -> str:
    """Where to send a visitor who must sign in, to come back to this page after."""
    back = request.full_path.rstrip("?") if request.method == "GET" else "/console/"
    return "/console/sign-in?next=" + quote(back, safe="")


async def checked_form(context: Context, who: Visitor) -> dict[str, str]:
    """The form a visitor sent, once it is shown to be theirs: from this origin, with the
    visitor's CSRF token; a 403 Problem otherwise, and nothing is done."""
    form = await request.form
    sent_from = request.headers.get("Origin")
    if sent_from != origin(context):
        raise Problem(
            403,
            "console.forged-request",
            f"the form came from {sent_from or 'an unnamed origin'}, not {origin(context)}: "
            "send it from the console's own page",
        )
    token = form.get("csrf", "")
    if not hmac.compare_digest(token.encode(), who.csrf.encode()):
        raise Problem(
            403,
            "console.forged-request",
            "the form's CSRF token is missing or not this session's: reload the page and "
            "send it again",
        )
    return {name: form[name] for name in form}
