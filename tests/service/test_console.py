"""The operator console over HTTP, as a browser speaks to it: pages, headers, assets, sign-in
at the stand-in OpenID Connect issuer, and the checks on every form that changes something.

What a real browser adds — scripts under the CSP, live updates, the graphs — is in
tests/browser; here each answer's status, headers and cookies are read exactly.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from urllib.parse import parse_qs, urljoin, urlsplit

import httpx
import pytest

from registry_coordinator.http.console.render import CSP
from registry_coordinator.semantics.codes import RunState
from tests.support import (
    CONSOLE_CLIENT,
    HANG_ONCE,
    Forms,
    Service,
    Services,
    StandIns,
    events,
    held_notice,
    wait_state,
)

NOTIFY = {"notices": ("messaging", {"requestTimeout": "PT1S"})}
ACTION = "/v1/actions/mark-reviewed"  # act's invocation


def posted(products: StandIns, product: str, path: str) -> list[dict[str, object]]:
    """Every POST ``product`` received at exactly ``path``."""
    return [r for r in products.requests(product, "POST", path) if r["path"] == path]


def _form(page: str, button: str) -> tuple[str, dict[str, str]]:
    """Where the page's form with ``button`` goes, and a copy of its fields to fill in."""
    form = Forms(page).by_button(button)
    return form.action, dict(form.fields)


@pytest.fixture
def opened() -> Iterator[ExitStack]:
    """The browser-like clients a test opens, closed when it ends."""
    with ExitStack() as stack:
        yield stack


def sign_in(opened: ExitStack, service: Service, person: str) -> httpx.Client:
    """A browser-like client signed in to the console as ``person`` at the stand-in issuer,
    following every step the browser follows (closed with ``opened``)."""
    browser = opened.enter_context(httpx.Client(base_url=service.url, timeout=30))
    first = browser.get("/console/runs?state=held")
    assert first.status_code == 303, first.text
    assert first.headers["Location"] == "/console/sign-in?next=%2Fconsole%2Fruns%3Fstate%3Dheld"
    start = browser.get(first.headers["Location"])
    assert start.status_code == 303
    login = start.headers["set-cookie"]
    assert "console-login=" in login and "HttpOnly" in login and "SameSite=Lax" in login
    authorize = start.headers["Location"]
    query = parse_qs(urlsplit(authorize).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["redirect_uri"] == [service.url + "/console/callback"]
    page = httpx.get(authorize, timeout=10)
    action, fields = _form(page.text, f"Sign in as {person}")
    approved = httpx.get(urljoin(authorize, action), params=fields, timeout=10)
    assert approved.status_code == 303, approved.text
    callback = browser.get(approved.headers["Location"])
    assert callback.status_code == 200, callback.text
    session = callback.headers["set-cookie"]
    assert "console-session=" in session
    assert all(flag in session for flag in ("HttpOnly", "SameSite=Strict", "Path=/console"))
    assert 'http-equiv="refresh"' in callback.text
    assert "/console/runs?state=held" in callback.text
    browser.headers["Origin"] = service.url
    return browser


@pytest.fixture
def held(dsn: str, services: Services) -> tuple[Service, StandIns, str]:
    """A service whose console people sign in at the stand-in issuer, and one run held
    outcome-unknown (Messaging kept the message but its answer never came)."""
    service, products, run, _ = held_notice(dsn, services)
    return service, products, run


def test_an_operator_signs_in_and_reconciles_with_a_reason(
    dsn: str, held: tuple[Service, StandIns, str], opened: ExitStack
) -> None:
    service, products, run = held
    browser = sign_in(opened, service, "ada")
    landing = browser.get("/console/")
    assert landing.status_code == 200
    assert "Signed in as <strong>ada (registry-operators)</strong>" in landing.text
    assert f'id="held-{run}"' in landing.text
    assert "Nobody knows whether the product acted" in landing.text
    ask = browser.get(f"/console/runs/{run}/reconcile")
    _, fields = _form(ask.text, "Review…")
    refused = browser.post(f"/console/runs/{run}/reconcile/review", data=fields)
    assert refused.status_code == 400
    assert "give a reason" in refused.text
    fields["reason"] = "ticket OPS-7: Messaging shows the message"
    review = browser.post(f"/console/runs/{run}/reconcile/review", data=fields)
    assert review.status_code == 200
    assert "confirms the request: reconciling completes the step" in review.text
    action, confirm = _form(review.text, "Reconcile with the product now")
    assert confirm["reason"] == fields["reason"]
    moved = browser.post(action, data={**confirm, "seq": str(int(confirm["seq"]) - 1)})
    assert moved.status_code == 409  # what was confirmed is not how the run stands now
    assert "run.changed" in moved.text
    done = browser.post(action, data=confirm)
    assert done.status_code == 303, done.text
    assert done.headers["Location"] == f"/console/runs/{run}?done=reconcile"
    wait_state(dsn, run, RunState.FINISHED)
    reconciled = [e for e in events(dsn, run) if e["kind"] == "reconciled"]
    assert [(e["actor"], e["detail"]["reason"]) for e in reconciled] == [
        ("ada (registry-operators)", "ticket OPS-7: Messaging shows the message")
    ]
    # The notice was sent once. Messaging's receipt route (a read) was asked with its
    # original key twice: for the review page, and by the reconcile itself.
    [notice] = posted(products, "messaging", "/v1/messages")
    asked = posted(products, "messaging", "/v1/messages/receipt")
    assert [r["key"] for r in asked] == [notice["key"]] * 2
    page = browser.get(done.headers["Location"])
    assert "Reconcile confirmed the step" in page.text
    assert "ada (registry-operators)" in page.text


def test_a_form_without_its_token_or_from_elsewhere_changes_nothing(
    dsn: str, held: tuple[Service, StandIns, str], opened: ExitStack
) -> None:
    service, _, run = held
    browser = sign_in(opened, service, "ada")
    _, fields = _form(browser.get(f"/console/runs/{run}/cancel").text, "Review…")
    fields["reason"] = "forged"
    target = f"/console/runs/{run}/cancel"
    without = browser.post(target, data={"reason": "forged"})
    wrong = browser.post(target, data={**fields, "csrf": "x" * 43})
    elsewhere = browser.post(target, data=fields, headers={"Origin": "https://evil.example"})
    unnamed = httpx.post(
        service.url + target, data=fields, cookies=browser.cookies, headers={"Origin": ""}
    )
    for answer in (without, wrong, elsewhere, unnamed):
        assert answer.status_code == 403, answer.text
        assert "console.forged-request" in answer.text
    cookieless = httpx.post(service.url + target, data=fields, headers={"Origin": service.url})
    assert cookieless.status_code == 403
    assert "console.sign-in-needed" in cookieless.text
    assert [e["kind"] for e in events(dsn, run)][-1] == "held"


def test_a_caller_without_operator_rights_sees_no_actions_and_is_refused(
    dsn: str, held: tuple[Service, StandIns, str], opened: ExitStack
) -> None:
    service, _, run = held
    browser = sign_in(opened, service, "sam")
    page = browser.get(f"/console/runs/{run}")
    assert page.status_code == 200
    assert "sam (case-portal)" in page.text
    assert f"/console/runs/{run}/retry-same" not in page.text
    assert f"/console/runs/{run}/reconcile" not in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    forced = browser.post(
        f"/console/runs/{run}/retry-same", data={"csrf": csrf[1], "reason": "forcing it"}
    )
    assert forced.status_code == 403
    assert "auth.operator-required" in forced.text
    assert [e["kind"] for e in events(dsn, run)][-1] == "held"


def test_a_sign_in_is_used_once_and_sign_out_ends_the_session(
    held: tuple[Service, StandIns, str], opened: ExitStack
) -> None:
    service, _, _ = held
    browser = opened.enter_context(httpx.Client(base_url=service.url, timeout=30))
    start = browser.get("/console/sign-in")
    authorize = start.headers["Location"]
    action, fields = _form(httpx.get(authorize).text, "Sign in as ada")
    callback = httpx.get(urljoin(authorize, action), params=fields).headers["Location"]
    forged = browser.get(re.sub(r"state=[^&]+", "state=not-it", callback))
    assert forged.status_code == 400
    assert "console.sign-in-failed" in forged.text
    # The forged callback spent the login: the real one finds nothing either.
    replay = browser.get(callback)
    assert replay.status_code == 400
    assert "console.sign-in-failed" in replay.text

    signed = sign_in(opened, service, "ada")
    page = signed.get("/console/")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    out = signed.post("/console/sign-out", data={"csrf": csrf[1]})
    assert out.status_code == 200
    assert signed.get("/console/").status_code == 303


def test_every_page_has_the_headers_and_assets_are_immutable(dsn: str, services: Services) -> None:
    service, _ = services.deploy(["notify"], NOTIFY)
    run = service.start_run("notify", {"email": "b@example.org"})
    wait_state(dsn, run, RunState.FINISHED)
    pages = ["/console/", "/console/runs", f"/console/runs/{run}", "/console/workflows"]
    pages += ["/console/admission", "/console/health", "/console/no-such-page"]
    for path in pages:
        answer = service.http.get(path)
        assert answer.status_code == (404 if "no-such" in path else 200), (path, answer.text)
        assert answer.headers["Content-Security-Policy"] == CSP
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
    page = service.http.get(f"/console/runs/{run}")
    again = service.http.get(
        f"/console/runs/{run}", headers={"If-None-Match": page.headers["ETag"]}
    )
    assert again.status_code == 304
    assets = re.findall(r'(?:src|href)="(/console/assets/[^"]+)"', page.text)
    assert len(assets) == 3  # the stylesheet, the console's script, Graphviz
    for url in assets:
        asset = service.http.get(url)
        assert asset.status_code == 200
        assert asset.headers["Cache-Control"] == "public, max-age=31536000, immutable"
    stale = re.sub(r"/assets/[0-9a-f]+/", "/assets/000000000000/", assets[0])
    assert service.http.get(stale).status_code == 404


def test_filters_a_page_cannot_use_are_refused_with_a_page(dsn: str, services: Services) -> None:
    service, _ = services.deploy(["notify"], NOTIFY)
    for query in ("q=%00", "caller=a%00b", "since=yesterday", "state=lost", "cursor=zz"):
        answer = service.http.get(f"/console/runs?{query}")
        assert answer.status_code == 400, (query, answer.text)
        assert answer.headers["content-type"] == "text/html; charset=utf-8"
        assert "request.invalid-" in answer.text
    assert service.http.get("/console/runs/not-a-run").status_code == 404
    # auth mode none answers only to a loopback name (a rebound DNS name is not the console)
    rebound = service.http.get(
        "/console/", headers={"Host": f"evil.example:{urlsplit(service.url).port}"}
    )
    assert rebound.status_code == 403
    assert "console.forged-request" in rebound.text


def test_auth_mode_none_needs_no_sign_in_but_forms_need_the_token(
    dsn: str, services: Services
) -> None:
    service, _ = services.deploy(["notify"], NOTIFY)
    first = service.http.get("/console/runs")
    assert first.status_code == 200
    cookie = first.headers["set-cookie"]
    assert "console-csrf=" in cookie and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert service.http.get("/console/sign-in").headers["Location"] == "/console/"
    csrf = re.search(r'name="csrf" value="([^"]+)"', service.http.get("/console/admission").text)
    assert csrf is not None
    origin = {"Origin": service.url}
    forged = httpx.post(
        service.url + "/console/admission/hold",
        data={"csrf": csrf[1], "reason": "r"},
        headers=origin,
    )  # a page elsewhere cannot send the cookie
    assert forged.status_code == 403
    held = service.http.post(
        "/console/admission/hold", data={"csrf": csrf[1], "reason": "upgrade"}, headers=origin
    )
    assert held.status_code == 303
    refused = service.http.post(
        "/v1/runs",
        json={"workflow": "notify", "input": {"email": "c@example.org"}},
        headers={"Idempotency-Key": "k"},
    )
    assert refused.json()["code"] == "admission.held"
    after = service.http.get(held.headers["Location"])
    assert "New starts are now held." in after.text
    assert "upgrade" in after.text


def test_the_confirmation_shows_the_exact_bytes_and_what_reconcile_would_find(
    dsn: str, services: Services
) -> None:
    # Held at once: the engine does not ask BReg with the identical request itself.
    registry = {"requestTimeout": "PT1S", "verification": {"attempts": 0}}
    service, products = services.deploy(["act"], {"registry": ("breg", registry)})
    # The action's invocation hangs, not the reads that prepare it.
    products.faults("breg", {**HANG_ONCE, "match": f"POST {ACTION}$"})
    record = str(uuid.uuid4())
    run = service.start_run("act", {"recordId": record})
    wait_state(dsn, run, RunState.HELD)
    origin = {"Origin": service.url}
    page = service.http.get(f"/console/runs/{run}/reconcile")
    _, fields = _form(page.text, "Review…")
    fields["reason"] = "is it there?"
    nothing = service.http.post(
        f"/console/runs/{run}/reconcile/review", data=fields, headers=origin
    )
    assert nothing.status_code == 409  # BReg keeps no receipts, and no answer came back late
    assert "run.no-receipt" in nothing.text
    assert "Reconcile with the product now" not in nothing.text
    sent = posted(products, "breg", ACTION)
    assert len(sent) == 1
    retry = service.http.post(f"/console/runs/{run}/retry-same/review", data=fields, headers=origin)
    assert retry.status_code == 200
    assert "with exactly this body:" in retry.text
    assert record in retry.text.split("with exactly this body:")[1].split("</pre>")[0]
    assert [e["kind"] for e in events(dsn, run)][-1] == "held"  # nothing was done yet
    assert len(posted(products, "breg", ACTION)) == 1


def _cookie(header: str) -> tuple[str, str, set[str]]:
    """A Set-Cookie header's name, value and attributes (in lower case)."""
    first, *attributes = [part.strip() for part in header.split(";")]
    name, _, value = first.partition("=")
    return name, value, {attribute.lower() for attribute in attributes}


def test_served_over_https_the_cookies_are_secure_and_for_this_host_only(
    dsn: str, services: Services
) -> None:
    public = "https://localhost:8443"  # a TLS proxy in front, as in production
    service, _ = services.deploy(
        ["notify"],
        NOTIFY,
        sign_in=True,
        extra={"console": {"clientId": CONSOLE_CLIENT, "publicUrl": public}},
    )
    start = httpx.get(service.url + "/console/sign-in")
    name, login, flags = _cookie(start.headers["set-cookie"])
    assert name == "__Host-console-login"
    assert {"secure", "httponly", "path=/", "samesite=lax"} <= flags
    authorize = start.headers["Location"]
    assert parse_qs(urlsplit(authorize).query)["redirect_uri"] == [public + "/console/callback"]
    action, fields = _form(httpx.get(authorize).text, "Sign in as ada")
    back = urlsplit(httpx.get(urljoin(authorize, action), params=fields).headers["Location"])
    assert f"{back.scheme}://{back.netloc}" == public
    callback = httpx.get(
        f"{service.url}{back.path}?{back.query}", headers={"Cookie": f"{name}={login}"}
    )
    assert callback.status_code == 200, callback.text
    sessions = [_cookie(h) for h in callback.headers.get_list("set-cookie")]
    [(session_name, session, session_flags)] = [c for c in sessions if c[1]]
    assert session_name == "__Host-console-session"
    assert {"secure", "httponly", "path=/", "samesite=strict"} <= session_flags
    cookie = {"Cookie": f"{session_name}={session}"}
    page = httpx.get(service.url + "/console/", headers=cookie)
    assert "Signed in as <strong>ada (registry-operators)</strong>" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert csrf is not None
    plain = httpx.post(
        service.url + "/console/sign-out",
        data={"csrf": csrf[1]},
        headers={**cookie, "Origin": service.url},  # not the origin browsers use
    )
    assert plain.status_code == 403
    out = httpx.post(
        service.url + "/console/sign-out",
        data={"csrf": csrf[1]},
        headers={**cookie, "Origin": public},
    )
    assert out.status_code == 200
