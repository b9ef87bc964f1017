"""The documentation site in a real headless Chromium: a reader searches for "409" and lands on
the in-progress problem page, which shows its example response.

Chromium is Debian's (``/usr/bin/chromium``, or ``RETRYSAFE_TEST_CHROMIUM``), driven by
Playwright's Python API; no browser is ever downloaded. Without it the test skips on a laptop and
fails under ``CI=true``. Screenshots go to ``test-artifacts/docs-*.png``.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import service_missing
from .conftest import ROOT, BuiltSite

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 20_000


def _chromium() -> str:
    chosen = os.environ.get("RETRYSAFE_TEST_CHROMIUM")
    candidates = [chosen] if chosen else ["/usr/bin/chromium", shutil.which("chromium")]
    found = next((c for c in candidates if c and os.access(c, os.X_OK)), None)
    if found is None:
        service_missing("Chromium", "no chromium executable (apt-get install chromium)")
    assert found is not None
    return found


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served_site(built_site: BuiltSite) -> Iterator[str]:
    """The built site on a loopback port, as any static web server would serve it."""
    handler = functools.partial(_Quiet, directory=str(built_site.path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def page(served_site: str) -> Iterator[Any]:
    executable = _chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_missing("Playwright", f"{exc} (pip install -e '.[test]')")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(TIMEOUT_MS)
        errors: list[str] = []
        tab.on("pageerror", lambda error: errors.append(str(error)))
        yield tab
        browser.close()
        assert not errors, errors


def _shot(tab: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"docs-{name}.png"
    tab.screenshot(path=str(path), full_page=False)
    print(f"screenshot: {path}")
    return path


def test_search_409_leads_to_the_in_progress_page_and_its_example(
    page: Any, served_site: str
) -> None:
    page.goto(served_site + "/")
    assert "retrysafe" in page.title()
    _shot(page, "home")

    page.locator("label.md-search__icon, .md-search__input").first.click()
    search = page.locator("input.md-search__input")
    search.press_sequentially("409", delay=80)  # typed, as a reader does
    hit = page.locator(".md-search-result__list a[href*='idempotency-request-in-progress']").first
    hit.wait_for(state="visible")
    _shot(page, "search-409")
    hit.click()

    page.wait_for_url("**/reference/problems/idempotency-request-in-progress/**")
    heading = page.locator("h1").first.inner_text().rstrip("¶")  # the permalink mark
    assert heading == "idempotency-request-in-progress"
    example = page.locator("pre", has_text='"code": "idempotency_request_in_progress"').first
    example.scroll_into_view_if_needed()
    assert example.is_visible()
    text = example.inner_text()
    assert "HTTP/1.1 409 Conflict" in text
    assert "Retry-After:" in text
    assert "application/problem+json" in text
    _shot(page, "in-progress-example")
