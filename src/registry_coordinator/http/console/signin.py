"""Signing in and out of the console (OpenID Connect, authorization code flow with PKCE).

``GET /console/sign-in`` keeps a new login — state, nonce and PKCE verifier — in the
database for :data:`LOGIN_LIFETIME`, tied to this browser by a login cookie (SameSite=Lax,
so that it comes back on the issuer's redirect), and sends the browser to the issuer.
``GET /console/callback`` takes that login (once: a replayed callback finds nothing), checks
the state, trades the code for tokens with the verifier, checks them (:meth:`Issuer.exchange`)
and opens a session that ends when the access token does. It answers with a page that moves
on to the console by itself rather than a redirect: the session cookie is SameSite=Strict,
and a browser does not send a Strict cookie on a redirect chain that began at the issuer.
``POST /console/sign-out`` ends the session.
"""

from __future__ import annotations

import hmac
from datetime import UTC, datetime, timedelta

from quart import Response, request

from registry_coordinator.http.console.issuer import random_token
from registry_coordinator.http.console.render import html, redirect
from registry_coordinator.http.console.visitors import (
    checked_form,
    digest,
    login_cookie,
    origin,
    session_cookie,
    set_cookie,
    visitor,
)
from registry_coordinator.http.context import Context
from registry_coordinator.http.problems import Problem
from registry_coordinator.store import sessions

LOGIN_LIFETIME = timedelta(minutes=10)


def _redirect_uri(context: Context) -> str:
    return origin(context) + "/console/callback"


def _return_to(text: str | None) -> str:
    """Where to go after signing in: a console path only, never another site."""
    if text and text.startswith("/console/") and not text.startswith("/console//"):
        return text
    return "/console/"


async def sign_in(context: Context) -> Response:
    if not context.issuer.enabled:
        return redirect("/console/")
    login, state, nonce, verifier = random_token(), random_token(), random_token(), random_token()
    target = await context.issuer.authorization_url(_redirect_uri(context), state, nonce, verifier)
    await sessions.begin_login(
        context.db,
        digest(login),
        state,
        nonce,
        verifier,
        _return_to(request.args.get("next")),
        LOGIN_LIFETIME,
    )
    response = redirect(target)
    set_cookie(
        context,
        response,
        login_cookie(context),
        login,
        samesite="Lax",
        max_age=int(LOGIN_LIFETIME.total_seconds()),
    )
    return response


def _failed(detail: str) -> Problem:
    return Problem(400, "console.sign-in-failed", f"{detail}; sign in again")


async def callback(context: Context) -> Response:
    login = request.cookies.get(login_cookie(context))
    started = await sessions.take_login(context.db, digest(login)) if login else None
    if started is None:
        raise _failed("this sign-in was not started here, was used already or took too long")
    state = request.args.get("state", "")
    if not hmac.compare_digest(state.encode(), started.state.encode()):
        raise _failed("the issuer's answer is not for this sign-in (its state differs)")
    if "error" in request.args:
        said = request.args.get("error_description") or request.args["error"]
        raise _failed(f"the issuer did not sign you in: {said}")
    code = request.args.get("code")
    if not code:
        raise _failed("the issuer's answer holds no code")
    signed = await context.issuer.exchange(
        context.auth, code, _redirect_uri(context), started.verifier, started.nonce
    )
    caller = await context.auth.authenticate(f"Bearer {signed.access_token}")
    session = random_token()
    await sessions.open_session(
        context.db,
        digest(session),
        signed.access_token,
        random_token(),
        caller.actor,
        datetime.fromtimestamp(signed.expires_at, UTC),
    )
    response = html("signed_in.html", who=caller.actor, next=started.return_to)
    response.headers["Cache-Control"] = "no-store"
    set_cookie(context, response, session_cookie(context), session)
    set_cookie(context, response, login_cookie(context), "", samesite="Lax", max_age=0)
    return response


async def sign_out(context: Context) -> Response:
    who = await visitor(context)
    await checked_form(context, who)
    cookie = request.cookies.get(session_cookie(context))
    if cookie:
        await sessions.close_session(context.db, digest(cookie))
    response = html("signed_out.html")
    response.headers["Cache-Control"] = "no-store"
    set_cookie(context, response, session_cookie(context), "", max_age=0)
    return response
