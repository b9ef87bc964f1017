"""Bad settings of an ASGI middleware that Starlette builds lazily: a failed start-up, one line.

Starlette (and FastAPI) build their middleware stack inside their first call, which is the
lifespan scope: an error raised there makes uvicorn log "ASGI 'lifespan' protocol appears
unsupported", start anyway, and answer every request ``500`` with a traceback. So when
``Middleware(IdempotencyMiddleware, ...)`` is refused during that build, the middleware hands
every scope to a :class:`StartupFailure`: the lifespan start-up fails with the error's message
(uvicorn logs it and exits non-zero), and a server that runs no lifespan gets a plain ``500``
per request (the message logged once), never a traceback. Anywhere else the error is raised at
once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from types import FrameType
from typing import Any

from ._core.config import IdempotencyConfig
from ._core.errors import ConfigurationError

__all__ = ["StartupFailure", "start_up_checks"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]

_BODY = b"Internal Server Error"
_HEADERS = [
    (b"content-type", b"text/plain; charset=utf-8"),
    (b"content-length", str(len(_BODY)).encode()),
]


@contextlib.contextmanager
def start_up_checks(middleware: Any) -> Iterator[None]:
    """Let a :class:`ConfigurationError` of the block through, unless Starlette is building
    its middleware stack lazily: then skip the rest of the block and make ``middleware`` (which
    has set its ``app``) pass every scope to a :class:`StartupFailure` over that app.

    Raises:
        ConfigurationError: from the block, outside Starlette's lazy build.
    """
    try:
        yield
    except ConfigurationError as exc:
        if not _starlette_is_building():
            raise
        # The middleware passes to its app what its settings do not protect: with no method
        # protected, that is every scope. Its class stays (the compiled build's cannot change).
        refused = IdempotencyConfig()
        object.__setattr__(refused, "methods", frozenset())
        middleware.config = refused
        middleware.app = StartupFailure(middleware.app, exc)


def _starlette_is_building() -> bool:
    frame: FrameType | None = sys._getframe(1)
    for _ in range(8):  # past contextlib, the middleware's __init__ and a subclass's
        if frame is None:
            return False
        module = str(frame.f_globals.get("__name__", ""))
        if frame.f_code.co_name == "build_middleware_stack" and module.startswith(
            ("starlette.", "fastapi.")
        ):
            return True
        frame = frame.f_back
    return False


class StartupFailure:
    """The app of a middleware whose settings were refused: fails the lifespan start-up with
    the message, answers HTTP requests a plain ``500``, passes other scopes (websockets) to the
    app.

    Args:
        app: the app the middleware wraps.
        error: why it was refused.
    """

    def __init__(
        self, app: Callable[[Scope, Receive, Send], Awaitable[None]], error: ConfigurationError
    ) -> None:
        self.app = app
        self.error = error
        self.logged = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"retrysafe.ConfigurationError: {self.error}"
        if scope["type"] == "lifespan":
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.failed", "message": message})
        elif scope["type"] == "http":
            if not self.logged:
                self.logged = True
                logging.getLogger("retrysafe").error(message)
            await send({"type": "http.response.start", "status": 500, "headers": _HEADERS})
            await send({"type": "http.response.body", "body": _BODY})
        else:
            await self.app(scope, receive, send)
