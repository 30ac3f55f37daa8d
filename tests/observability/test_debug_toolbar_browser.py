"""LocksPanel in django-debug-toolbar, rendered in headless Chromium (docs/observability.md): a real
``runserver`` process with the toolbar; the panel lists the request's locks (name, alias,
token, wait, hold, voters; the busy one too) and nothing another thread took.

Skipped without Playwright or Chromium on a developer machine; a failure under ``$CI``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from django_redlock import locks
from django_redlock.testing.server import find_redis_server
from django_redlock.testing.wire import free_port
from tests.support.browser import chromium_page, require_browser
from tests.support.server_process import server_process

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def chromium() -> str:
    """The browser, checked before any server starts (a failure under ``$CI``)."""
    return require_browser("the debug-toolbar browser test")


@pytest.fixture
def toolbar_server(tmp_path: Path) -> Iterator[str]:
    """``manage.py runserver`` with tests/support/toolbar_settings.py; stopped by PID."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.toolbar_settings",
        "REDLOCK_TEST_ALIASES": json.dumps(settings.REDLOCK),
        "TOOLBAR_SQLITE": str(tmp_path / "toolbar.sqlite3"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    command = [sys.executable, "manage.py", "runserver", "--noreload", "--skip-checks",
               f"127.0.0.1:{port}"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with server_process(command, env, f"{base}/ok/", tmp_path / "runserver.log"):
        yield base


def test_the_panel_lists_the_requests_locks(
    chromium: str, toolbar_server: str, tmp_path: Path
) -> None:
    """Four rows in order: cart (acquired), side (acquired after waiting >= 100 ms for the
    view's own thread, which is not listed), held-by-test (busy, no token), receipt (the
    1-node alias: one voter); voters are a quorum of the alias's nodes; the nav says 4 locks."""
    held = locks["multi"].acquire("toolbar:held-by-test", ttl=30, timeout=0)
    try:
        with chromium_page(chromium) as page:
            page.goto(f"{toolbar_server}/checkout/")
            page.wait_for_selector("#djDebugToolbar")
            button = page.locator("#djdt-LocksPanel a")
            assert "4 locks" in button.inner_text()
            button.click()
            page.wait_for_selector("#redlock-toolbar-locks")
            shot = tmp_path / "toolbar-locks.png"
            page.screenshot(path=str(shot), full_page=True)
            if os.environ.get("REDLOCK_SCREENSHOTS") == "1":
                shutil.copy(shot, ROOT / "docs" / "images" / shot.name)
            rows = page.locator("#redlock-toolbar-locks tbody tr")
            names = [rows.nth(i).locator(".redlock-name").inner_text() for i in range(rows.count())]
            assert names == [
                "toolbar:cart",
                "toolbar:side",
                "toolbar:held-by-test",
                "toolbar:receipt",
            ]
            cells = [
                [c.strip() for c in rows.nth(i).locator("td").all_inner_texts()] for i in range(4)
            ]
    finally:
        held.release()
    cart, side, busy, receipt = cells
    multi = [n.label for n in locks["multi"].config.nodes]
    assert cart[1:3] == ["multi", "acquired"] and int(cart[3]) > 0
    voters = cart[7].split(", ")  # the quorum's grants that arrived before it settled
    assert float(cart[6].split()[0]) >= 20 and len(voters) >= 2 and set(voters) <= set(multi)
    assert side[2] == "acquired" and float(side[4]) >= 100 and int(side[5]) >= 2
    dash = "\u2013"  # the template's "none"
    assert busy[2] == "busy" and busy[3] == dash and busy[6] == dash and busy[7] == ""
    assert receipt[1] == "default" and receipt[7] == locks["default"].config.nodes[0].label


def test_under_ci_a_missing_browser_fails(tmp_path: Path) -> None:
    """With no chromium on PATH (nor ``$CHROMIUM``) and ``$CI`` set, the panel test fails
    instead of skipping."""
    hidden = ("CI", "CHROMIUM", "DATABASE_URL")
    env = {key: value for key, value in os.environ.items() if key not in hidden}
    env.update(PATH=str(tmp_path), CI="true", REDLOCK_REDIS_SERVER=find_redis_server())
    env.update(SQLITE_TEST_PATH=str(tmp_path / "t.db"), SQLITE_PATH=str(tmp_path / "d.db"))
    test = (
        "tests/observability/test_debug_toolbar_browser.py::test_the_panel_lists_the_requests_locks"
    )
    command = [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "$CI is set, so it must run" in output, output
