"""The browser tests' harness: one Chromium per test process, pages watched for everything that
goes wrong in them, and screenshots for the docs.

Invariants:
- Playwright's sync API needs its asyncio loop as the thread's running loop, and it leaves it
  there after every call; the rest of the suite runs Trio in the same worker thread, where a
  leftover running loop is not wanted (a test that runs asyncio code, or a library probing
  for a running loop, would find Playwright's). So Playwright's loop is the running loop only
  inside :meth:`Chromium.in_use` (one browser test), and the thread is handed back with none.
- Playwright is started under asyncio's default event loop policy, whatever another library in
  the process set (trio-asyncio's, for one, makes ``asyncio.new_event_loop()`` a Trio-backed
  loop, on which Playwright's driver cannot run).
- A browser test is never skipped: without chromium it fails with one line saying how to get it.
- Whatever goes wrong in a page fails its test (:class:`PageErrors`) unless the test declared it
  expected; a strict Content-Security-Policy's refusals are console errors, so they count too.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    Response,
    WebError,
    sync_playwright,
)

DEFAULT_CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"

# Chromium's console line for an answer >= 400; it repeats what the answer itself reports, and
# the test's expectation for that answer covers both.
_FAILED_ANSWER = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")
# The browser aborts a page's open requests (a live-update stream) whenever it navigates away.
_ABORTED = "net::ERR_ABORTED"
_SCREENSHOT_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def chromium_path() -> Path:
    """$CHROMIUM where chromium lives elsewhere, Debian's package otherwise."""
    return Path(os.environ.get("CHROMIUM", DEFAULT_CHROMIUM))


def require_chromium(executable: Path) -> Path:
    """Fail (never skip) the browser tests when chromium is missing: CI must not pass them by
    not running them."""
    if not (executable.is_file() and os.access(executable, os.X_OK)):
        pytest.fail(
            f"chromium not found at {executable}: apt-get install chromium fonts-liberation"
            " (./run test does this when run as root)",
            pytrace=False,
        )
    return executable


@dataclass(frozen=True)
class Chromium:
    """A launched Chromium and the asyncio loop its Playwright driver runs on."""

    browser: Browser
    loop: asyncio.AbstractEventLoop

    @contextmanager
    def in_use(self) -> Iterator[Browser]:
        """The browser, for one test: Playwright's loop is the thread's running loop until the
        test ends (its sync calls need it), then no loop is, for the Trio tests after it."""
        asyncio.events._set_running_loop(self.loop)
        try:
            yield self.browser
        finally:
            asyncio.events._set_running_loop(None)


@contextmanager
def launched(executable: Path) -> Iterator[Chromium]:
    """Start Playwright's driver and a headless Chromium, and stop both at the end. Chromium's
    sandbox refuses to run as root, as CI does, so it is off: the tests load only their own
    pages."""
    asyncio.set_event_loop_policy(asyncio.DefaultEventLoopPolicy())
    try:
        playwright = sync_playwright().start()
    finally:
        asyncio.set_event_loop_policy(None)
    loop = asyncio.get_running_loop()
    try:
        browser = playwright.chromium.launch(executable_path=executable, chromium_sandbox=False)
        asyncio.events._set_running_loop(None)
        yield Chromium(browser, loop)
    finally:
        asyncio.events._set_running_loop(loop)
        playwright.stop()
        asyncio.events._set_running_loop(None)


@dataclass(frozen=True)
class Problem:
    """One thing that went wrong in a page, and the URL it concerns; ``status`` is the HTTP
    status for an answer >= 400 and for Chromium's console line about it."""

    kind: str
    url: str
    text: str
    status: int | None = None

    def __str__(self) -> str:
        return f"{self.kind} at {self.url}: {self.text}"


@dataclass(frozen=True)
class Expected:
    """An answer a test provokes on purpose: this status, at this path or at any."""

    status: int
    path: str | None

    def covers(self, problem: Problem) -> bool:
        return problem.status == self.status and (
            self.path is None or urlsplit(problem.url).path == self.path
        )


class PageProblems(AssertionError):
    """What went wrong in a test's pages that the test did not declare expected."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  {problem}" for problem in problems)
        super().__init__(
            f"{len(problems)} unexpected problem(s) in the browser (declare an answer the test"
            f" provokes with page_errors.expect(status=..., path=...)):\n{lines}"
        )


class PageErrors:
    """Collects, from every page of the contexts it watches, console errors, uncaught errors,
    failed requests and answers >= 400; :meth:`check` fails with those not expected."""

    def __init__(self) -> None:
        self._seen: list[Problem] = []
        self._expected: list[Expected] = []

    def expect(self, *, status: int, path: str | None = None) -> None:
        """Declare answers with ``status`` (at ``path``, or anywhere) part of the test, such as
        the 403 an action without operator rights gets."""
        self._expected.append(Expected(status, path))

    def watch(self, context: BrowserContext) -> None:
        context.on("console", self._console)
        context.on("weberror", self._web_error)
        context.on("requestfailed", self._request_failed)
        context.on("response", self._response)

    @property
    def problems(self) -> list[Problem]:
        return [seen for seen in self._seen if not any(e.covers(seen) for e in self._expected)]

    def check(self) -> None:
        if problems := self.problems:
            raise PageProblems(problems)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type != "error":
            return
        answered = _FAILED_ANSWER.match(message.text)
        status = int(answered.group(1)) if answered else None
        self._seen.append(Problem("console error", message.location["url"], message.text, status))

    def _web_error(self, web_error: WebError) -> None:
        url = web_error.page.url if web_error.page else "(no page)"
        error = web_error.error
        self._seen.append(Problem("uncaught error", url, f"{error.name}: {error.message}"))

    def _request_failed(self, request: Request) -> None:
        if request.failure != _ABORTED:
            self._seen.append(Problem("failed request", request.url, f"{request.failure}"))

    def _response(self, response: Response) -> None:
        if response.status >= 400:
            text = f"{response.request.method} answered {response.status} {response.status_text}"
            self._seen.append(Problem("answer", response.url, text, response.status))


@dataclass(frozen=True)
class Screen:
    width: int
    height: int
    mobile: bool


DESKTOP = Screen(1280, 800, mobile=False)
# A phone honours the page's viewport meta tag, as a real one does.
PHONE = Screen(390, 844, mobile=True)


@contextmanager
def open_page(browser: Browser, screen: Screen, errors: PageErrors) -> Iterator[Page]:
    """A page in a context of its own, watched by ``errors``. Locale, time zone, colour scheme
    and motion are fixed so that pages, and their screenshots, read the same on every machine."""
    context = browser.new_context(
        viewport={"width": screen.width, "height": screen.height},
        is_mobile=screen.mobile,
        has_touch=screen.mobile,
        locale="en-GB",
        timezone_id="UTC",
        color_scheme="light",
        reduced_motion="reduce",
    )
    try:
        errors.watch(context)
        yield context.new_page()
    finally:
        context.close()


def screenshot(page: Page, name: str, directory: Path = SCREENSHOTS) -> Path:
    """Write the whole page to docs/console/NAME.png for the docs. The caret is hidden and
    animations stopped, so a page that did not change gives the same bytes and git sees no
    change."""
    if not _SCREENSHOT_NAME.fullmatch(name):
        raise ValueError(
            f"screenshot name {name!r}: use lower-case letters, digits and hyphens"
            " (it becomes NAME.png)"
        )
    path = directory / f"{name}.png"
    page.screenshot(path=path, full_page=True, caret="hide", animations="disabled")
    return path
