"""End to end in headless Chromium: log in, see held locks, force-release them with the admin
action (tick a box, the select-all box, the action form, the confirmation page).

Needs Playwright's Python package and a Chromium binary (Debian: ``chromium``; or ``$CHROMIUM``).
Without them the test is skipped on a developer machine, but it **fails** in CI (``$CI`` set, as
CI services and ``.ci/run`` do), so CI cannot pass without running it.
``REDLOCK_SCREENSHOTS=1`` also writes the screenshots into ``docs/images/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock import inspection as inspect
from django_redlock import locks
from django_redlock.testing.server import find_redis_server
from tests.support.browser import chromium_page, find_chromium, in_ci, playwright_api

ROOT = Path(__file__).resolve().parents[2]
DOCS_IMAGES = ROOT / "docs" / "images"
BROWSER_TEST = "tests/operations/test_admin_browser.py::test_login_see_and_force_release"


CHROMIUM = find_chromium()


@pytest.fixture
def browser_available() -> None:
    """Skip without Playwright or Chromium, except in CI, where that is a failure."""
    missing = []
    if playwright_api is None:
        missing.append("Playwright's Python package (pip install -e '.[dev]')")
    if CHROMIUM is None:
        missing.append("a chromium binary (apt-get install chromium, or set $CHROMIUM)")
    if not missing:
        return
    reason = f"the admin browser test needs {' and '.join(missing)}"
    if in_ci():
        pytest.fail(f"{reason}; $CI is set, so it must run", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def page(browser_available: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    # Playwright's sync API keeps an event loop on this thread; the test's own ORM calls are
    # still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    assert CHROMIUM is not None
    with chromium_page(CHROMIUM) as page:
        yield page


def shoot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / name), full_page=True)
    if os.environ.get("REDLOCK_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(exist_ok=True)
        shutil.copy(tmp_path / name, DOCS_IMAGES / name)


def run_action(page: Any) -> None:
    """Choose the force-release action, press Go, and confirm on the confirmation page."""
    page.select_option("select[name=action]", "force_release")
    page.click("button[name=index]")
    page.wait_for_selector("#redlock-release-list")


@pytest.mark.usefixtures("browser_available")
def test_login_see_and_force_release(
    page: Any, live_server: Any, admin_user: Any, tmp_path: Path
) -> None:
    """An admin logs in with a real browser, sees the held locks, ticks one and
    force-releases it with the admin action, then releases the rest with the select-all box."""
    lease = locks["multi"].acquire("nightly-report:2026-11-22", ttl=60, timeout=0)
    other = locks["default"].acquire("invoice:2026-0042", ttl=60, timeout=0)
    counter = "span.action-counter"
    try:
        page.goto(f"{live_server.url}/admin/login/?next=/admin/django_redlock/lock/")
        page.fill("#id_username", "admin")
        page.fill("#id_password", "password")
        page.click("input[type=submit]")
        page.wait_for_selector("#redlock-locks")
        assert page.locator("td.field-name", has_text=lease.name).count() == 1
        assert page.locator("#redlock-nodes td.up").count() == 9
        rows = page.locator("input.action-select").count()
        assert rows >= 2 and page.inner_text(counter) == f"0 of {rows} selected"
        shoot(page, tmp_path, "admin-locks.png")

        page.check("#action-toggle")  # select-all ticks every row (actions.js)
        assert page.inner_text(counter) == f"{rows} of {rows} selected"
        page.uncheck("#action-toggle")
        assert page.inner_text(counter) == f"0 of {rows} selected"
        page.check(f"input[aria-label='Select {lease.name}']")
        assert page.inner_text(counter) == f"1 of {rows} selected"
        run_action(page)
        assert lease.name in page.inner_text("#redlock-release-list")
        assert other.name not in page.inner_text("#redlock-release-list")
        shoot(page, tmp_path, "admin-locks-release.png")
        assert inspect.get_lock("multi", lease.name)[0] is not None

        page.click("input[value='Yes, release']")
        page.wait_for_selector("ul.messagelist")
        assert "Force-released lock" in page.inner_text("ul.messagelist")
        assert page.locator("td.field-name", has_text=lease.name).count() == 0
        assert inspect.get_lock("multi", lease.name) == (None, [])
        assert lease.release() is False

        page.check("#action-toggle")
        run_action(page)
        assert other.name in page.inner_text("#redlock-release-list")
        page.click("input[value='Yes, release']")
        page.wait_for_selector("ul.messagelist")
        assert page.locator("td.field-name", has_text=other.name).count() == 0
        assert inspect.get_lock("default", other.name) == (None, [])
    finally:
        lease.release()
        other.release()


@pytest.mark.parametrize("ci", ["true", ""], ids=["ci", "developer"])
def test_without_a_browser_ci_fails_and_a_developer_skips(ci: str, tmp_path: Path) -> None:
    """With no chromium on PATH (nor ``$CHROMIUM``), the browser test fails when ``$CI``
    is set and is skipped otherwise."""
    hidden = ("CI", "CHROMIUM", "DATABASE_URL")  # the child uses SQLite files of its own
    env = {key: value for key, value in os.environ.items() if key not in hidden}
    env.update(PATH=str(tmp_path), CI=ci, REDLOCK_REDIS_SERVER=find_redis_server())
    env.update(SQLITE_TEST_PATH=str(tmp_path / "t.db"), SQLITE_PATH=str(tmp_path / "d.db"))
    command = [sys.executable, "-m", "pytest", BROWSER_TEST, "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    if ci:
        assert done.returncode == 1, output
        assert "needs a chromium binary" in output and "$CI is set, so it must run" in output
    else:
        assert done.returncode == 0, output
        assert "1 skipped" in output
