"""Fixtures for the browser tests: ``page`` (1280x800) and ``phone`` (390x844), each a watched
page in a context of its own; ``page_errors``, where a test declares the answers it provokes on
purpose; ``browser``, this process's Chromium, for a test that opens its own pages.

A test that used ``page`` or ``phone`` fails, after its body passed, when any of its pages
logged a console error (a CSP refusal is one), threw an uncaught error, had a request fail or
got an answer >= 400 that it did not declare with ``page_errors.expect(status=..., path=...)``.
When the body failed, those problems are shown in its report, as they are often the cause.
Browser tests are plain sync tests: Playwright's sync API runs its own loop, which
tests/browser/pages.py keeps out of the way of the Trio tests in the same process.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest
from playwright.sync_api import Browser, Page

from .pages import (
    DESKTOP,
    PHONE,
    Chromium,
    PageErrors,
    PageProblems,
    chromium_path,
    launched,
    open_page,
    require_chromium,
)


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """One Chromium per test process (each pytest-xdist worker): it takes longer to launch than
    most tests take to run."""
    with launched(require_chromium(chromium_path())) as launched_chromium:
        yield launched_chromium


@pytest.fixture
def browser(chromium: Chromium) -> Iterator[Browser]:
    with chromium.in_use() as in_use:
        yield in_use


@pytest.fixture
def page_errors() -> PageErrors:
    return PageErrors()


@pytest.fixture
def page(browser: Browser, page_errors: PageErrors) -> Iterator[Page]:
    with open_page(browser, DESKTOP, page_errors) as opened:
        yield opened


@pytest.fixture
def phone(browser: Browser, page_errors: PageErrors) -> Iterator[Page]:
    with open_page(browser, PHONE, page_errors) as opened:
        yield opened


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Check the test's pages after its body, so that what went wrong in them fails the test
    itself rather than erroring its teardown."""
    errors = item.funcargs.get("page_errors") if isinstance(item, pytest.Function) else None
    try:
        yield
    except BaseException:
        if isinstance(errors, PageErrors) and (problems := errors.problems):
            item.add_report_section("call", "browser", "\n".join(map(str, problems)))
        raise
    if isinstance(errors, PageErrors):
        try:
            errors.check()
        except PageProblems as problems:
            pytest.fail(str(problems), pytrace=False)
