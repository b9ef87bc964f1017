"""Bad settings under a real uvicorn: a clear start-up failure, never a server that answers
every request 500 with a traceback.

Starlette and FastAPI build their middleware stack lazily, in their first call (the lifespan
scope). ``Middleware(IdempotencyMiddleware, store=<bad>)`` must therefore fail the lifespan
start-up with the ConfigurationError's message, so uvicorn logs that one line and exits
non-zero; ``install()`` checks at once, when the app module is imported. A server that runs no
lifespan answers a plain 500, the message logged once, no traceback anywhere.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from .servers import free_port

pytestmark = pytest.mark.e2e

STARLETTE_APP = """
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from retrysafe.asgi import IdempotencyMiddleware


async def home(request):
    return PlainTextResponse("home")


app = Starlette(
    routes=[Route("/", home, methods=["GET", "POST"])],
    middleware=[Middleware(IdempotencyMiddleware, {options})],
)
"""

FASTAPI_MIDDLEWARE_APP = """
from fastapi import FastAPI

from retrysafe.asgi import IdempotencyMiddleware

app = FastAPI()
app.add_middleware(IdempotencyMiddleware, {options})


@app.get("/")
async def home() -> dict[str, str]:
    return {{"page": "home"}}
"""

FASTAPI_INSTALL_APP = """
from fastapi import FastAPI

from retrysafe.contrib.fastapi import install

app = FastAPI()
install(app, {options})
"""

BAD_SCHEME = "IdempotencyMiddleware(store=...): unknown store URL scheme in 'nope'"
BAD_TTL = "IdempotencyMiddleware(ttl=...): must be seconds (30, 2.5) or a duration"
NO_EXTRA = "IdempotencyMiddleware(store=...): the redis:// store needs an extra: pip install"

#: Runs uvicorn's own command line with the ``redis`` package made unimportable (an install
#: without ``retrysafe[redis]``).
WITHOUT_REDIS = (
    "import sys; sys.modules['redis'] = None; from uvicorn.main import main; "
    "sys.argv[0] = 'uvicorn'; main()"
)


def _uvicorn(tmp_path: Path, source: str, *args: str, without_redis: bool = False) -> list[str]:
    (tmp_path / "app_module.py").write_text(source)
    launcher = ["-c", WITHOUT_REDIS] if without_redis else ["-m", "uvicorn"]
    port = str(free_port())
    return [sys.executable, *launcher, "app_module:app", "--port", port, *args]


def _run_to_exit(tmp_path: Path, command: list[str]) -> tuple[int, str]:
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("template", "options", "message", "without_redis"),
    [
        pytest.param(STARLETTE_APP, 'store="nope://x"', BAD_SCHEME, False, id="starlette-url"),
        pytest.param(
            STARLETTE_APP,
            'store="memory://", ttl="1 fortnight"',
            BAD_TTL,
            False,
            id="starlette-option",
        ),
        pytest.param(
            STARLETTE_APP, 'store="redis://127.0.0.1:6379/0"', NO_EXTRA, True, id="starlette-extra"
        ),
        pytest.param(
            FASTAPI_MIDDLEWARE_APP, 'store="nope://x"', BAD_SCHEME, False, id="fastapi-middleware"
        ),
    ],
)
def test_a_lazily_built_middleware_fails_the_lifespan_start_up_with_one_line(
    template: str, options: str, message: str, without_redis: bool, tmp_path: Path
) -> None:
    command = _uvicorn(tmp_path, template.format(options=options), without_redis=without_redis)
    code, output = _run_to_exit(tmp_path, command)
    assert code != 0, output
    lines = [line for line in output.splitlines() if "retrysafe.ConfigurationError" in line]
    assert len(lines) == 1, output
    assert f"retrysafe.ConfigurationError: {message}" in lines[0], output
    assert "Application startup failed" in output
    assert "appears unsupported" not in output and "Traceback" not in output, output


def test_install_refuses_a_bad_store_when_the_app_is_imported(tmp_path: Path) -> None:
    app = FASTAPI_INSTALL_APP.format(options='store="nope://x"')
    code, output = _run_to_exit(tmp_path, _uvicorn(tmp_path, app))
    assert code != 0, output
    assert "ConfigurationError: install(store=...): unknown store URL scheme in 'nope'" in output
    assert "Application startup complete" not in output, output


def test_without_lifespan_every_request_is_a_plain_500_and_the_message_is_logged_once(
    tmp_path: Path,
) -> None:
    app = STARLETTE_APP.format(options='store="nope://x"')
    command = _uvicorn(tmp_path, app, "--lifespan", "off")
    port = int(command[command.index("--port") + 1])
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, log.read_text()
            try:
                first = httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        keyed = httpx.post(
            f"http://127.0.0.1:{port}/", headers={"Idempotency-Key": "k"}, content=b"{}"
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
    for response in (first, keyed):
        assert response.status_code == 500
        assert response.text == "Internal Server Error"
    output = log.read_text()
    assert output.count(f"retrysafe.ConfigurationError: {BAD_SCHEME}") == 1, output
    assert "Traceback" not in output, output
