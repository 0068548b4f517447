"""The browser harness proves itself against a real loopback HTTP server whose pages are served
under a strict Content-Security-Policy: a clean page passes, and each kind of problem in a page
is found by the collector (these tests pass because it found them)."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from .pages import (
    DEFAULT_CHROMIUM,
    DESKTOP,
    PageErrors,
    PageProblems,
    chromium_path,
    open_page,
    require_chromium,
    screenshot,
)

CSP = "default-src 'self'"


def _html(title: str, body: str) -> bytes:
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width">'
        f'<title>{title}</title><link rel="stylesheet" href="/site.css"></head>'
        f"<body>{body}</body></html>"
    ).encode()


def _script(name: str) -> str:
    return f'<p id="said">not yet</p><script src="/{name}.js"></script>'


_SAY = 'document.getElementById("said").textContent = '
ROUTES: dict[str, tuple[int, str, bytes]] = {
    "/clean": (200, "text/html", _html("clean", _script("said"))),
    "/said.js": (200, "text/javascript", f'{_SAY}"ran";'.encode()),
    "/logs-error": (200, "text/html", _html("logs-error", _script("logs-error"))),
    "/logs-error.js": (200, "text/javascript", b'console.error("deliberate console error");'),
    "/inline-script": (
        200,
        "text/html",
        _html("inline-script", '<script>document.title = "inline ran";</script>'),
    ),
    "/throws": (200, "text/html", _html("throws", _script("throws"))),
    "/throws.js": (200, "text/javascript", b'throw new Error("deliberate throw");'),
    "/fetches": (200, "text/html", _html("fetches", _script("fetches"))),
    "/fetches.js": (
        200,
        "text/javascript",
        f'fetch("/forbidden").then((answer) => {{ {_SAY}String(answer.status); }});'.encode(),
    ),
    "/forbidden": (403, "text/plain", b"forbidden on purpose"),
    "/live": (200, "text/html", _html("live", _script("live"))),
    "/live.js": (
        200,
        "text/javascript",
        f'new EventSource("/events").onmessage = (event) => {{ {_SAY}event.data; }};'.encode(),
    ),
    "/still": (
        200,
        "text/html",
        _html("still", '<input autofocus aria-label="name"><div class="spinner"></div>'),
    ),
    "/site.css": (
        200,
        "text/css",
        b".spinner { width: 4rem; height: 4rem; background: #036;"
        b" animation: spin 1s linear infinite; }"
        b" @keyframes spin { to { transform: rotate(360deg); } }",
    ),
    "/favicon.ico": (204, "image/x-icon", b""),
}


class _Site(BaseHTTPRequestHandler):
    """ROUTES under the CSP, and /events: a live stream that stays open until the browser
    leaves (bounded, so a lost client cannot keep a thread forever)."""

    def do_GET(self) -> None:
        if self.path == "/events":
            self._stream()
            return
        status, content_type, body = ROUTES.get(self.path, (404, "text/plain", b"no such page"))
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            self.wfile.write(b"data: open\n\n")
            for _ in range(200):
                self.wfile.flush()
                time.sleep(0.05)
                self.wfile.write(b": still here\n\n")
        except (BrokenPipeError, ConnectionResetError):
            return

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest shows what the test asserts, not every request."""


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_clean_page_passes_under_its_csp(page: Page, site: str) -> None:
    answer = page.goto(f"{site}/clean")
    assert answer is not None
    assert answer.headers["content-security-policy"] == CSP
    expect(page.locator("#said")).to_have_text("ran")


@pytest.mark.parametrize(
    ("path", "kind", "at", "text"),
    [
        ("/logs-error", "console error", "/logs-error.js", "deliberate console error"),
        ("/inline-script", "console error", "/inline-script", "Content Security Policy"),
        ("/throws", "uncaught error", "/throws", "Error: deliberate throw"),
    ],
)
def test_the_collector_finds_each_problem(
    browser: Browser, site: str, path: str, kind: str, at: str, text: str
) -> None:
    errors = PageErrors()
    with open_page(browser, DESKTOP, errors) as watched:
        watched.goto(site + path)
        expect(watched).to_have_title(path.strip("/"))
    with pytest.raises(PageProblems, match=text) as caught:
        errors.check()
    [problem] = caught.value.problems
    assert (problem.kind, problem.url) == (kind, site + at)
    assert text in str(caught.value)


def test_an_answer_is_a_problem_until_the_test_expects_it(browser: Browser, site: str) -> None:
    errors = PageErrors()
    with open_page(browser, DESKTOP, errors) as watched:
        watched.goto(f"{site}/fetches")
        expect(watched.locator("#said")).to_have_text("403")
    forbidden = f"{site}/forbidden"
    found = {(problem.kind, problem.url, problem.status) for problem in errors.problems}
    assert found == {("answer", forbidden, 403), ("console error", forbidden, 403)}
    assert len(errors.problems) == 2
    errors.expect(status=403, path="/elsewhere")
    assert len(errors.problems) == 2
    errors.expect(status=403, path="/forbidden")
    assert errors.problems == []
    errors.check()


def test_leaving_a_page_with_a_live_stream_is_no_problem(page: Page, site: str) -> None:
    page.goto(f"{site}/live")
    expect(page.locator("#said")).to_have_text("open")
    with page.expect_event("requestfailed") as aborted:
        page.goto(f"{site}/clean")
    assert aborted.value.failure == "net::ERR_ABORTED"
    expect(page.locator("#said")).to_have_text("ran")


def test_page_and_phone_have_their_widths(page: Page, phone: Page, site: str) -> None:
    for opened in (page, phone):
        opened.goto(f"{site}/clean")
        expect(opened.locator("#said")).to_have_text("ran")
    assert (page.evaluate("innerWidth"), phone.evaluate("innerWidth")) == (1280, 390)


def _png_size(png: bytes) -> tuple[int, int]:
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def test_screenshots_do_not_churn(page: Page, site: str, tmp_path: Path) -> None:
    page.goto(f"{site}/still")
    expect(page.get_by_label("name")).to_be_focused()
    first = screenshot(page, "still", tmp_path).read_bytes()
    page.wait_for_timeout(600)  # the caret would blink and the spinner move meanwhile
    second = screenshot(page, "still", tmp_path).read_bytes()
    assert first == second
    assert _png_size(first)[0] == DESKTOP.width
    with pytest.raises(ValueError, match="lower-case letters"):
        screenshot(page, "../still", tmp_path)


@pytest.mark.parametrize("exists", [False, True], ids=["absent", "not-executable"])
def test_a_missing_chromium_fails_in_one_line(tmp_path: Path, exists: bool) -> None:
    missing = tmp_path / "chromium"
    if exists:
        missing.write_text("")
    with pytest.raises(pytest.fail.Exception) as caught:
        require_chromium(missing)
    assert caught.value.msg == (
        f"chromium not found at {missing}: apt-get install chromium fonts-liberation"
        " (./run test does this when run as root)"
    )


def test_chromium_is_found_at_chromium_or_debians_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CHROMIUM", str(tmp_path / "chromium"))
    assert chromium_path() == tmp_path / "chromium"
    monkeypatch.delenv("CHROMIUM")
    assert chromium_path() == DEFAULT_CHROMIUM
