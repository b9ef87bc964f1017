"""The store commands as the README shows them: ``--key`` takes the header's value exactly as a
client sends it, and ``check`` says what it writes and leaves no record behind."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from retrysafe.asgi import IdempotencyMiddleware
from retrysafe.cli import main


async def _order(request: Request) -> Response:
    return JSONResponse({"id": 1}, status_code=201)


async def _send_keyed_order(url: str, header_value: str) -> None:
    app = Starlette(routes=[Route("/orders", _order, methods=["POST"])])
    wrapped = IdempotencyMiddleware(app, store=url)
    transport = httpx.ASGITransport(app=wrapped)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post("/orders", json={}, headers={"Idempotency-Key": header_value})
        assert answer.status_code == 201
    await wrapped.store.aclose()


@pytest.mark.parametrize("given", ['"k1"', "k1"], ids=["sf-string", "bare-token"])
async def test_inspect_and_resolve_take_the_key_as_the_client_sent_it(
    given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    await _send_keyed_order(url, '"k1"')  # curl -H 'Idempotency-Key: "k1"', as in the README
    assert main(["inspect", "--store", url, "--path", "/orders", "--key", given]) == 0
    assert "completed" in capsys.readouterr().out
    assert main(["resolve", "--store", url, "--path", "/orders", "--key", given, "--force"]) == 0
    assert "deleted" in capsys.readouterr().out


def test_a_key_no_client_could_send_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    assert main(["inspect", "--store", url, "--path", "/orders", "--key", '""']) == 2
    err = capsys.readouterr().err
    assert err.startswith("retrysafe: ") and "empty" in err and err.count("\n") == 1


def test_check_says_what_it_writes_and_leaves_no_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    assert main(["check", "--store", url]) == 0
    out = capsys.readouterr().out
    assert "probe key was reserved and released" in out
    assert "records table" in out
    with contextlib.closing(sqlite3.connect(tmp_path / "fresh.db")) as db:
        assert db.execute("select count(*) from retrysafe_records").fetchone() == (0,)
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "releases it again" in " ".join(capsys.readouterr().out.split())
