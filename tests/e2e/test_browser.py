"""The OrderHub page at ``/`` in a real headless Chromium, against a real ``retrysafe demo``.

Chromium is Debian's (``/usr/bin/chromium``, or ``RETRYSAFE_TEST_CHROMIUM``), driven by
Playwright's Python API; no browser is ever downloaded. Without it the tests skip on a laptop
and fail under ``CI=true``. Screenshots go to ``test-artifacts/`` and their paths are printed.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..conftest import service_missing
from .servers import DemoServer

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Chromium itself reports every non-2xx fetch as a console error. The demo provokes these on
#: purpose (a twin request gets 409, "handler fails" gets 500); they are not page errors.
EXPECTED_HTTP_ERROR = re.compile(
    r"^Failed to load resource: the server responded with a status of (409|422|500)\b"
)
OP_TIMEOUT_MS = 15_000


def _chromium_path() -> str | None:
    chosen = os.environ.get("RETRYSAFE_TEST_CHROMIUM")
    candidates: list[str | None]
    if chosen:  # an explicit choice is never second-guessed
        candidates = [chosen]
    else:
        candidates = [
            "/usr/bin/chromium",
            shutil.which("chromium"),
            shutil.which("chromium-browser"),
        ]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (each test gets its own context)."""
    executable = _chromium_path()
    if executable is None:
        where = os.environ.get("RETRYSAFE_TEST_CHROMIUM") or "/usr/bin/chromium or on PATH"
        service_missing("Chromium", f"no chromium executable at {where} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        service_missing("Playwright", f"{exc} (pip install -e '.[test]')")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def demo(demo_servers: Callable[..., DemoServer], tmp_path: Path) -> DemoServer:
    """A real OrderHub process with a fresh SQLite store."""
    return demo_servers(f"sqlite:///{tmp_path}/store.db")


@dataclass
class Page:
    """A loaded OrderHub page plus everything it logged."""

    page: Any
    server: DemoServer
    errors: list[str] = field(default_factory=list)
    ops: int = 0

    def act(self, button: str) -> None:
        """Click an action button and wait until the action is over and the table refreshed."""
        self.ops += 1
        self.page.click(f"#{button}")
        self.page.wait_for_selector(
            f'body[data-ops-done="{self.ops}"]', state="attached", timeout=OP_TIMEOUT_MS
        )

    def key(self, on: bool) -> None:
        self.page.set_checked("#send-key", on)

    def text(self, selector: str) -> str:
        return str(self.page.inner_text(selector)).strip()

    def rows(self) -> int:
        return int(self.page.locator("#orders-body tr[data-order-id]").count())

    def entries(self) -> list[dict[str, str]]:
        return list(
            self.page.eval_on_selector_all(
                "#log li[data-testid=log-entry]", "els => els.map(e => ({...e.dataset}))"
            )
        )

    def orders(self) -> dict[str, Any]:
        response = httpx.get(self.server.url + "/orders", timeout=5)
        response.raise_for_status()
        data: dict[str, Any] = response.json()
        return data

    def screenshot(self, name: str, record_property: Any, capsys: Any) -> Path:
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=True)
        record_property(f"screenshot-{path.stem}", str(path))
        with capsys.disabled():
            print(f"\n[browser] screenshot: {path}")
        return path

    def assert_clean(self) -> None:
        assert self.errors == [], "console errors or page errors in the browser"


def _open(browser: Any, server: DemoServer, **context: Any) -> Page:
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.set_default_timeout(OP_TIMEOUT_MS)
    result = Page(page, server)

    def on_console(msg: Any) -> None:
        if msg.type == "error" and not EXPECTED_HTTP_ERROR.match(msg.text):
            result.errors.append(f"console: {msg.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda exc: result.errors.append(f"pageerror: {exc}"))
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="true"]', state="attached")
    return result


@pytest.fixture
def desktop(browser: Any, demo: DemoServer) -> Iterator[Page]:
    page = _open(browser, demo, viewport={"width": 1366, "height": 900})
    yield page
    page.page.context.close()


@pytest.fixture
def phone(browser: Any, demo: DemoServer) -> Iterator[Page]:
    page = _open(
        browser,
        demo,
        viewport={"width": 375, "height": 812},
        device_scale_factor=2,
        is_mobile=True,
        has_touch=True,
    )
    yield page
    page.page.context.close()


def test_double_click_without_key_creates_a_duplicate(desktop: Page) -> None:
    """Key off: both twin submissions run, two orders exist and the page counts one duplicate."""
    desktop.key(False)
    desktop.act("double-click")

    assert desktop.orders()["count"] == 2
    assert desktop.rows() == 2
    assert desktop.text("#dup-created") == "1"
    assert desktop.text("#dup-prevented") == "0"
    entries = desktop.entries()
    assert [e["status"] for e in entries] == ["201", "201"]
    assert all(e["key"] == "" and e["replayed"] == "false" for e in entries)
    assert desktop.page.locator("#orders-body .b-dup").count() == 1
    desktop.assert_clean()


def test_double_click_with_key_creates_one_order(desktop: Page) -> None:
    """Key on: one twin creates the order, the other gets a replay or a 409."""
    desktop.key(True)
    desktop.act("double-click")

    assert desktop.orders()["count"] == 1
    assert desktop.rows() == 1
    entries = desktop.entries()
    assert len(entries) == 2
    assert len({e["key"] for e in entries}) == 1 and entries[0]["key"]
    assert sorted(e["status"] for e in entries if e["replayed"] == "false")[0] == "201"
    stopped = [e for e in entries if e["replayed"] == "true" or e["status"] == "409"]
    assert len(stopped) == 1, entries
    assert desktop.text("#dup-created") == "0"
    assert desktop.text("#dup-prevented") == "1"
    log = desktop.text("#log")
    assert "REPLAY" in log or "409" in log
    desktop.assert_clean()


def test_unreliable_network_retry_is_replayed(desktop: Page) -> None:
    """The first answer is lost; the automatic retry with the same key is a replay: one order."""
    desktop.key(True)
    desktop.act("unreliable")

    assert desktop.orders()["count"] == 1
    assert desktop.rows() == 1
    by_attempt = {e["attempt"]: e for e in desktop.entries()}
    assert set(by_attempt) == {"1", "2"}
    assert by_attempt["1"]["lost"] == "true"
    assert by_attempt["1"]["status"] == "201"
    assert by_attempt["2"]["status"] == "201"
    assert by_attempt["2"]["replayed"] == "true"
    assert by_attempt["1"]["key"] == by_attempt["2"]["key"] != ""
    assert desktop.text("#dup-created") == "0"
    assert desktop.text("#dup-prevented") == "1"
    desktop.assert_clean()


def test_unreliable_network_without_key_duplicates(desktop: Page) -> None:
    """Key off: the automatic retry places the order a second time."""
    desktop.key(False)
    desktop.act("unreliable")

    assert desktop.orders()["count"] == 2
    assert desktop.rows() == 2
    assert desktop.text("#dup-created") == "1"
    desktop.assert_clean()


def test_same_key_for_two_users_gives_each_their_own_order(desktop: Page) -> None:
    """Keys are scoped per user: bob's request with alice's key is not a replay of hers."""
    desktop.key(True)
    for user in ("alice", "bob"):
        desktop.page.check(f"#user-{user}")
        desktop.page.fill("#key-input", "shared-key-0001")
        desktop.act("place-order")

    orders = desktop.orders()
    assert orders["count"] == 2
    assert sorted(o["owner"] for o in orders["orders"]) == ["alice", "bob"]
    assert desktop.rows() == 2
    entries = desktop.entries()
    assert [e["status"] for e in entries] == ["201", "201"]
    assert all(e["key"] == "shared-key-0001" and e["replayed"] == "false" for e in entries)
    owners = desktop.page.eval_on_selector_all(
        "#orders-body tr[data-order-id]", "els => els.map(e => e.dataset.owner).sort()"
    )
    assert owners == ["alice", "bob"]
    desktop.assert_clean()


def test_slow_handler_twin_gets_409_with_its_problem_title(desktop: Page) -> None:
    """While the slow first request runs, its twin is refused with 409 and the problem title."""
    desktop.key(True)
    desktop.page.fill("#delay", "800")
    assert desktop.text("#delay-value") == "800 ms"
    desktop.act("double-click")

    assert desktop.orders()["count"] == 1
    statuses = sorted(e["status"] for e in desktop.entries())
    assert statuses == ["201", "409"]
    conflict = next(e for e in desktop.entries() if e["status"] == "409")
    assert conflict["title"] == "A request is outstanding for this Idempotency-Key"
    assert desktop.text("#dup-prevented") == "1"
    desktop.assert_clean()


def test_failing_handler_shows_500_and_places_nothing(desktop: Page) -> None:
    """?fail=1: the log shows the 500 and its title; no order exists."""
    desktop.key(True)
    desktop.page.check("#fail")
    desktop.act("place-order")

    assert desktop.orders()["count"] == 0
    [entry] = desktop.entries()
    assert entry["status"] == "500"
    assert entry["title"] == "Handler failed"
    assert "500" in desktop.text("#log")
    desktop.assert_clean()


def test_reset_clears_orders_log_and_counters(desktop: Page) -> None:
    """Reset deletes the orders (POST /reset) and zeroes the page's log and counters."""
    desktop.key(False)
    desktop.act("double-click")
    assert desktop.text("#dup-created") == "1"

    desktop.page.click("#reset")
    desktop.page.wait_for_selector("#orders-body tr.empty")
    assert desktop.orders()["count"] == 0
    assert desktop.entries() == []
    assert desktop.text("#dup-created") == "0"
    assert desktop.text("#dup-prevented") == "0"
    desktop.assert_clean()


def test_desktop_tour_screenshot(desktop: Page, record_property: Any, capsys: Any) -> None:
    """Key off then on, twins and lost answers: the page tells the two stories apart."""
    desktop.key(False)
    desktop.act("double-click")
    desktop.key(True)
    desktop.act("double-click")
    desktop.act("unreliable")

    assert desktop.orders()["count"] == 4
    assert desktop.text("#dup-created") == "1"
    assert desktop.text("#dup-prevented") == "2"
    desktop.page.wait_for_timeout(1700)  # let the new-row highlight fade for the picture
    path = desktop.screenshot("browser-desktop.png", record_property, capsys)
    assert path.stat().st_size > 10_000
    desktop.assert_clean()


def test_phone_width_has_no_horizontal_overflow(
    phone: Page, record_property: Any, capsys: Any
) -> None:
    """At 375 px the page fits the screen, before and after the log fills up."""
    width = "document.scrollingElement.scrollWidth"
    assert phone.page.evaluate(width) <= 375
    phone.key(False)
    phone.act("double-click")
    phone.key(True)
    phone.act("unreliable")

    assert phone.page.evaluate(width) <= 375
    assert phone.rows() == 3
    phone.page.wait_for_timeout(1700)
    path = phone.screenshot("browser-phone.png", record_property, capsys)
    assert path.stat().st_size > 10_000
    phone.assert_clean()


def test_the_footer_says_where_the_data_lives_and_that_make_demo_starts_empty(
    desktop: Page,
) -> None:
    """The page names the store's file (records and orders in one database) and says that each
    ``make demo`` starts in a new, empty folder."""
    footer = desktop.text("#data-where")
    assert desktop.server.store.removeprefix("sqlite:///") in footer
    assert "one database" in footer
    assert "new, empty folder" in footer
    desktop.assert_clean()


def test_the_worker_panel_shows_one_charge_with_retrysafe_and_two_without(
    browser: Any,
    demo_servers: Callable[..., DemoServer],
    tmp_path: Path,
    record_property: Any,
    capsys: Any,
) -> None:
    """With its Celery worker, the page shows the charges panel: a payment charged once, and
    the two kill buttons, whose rows end with one charge (retrysafe) and two (without)."""
    server = demo_servers(f"sqlite:///{tmp_path}/store.db", worker=True)
    desktop = _open(browser, server, viewport={"width": 1366, "height": 900})
    try:
        panel = desktop.page.locator("#worker")
        assert panel.is_visible()
        desktop.page.click("#pay")
        desktop.page.wait_for_selector('#charges-body tr[data-flow="retrysafe"] .b-ok')
        desktop.page.click("#kill-retrysafe")
        desktop.page.wait_for_selector("#worker-status:has-text('SIGKILLed')")
        desktop.page.click("#kill-plain")
        desktop.page.wait_for_selector("#worker-status:has-text('SIGKILLed')")
        # Each killed payment's row: the killed run, then the redelivery's run.
        for flow, charges in (("retrysafe", "1"), ("plain", "2")):
            row = f'#charges-body tr[data-flow="{flow}"]:has(.b-lost)'
            desktop.page.wait_for_selector(f"{row} .b-ok", timeout=30_000)
            assert desktop.text(f"{row} [data-testid=charge-count]").startswith(charges)
        assert desktop.page.locator("#charges-body .b-dup").count() == 1  # CHARGED TWICE
        totals = desktop.text("#charge-totals")
        assert "With retrysafe: 2 payments charged, 2 charges" in totals, totals
        assert "without: 1 payment charged, 2 charges" in totals, totals
        desktop.screenshot("browser-worker.png", record_property, capsys)
        desktop.assert_clean()
    finally:
        desktop.page.context.close()


def test_without_a_worker_the_page_has_no_worker_panel(desktop: Page) -> None:
    assert not desktop.page.locator("#worker").is_visible()
    desktop.assert_clean()
