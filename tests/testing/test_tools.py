"""The helpers' own promises: clear failures, an inert plugin, the run-wide switch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

import retrysafe.asgi
import retrysafe.wsgi
from retrysafe.testing import (
    Clock,
    asend_duplicates,
    assert_problem,
    assert_replayed,
    idempotency_disabled,
    send_duplicates,
)

REPO = Path(__file__).resolve().parents[2]


def response(status: int = 201, body: bytes = b'{"id":1}', **headers: str) -> httpx.Response:
    fields = {"content-type": "application/json", **headers}
    return httpx.Response(
        status, headers={k.replace("_", "-"): v for k, v in fields.items()}, content=body
    )


def test_clock_moves_only_forward() -> None:
    clock = Clock(start=100)
    assert clock() == 100
    assert clock.advance(2.5) == 102.5 == clock()
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


@pytest.mark.parametrize("sender", [send_duplicates, asend_duplicates], ids=["sync", "async"])
def test_a_duplicate_sender_refuses_an_unknown_keyword(sender: Any) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:  # never reached
        raise AssertionError

    with pytest.raises(TypeError, match="unexpected keyword argument 'jsn'"):
        result = sender(app, "POST", "/", jsn={})
        if sender is asend_duplicates:
            asyncio.run(result)


def test_assert_replayed_names_what_differs() -> None:
    first = response(location="/orders/1")
    assert_replayed(first, response(location="/orders/1", idempotency_replayed="true"))
    with pytest.raises(AssertionError, match="not a replay"):
        assert_replayed(first, response(location="/orders/1"))
    with pytest.raises(AssertionError, match="body differs"):
        assert_replayed(
            first, response(body=b"{}", location="/orders/1", idempotency_replayed="true")
        )
    with pytest.raises(AssertionError, match="location: /orders/1"):
        assert_replayed(first, response(idempotency_replayed="true"))
    with pytest.raises(AssertionError, match="status 201 replayed as 200"):
        assert_replayed(first, response(200, location="/orders/1", idempotency_replayed="true"))


def test_assert_replayed_ignores_what_is_never_stored() -> None:
    first = response(set_cookie="session=1", date="Mon, 01 Dec 2026 10:00:00 GMT")
    replay = response(date="Mon, 01 Dec 2026 10:00:05 GMT", idempotency_replayed="true")
    assert_replayed(first, replay)


def test_assert_problem_checks_type_code_and_status() -> None:
    body = b'{"type":"https://errors.example/idempotency-key-reused",'
    body += b'"code":"idempotency_key_reused","title":"t","status":422,"detail":"d"}'
    problem = response(422, body, content_type="application/problem+json")
    assert assert_problem(problem, "idempotency-key-reused")["detail"] == "d"
    with pytest.raises(AssertionError, match="expected problem 'idempotency-key-missing'"):
        assert_problem(problem, "idempotency-key-missing", status=422)
    with pytest.raises(AssertionError, match="application/json"):
        assert_problem(response(), "idempotency-key-reused")
    with pytest.raises(ValueError, match="unknown problem type"):
        assert_problem(problem, "key-reused")


def test_the_disabled_block_restores_the_middleware() -> None:
    asgi_call = retrysafe.asgi.IdempotencyMiddleware.__call__
    wsgi_call = retrysafe.wsgi.IdempotencyMiddleware.__call__
    with idempotency_disabled(), idempotency_disabled():
        assert retrysafe.asgi.IdempotencyMiddleware.__call__ is not asgi_call
    assert retrysafe.asgi.IdempotencyMiddleware.__call__ is asgi_call
    assert retrysafe.wsgi.IdempotencyMiddleware.__call__ is wsgi_call


async def test_the_disabled_block_runs_idempotent_functions_every_time() -> None:
    from retrysafe import idempotent_function
    from retrysafe.stores import AsyncMemoryStore, MemoryStore

    runs: list[str] = []

    @idempotent_function(store=MemoryStore(), key="order_id")
    def charge(order_id: str) -> str:
        runs.append(order_id)
        return f"charged {order_id}"

    @idempotent_function(store=AsyncMemoryStore())
    async def refund(order_id: str) -> str:
        runs.append(f"refund {order_id}")
        return order_id

    assert charge("o1") == charge("o1") == "charged o1"
    assert runs == ["o1"]  # stored and replayed outside the block
    with idempotency_disabled():
        assert charge("o1") == charge("o1") == "charged o1"
        assert await refund("o2", idempotency_key="k") == "o2"
        assert await refund("o2", idempotency_key="k") == "o2"
    assert runs == ["o1", "o1", "o1", "refund o2", "refund o2"]
    assert charge("o1") == "charged o1" and len(runs) == 5  # the store's answer again


def run_pytest(tmp_path: Path, test: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on one user test file, as a user's project would (the installed plugin)."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent(test))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


USER_TEST = """
    import httpx
    import retrysafe.asgi
    from retrysafe.asgi import IdempotencyMiddleware

    CALLS = []

    async def app(scope, receive, send):
        CALLS.append(1)
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"made"})

    def test_two_posts(retrysafe_store):
        wrapped = IdempotencyMiddleware(app, store=retrysafe_store)
        import asyncio
        async def go():
            transport = httpx.ASGITransport(app=wrapped)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                for _ in range(2):
                    await http.post("/", content=b"x", headers={"Idempotency-Key": "k"})
        asyncio.run(go())
        print("CALLS", len(CALLS))

    def test_untouched():
        assert retrysafe.asgi.IdempotencyMiddleware.__call__.__module__ == "retrysafe.asgi"
"""


def test_the_plugin_is_inert_unless_asked(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, USER_TEST, "-s")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CALLS 1" in result.stdout  # the retry was replayed


def test_the_run_wide_switch_turns_idempotency_off(tmp_path: Path) -> None:
    result = run_pytest(tmp_path, USER_TEST, "-s", "-k", "two_posts", "--retrysafe-disable")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CALLS 2" in result.stdout  # both requests ran
