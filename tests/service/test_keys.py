"""The issuer's key set stays current: a key the issuer removes stops working without a
restart, and a key set that cannot be read is trusted only for a bounded time.

The services here are real ``coordinator serve`` processes. Their JWKS is a file the
test rewrites, or a URL served by a small HTTP server on loopback that the test
controls: which keys it publishes, the caching headers it sends, whether it fails.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from registry_coordinator.config import AuthConfig, load_config
from registry_coordinator.http.auth import DEVELOPMENT_AUDIENCE, DEVELOPMENT_ISSUER, Authenticator
from registry_coordinator.http.problems import Problem
from tests.support import KEYS, POLICIES, Service, Services, call, coordinator, jwks, refused, token


def published(directory: Path, kids: list[str]) -> bytes:
    """A JWKS holding the public halves of the test keys named ``kids``."""
    document = json.loads(jwks(directory).read_text())
    return json.dumps({"keys": [k for k in document["keys"] if k["kid"] in kids]}).encode()


def publish(path: Path, kids: list[str]) -> None:
    """Replace the JWKS file at ``path`` atomically, as an issuer's deployment would."""
    staged = path.with_suffix(".new")
    staged.write_bytes(published(path.parent, kids))
    os.replace(staged, path)


class Issuer:
    """A JWKS endpoint on 127.0.0.1, and the status of every answer it gave, in order."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.kids = list(KEYS)
        self.headers: dict[str, str] = {}
        self.failing = False
        self.answers: list[int] = []
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status = 500 if issuer.failing else 200
                body = b"{}" if issuer.failing else published(issuer.directory, issuer.kids)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in issuer.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
                issuer.answers.append(status)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test reads answers, not a log

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def issuer(tmp_path: Path) -> Iterator[Issuer]:
    """The JWKS endpoint; a test asks for it before ``services``, so that the service is
    stopped before its issuer."""
    served = Issuer(tmp_path / "issuer")
    served.directory.mkdir()
    yield served
    served.close()


def jwt_auth(**settings: Any) -> dict[str, Any]:
    return {
        "mode": "jwt",
        "issuer": DEVELOPMENT_ISSUER,
        "audience": DEVELOPMENT_AUDIENCE,
        "policies": POLICIES,
        **settings,
    }


def serving(services: Services, **settings: Any) -> Service:
    """A service authenticating callers with ``settings`` (the JWKS and its refresh)."""
    return services(["timed-choice"], extra={"auth": jwt_auth(**settings)})


def wait(condition: Callable[[], bool], what: str) -> None:
    """Wait (at most 30 s) for ``condition()`` to hold."""
    for _ in range(300):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen")


def answers_until(service: Service, bearer: str, status: int) -> list[tuple[int, str | None]]:
    """Ask with ``bearer`` every 0.1 s until the answer is ``status`` (at most 300 times);
    every answer's status and problem code, in order."""
    seen: list[tuple[int, str | None]] = []
    for _ in range(300):
        response = call(service, "GET", "/v1/runs", bearer)
        code = response.json().get("code") if response.status_code >= 400 else None
        seen.append((response.status_code, code))
        if response.status_code == status:
            break
        time.sleep(0.1)
    return seen


def runs(seen: list[Any]) -> list[Any]:
    """``seen`` with repeats in a row collapsed: the order in which answers changed."""
    return [item for index, item in enumerate(seen) if index == 0 or seen[index - 1] != item]


def test_a_key_removed_from_the_jwks_file_is_refused_after_the_refresh(
    tmp_path: Path, services: Services
) -> None:
    path = jwks(tmp_path)
    service = serving(services, jwksFile=str(path), jwksRefresh="PT1S")
    removed, kept = token("case-portal", kid="rsa"), token("case-portal", kid="ed")
    assert call(service, "GET", "/v1/runs", removed).status_code == 200
    publish(path, ["ed", "ec"])
    seen = answers_until(service, removed, 401)
    assert runs(seen) == [(200, None), (401, "auth.unknown-key")], seen
    assert call(service, "GET", "/v1/runs", kept).status_code == 200
    publish(path, list(KEYS))  # put back: a token naming it is accepted again
    assert runs(answers_until(service, removed, 200))[-1] == (200, None)


@pytest.mark.parametrize(
    ("refresh", "headers"),
    [
        (None, {"Cache-Control": "public, max-age=1"}),  # shortens the default PT5M
        ("PT1H", {"Cache-Control": "max-age=3600", "Age": "3599"}),  # less its age
        ("PT1S", {"Cache-Control": "max-age=86400"}),  # never lengthens jwksRefresh
    ],
)
def test_a_key_removed_from_the_jwks_url_is_refused_after_its_refresh(
    issuer: Issuer, services: Services, refresh: str | None, headers: dict[str, str]
) -> None:
    issuer.headers = headers
    settings = {"jwksUrl": issuer.url, **({"jwksRefresh": refresh} if refresh else {})}
    service = serving(services, **settings)
    removed = token("case-portal", kid="rsa")
    assert call(service, "GET", "/v1/runs", removed).status_code == 200
    read_before = len(issuer.answers)
    issuer.kids = ["ed", "ec"]
    seen = answers_until(service, removed, 401)
    assert runs(seen) == [(200, None), (401, "auth.unknown-key")], seen
    assert len(issuer.answers) > read_before
    assert call(service, "GET", "/v1/runs", token("case-portal", kid="ec")).status_code == 200


def test_a_failing_jwks_url_keeps_the_last_good_set_for_a_bounded_time(
    issuer: Issuer, services: Services
) -> None:
    settings = {"jwksUrl": issuer.url, "jwksRefresh": "PT1S", "jwksMaxStale": "PT10S"}
    service = serving(services, **settings)
    bearer = token("case-portal", kid="rsa")
    assert call(service, "GET", "/v1/runs", bearer).status_code == 200
    issuer.failing = True
    wait(lambda: 500 in issuer.answers, "a failed read")
    # The last good set is younger than jwksMaxStale: still trusted.
    assert call(service, "GET", "/v1/runs", bearer).status_code == 200
    seen = answers_until(service, bearer, 503)
    assert runs(seen) == [(200, None), (503, "auth.keys-unavailable")], seen
    issuer.failing = False
    seen = answers_until(service, bearer, 200)
    assert set(seen[:-1]) <= {(503, "auth.keys-unavailable")} and seen[-1] == (200, None)
    service.stop()  # every read the issuer answered, and no more to come
    assert runs(issuer.answers) == [200, 500, 200], issuer.answers


def auth_config(jwks_file: Path, refresh: float, max_stale: float) -> AuthConfig:
    return AuthConfig(
        "jwt",
        jwks_file,
        None,
        DEVELOPMENT_ISSUER,
        DEVELOPMENT_AUDIENCE,
        timedelta(hours=1),
        (),
        timedelta(seconds=refresh),
        timedelta(seconds=max_stale),
    )


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait (at most 30 s) for ``condition()`` to hold."""
    for _ in range(300):
        if condition():
            return
        await trio.sleep(0.1)
    raise AssertionError(f"{what} did not happen")


@pytest.mark.trio
async def test_readiness_shows_whether_the_key_set_can_be_trusted(tmp_path: Path) -> None:
    path = tmp_path / "jwks.json"  # not there yet
    async with httpx.AsyncClient() as client, trio.open_nursery() as nursery:
        auth = Authenticator(auth_config(path, refresh=1, max_stale=5), client)
        never = auth.readiness()
        assert (never["ok"], never["keys"], never["refreshedAt"]) == (False, 0, None)
        await nursery.start(auth.run)
        missing = auth.readiness()
        assert (missing["ok"], missing["refreshedAt"]) == (False, None)
        assert "No such file" in missing["detail"], missing
        with pytest.raises(Problem) as caught:
            await auth.keys.key("ed")
        assert (caught.value.status, caught.value.code) == (503, "auth.keys-unavailable")

        publish(path, list(KEYS))
        await until(lambda: auth.readiness()["ok"], "the first read")
        good = auth.readiness()
        assert good["keys"] == len(KEYS) and good["refreshedAt"], good
        assert await auth.keys.key("ed") is not None

        path.write_text("{not json")
        await until(lambda: "Expecting" in auth.readiness()["detail"], "a failed read")
        kept = auth.readiness()
        assert kept["ok"] and kept["keys"] == len(KEYS), kept  # within jwksMaxStale
        await until(lambda: not auth.readiness()["ok"], "going stale")
        assert auth.readiness()["refreshedAt"] == kept["refreshedAt"]  # the last good read
        with pytest.raises(Problem) as caught:
            await auth.keys.key("ed")
        assert caught.value.code == "auth.keys-unavailable"

        publish(path, [])  # the issuer withdraws every key: taken at its word
        await until(lambda: auth.readiness()["refreshedAt"] != kept["refreshedAt"], "a read")
        emptied = auth.readiness()
        assert (emptied["ok"], emptied["keys"]) == (False, 0), emptied
        assert await auth.keys.key("ed") is None  # refused as auth.unknown-key
        nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_auth_mode_none_has_no_key_set_to_refresh(tmp_path: Path) -> None:
    config = replace(auth_config(tmp_path / "jwks.json", refresh=1, max_stale=2), mode="none")
    async with httpx.AsyncClient() as client:
        auth = Authenticator(config, client)
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(auth.run)  # returns; the nursery then has nothing to wait for
        assert auth.readiness()["ok"] is True


# --- configuration ------------------------------------------------------------------------

AUTH = (
    "database: {dsn: 'postgresql://coordinator@db/coordinator'}\n"
    "workflows: []\n"
    "auth:\n"
    "  mode: jwt\n"
    "  issuer: https://idp.example\n"
    "  audience: registry-coordinator\n"
    "  policies: []\n"
)
LINE = AUTH.count("\n") + 1  # the line the first added auth field is on


def configured(tmp_path: Path, *fields: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(AUTH + "".join(f"  {line}\n" for line in fields))
    return path


def test_the_key_set_refresh_has_defaults(tmp_path: Path) -> None:
    auth = load_config(configured(tmp_path, "jwksFile: jwks.json")).auth
    assert auth.jwks_refresh == timedelta(minutes=5)
    assert auth.jwks_max_stale == timedelta(hours=1)
    set_here = configured(
        tmp_path, "jwksFile: jwks.json", "jwksRefresh: PT1S", "jwksMaxStale: PT2S"
    )
    auth = load_config(set_here).auth
    assert (auth.jwks_refresh, auth.jwks_max_stale) == (timedelta(seconds=1), timedelta(seconds=2))


@pytest.mark.parametrize(
    "url",
    [
        "https://idp.example/jwks",
        "http://127.0.0.1:8081/jwks",
        "http://[::1]:8081/jwks",
        "http://localhost/jwks",
    ],
)
def test_a_jwks_url_is_https_or_on_loopback(tmp_path: Path, url: str) -> None:
    assert load_config(configured(tmp_path, f"jwksUrl: '{url}'")).auth.jwks_url == url


@pytest.mark.parametrize(
    "fields",
    [
        ["jwksUrl: http://idp.example/jwks"],
        ["jwksUrl: http://localhost.idp.example/jwks"],
        ["jwksUrl: http://127.0.0.1.idp.example/jwks"],
        ["jwksUrl: ftp://idp.example/jwks"],
        ["jwksUrl: idp.example/jwks"],
        ["jwksUrl: https:///jwks"],
        ["jwksUrl: 'http://[::1/jwks'"],
        ["jwksFile: jwks.json", "jwksRefresh: PT0.5S"],  # below the minimum
        ["jwksFile: jwks.json", "jwksRefresh: PT5M", "jwksMaxStale: PT9M"],  # not twice
    ],
)
def test_an_unsafe_jwks_url_or_refresh_is_refused_at_its_line(
    tmp_path: Path, fields: list[str]
) -> None:
    assert refused(configured(tmp_path, *fields)) == [
        ("config.invalid-value", LINE + len(fields) - 1)
    ]


def test_an_unreadable_refresh_is_refused_at_its_line(tmp_path: Path) -> None:
    path = configured(tmp_path, "jwksFile: jwks.json", "jwksRefresh: soon")
    assert refused(path) == [("duration.invalid", LINE + 1)]


def test_serve_refuses_a_plain_http_jwks_url_naming_the_field(tmp_path: Path) -> None:
    result = coordinator("serve", "--config", configured(tmp_path, "jwksUrl: http://idp.example/j"))
    assert result.returncode == 1
    assert "config.invalid-value" in result.stderr and "jwksUrl" in result.stderr
    assert "Traceback" not in result.stderr
