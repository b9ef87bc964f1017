"""Structured log lines per non-trivial outcome (keys never in clear) and stable problem codes."""

from __future__ import annotations

import logging
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import retrysafe
from retrysafe._core.events import LOG_LEVELS, log_event
from retrysafe._core.problems import PROBLEMS
from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.stores import AsyncMemoryStore

from ..integrations.helpers import client_for, key

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: The documentation site's operations guide: its Logs table lists each event's level.
OPERATIONS_PAGE = DOCS / "guides" / "operations.md"
SECRET = "customer-key-0042"


def _app(store: Any, handler: Any = None, **options: Any) -> Any:
    async def create(request: Request) -> Response:
        return JSONResponse({}, 201)

    routes = [Route("/orders", handler or create, methods=["POST"])]
    return IdempotencyMiddleware(Starlette(routes=routes), store=store, **options)


def _ours(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "retrysafe"]


def _down_store() -> Any:
    from retrysafe.stores.redis import AsyncRedisStore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return AsyncRedisStore(f"redis://127.0.0.1:{port}/0?timeout=1&connect_timeout=0.5")


async def test_routine_outcomes_log_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="retrysafe")
    async with client_for(_app(AsyncMemoryStore())) as client:
        await client.post("/orders", headers=key(SECRET))
        await client.post("/orders", headers=key(SECRET))  # replay
    assert _ours(caplog) == []


async def test_mismatch_is_one_warning_line_with_a_hashed_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="retrysafe")
    async with client_for(_app(AsyncMemoryStore())) as client:
        await client.post("/orders", headers=key(SECRET), content=b"a")
        assert (await client.post("/orders", headers=key(SECRET), content=b"b")).status_code == 422
    (line,) = _ours(caplog)
    assert line.levelno == logging.WARNING
    fields = line.retrysafe  # type: ignore[attr-defined]
    assert fields["event"] == "mismatch"
    assert fields["method"] == "POST" and fields["path"] == "/orders"
    assert re.fullmatch(r"[0-9a-f]{16}", fields["record"])
    message = line.getMessage()
    assert "event=mismatch" in message and f"record={fields['record']}" in message
    assert SECRET not in message and SECRET not in str(fields)


@pytest.mark.parametrize(
    ("mode", "event", "level", "status"),
    [
        ("fail_closed", "store_error", logging.ERROR, 503),
        ("fail_open", "fail_open", logging.WARNING, 201),
    ],
)
async def test_store_failure_is_one_line_at_its_level(
    caplog: pytest.LogCaptureFixture, mode: str, event: str, level: int, status: int
) -> None:
    caplog.set_level(logging.DEBUG, logger="retrysafe")
    async with client_for(_app(_down_store(), on_store_error=mode)) as client:
        assert (await client.post("/orders", headers=key(SECRET))).status_code == status
    (line,) = _ours(caplog)
    assert (line.retrysafe["event"], line.levelno) == (event, level)  # type: ignore[attr-defined]
    assert line.retrysafe["error"]  # type: ignore[attr-defined]
    assert SECRET not in line.getMessage()


async def test_outcome_unknown_is_logged_as_an_error(caplog: pytest.LogCaptureFixture) -> None:
    async def effect_then_fail(request: Request) -> Response:
        await retrysafe.mark_committed(request)
        return Response(status_code=500)

    caplog.set_level(logging.DEBUG, logger="retrysafe")
    async with client_for(_app(AsyncMemoryStore(), effect_then_fail)) as client:
        await client.post("/orders", headers=key(SECRET))
    (line,) = _ours(caplog)
    assert line.levelno == logging.ERROR
    assert line.retrysafe["event"] == "outcome_unknown"  # type: ignore[attr-defined]
    assert line.retrysafe["phase"] == "declared"  # type: ignore[attr-defined]


def test_values_with_spaces_and_newlines_stay_on_one_quoted_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="retrysafe")
    log_event("store_error", {"record": "ab", "error": 'refused "x"\nnext', "key": SECRET})
    (line,) = _ours(caplog)
    message = line.getMessage()
    assert "\n" not in message
    assert 'error="refused \\"x\\"\\nnext"' in message
    assert SECRET not in message  # only the known fields are ever logged


def test_every_logged_event_has_its_level_documented() -> None:
    text = OPERATIONS_PAGE.read_text()
    for event, level in LOG_LEVELS.items():
        assert re.search(rf"\| `{event}` \| {logging.getLevelName(level)} \|", text), event


def test_problem_codes_are_stable_unique_snake_case_and_each_has_a_page() -> None:
    codes = [p.code for p in PROBLEMS.values()]
    assert len(set(codes)) == len(codes)
    for slug, problem in PROBLEMS.items():
        assert re.fullmatch(r"[a-z]+(_[a-z]+)+", problem.code)
        page = (DOCS / "reference" / "problems" / f"{slug}.md").read_text()
        assert f"**{problem.status} " in page, slug
        assert f"`code`: `{problem.code}`" in page, slug
