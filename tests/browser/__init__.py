"""Tests in a real browser: Playwright's sync API driving Debian's chromium (tests/browser/pages.py
holds the harness, conftest.py its fixtures)."""
