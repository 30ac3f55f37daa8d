"""Headless Chromium for the browser tests (Playwright + Debian's ``chromium``): found or
skipped on a developer machine, a failure in CI (``$CI`` set), so CI cannot pass without them."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

try:
    from playwright import sync_api as playwright_api
except ImportError:  # pragma: no cover - depends on the machine
    playwright_api = None  # type: ignore[assignment]


def in_ci() -> bool:
    """``$CI`` is set (GitHub Actions, GitLab, ``.ci/run`` ...) and not ``0``/``false``."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def find_chromium() -> str | None:
    """``$CHROMIUM`` if it is an executable, else ``chromium``/``chromium-browser`` on PATH."""
    override = os.environ.get("CHROMIUM")
    if override:
        return shutil.which(override)
    return shutil.which("chromium") or shutil.which("chromium-browser")


def require_browser(what: str) -> str:
    """The chromium binary; skips (fails under ``$CI``) without it or without Playwright."""
    chromium = find_chromium()
    missing = []
    if playwright_api is None:
        missing.append("Playwright's Python package (pip install -e '.[dev]')")
    if chromium is None:
        missing.append("a chromium binary (apt-get install chromium, or set $CHROMIUM)")
    if missing:
        reason = f"{what} needs {' and '.join(missing)}"
        if in_ci():
            pytest.fail(f"{reason}; $CI is set, so it must run", pytrace=False)
        pytest.skip(reason)
    assert chromium is not None
    return chromium


@contextmanager
def chromium_page(chromium: str) -> Iterator[Any]:
    """A page of a fresh headless Chromium, closed at the end."""
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 900})
        finally:
            browser.close()
