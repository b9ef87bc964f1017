"""The two faces of an idempotent function, driven by one test: a ``def`` (called in a worker
thread, as a sync caller would) and an ``async def`` (awaited on the test's loop)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

import pytest

import retrysafe


class Face:
    """``def`` or ``async def``."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    @property
    def is_async(self) -> bool:
        return self.kind == "async"

    def define(self, body: Callable[..., Any], **options: Any) -> Any:
        """``@idempotent_function(**options)`` over ``body`` in this face: ``body`` itself for
        ``def``, an ``async def`` with its signature and name that calls it for ``async``."""
        if self.is_async:

            @functools.wraps(body)
            async def target(*args: Any, **kwargs: Any) -> Any:
                return body(*args, **kwargs)

            return retrysafe.idempotent_function(target, **options)
        return retrysafe.idempotent_function(body, **options)

    async def call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        """Call ``function`` as a caller of this face would."""
        if self.is_async:
            return await function(*args, **kwargs)
        return await asyncio.to_thread(function, *args, **kwargs)

    async def mark_committed(self) -> bool:
        """``mark_committed()`` from inside an ``async def`` body (the async face only)."""
        assert self.is_async
        return await retrysafe.mark_committed()

    async def close(self, function: Any) -> None:
        if self.is_async:
            await function.aclose()
        else:
            function.close()


FACES = [pytest.param("sync", id="def"), pytest.param("async", id="async-def")]

__all__ = ["FACES", "Face"]
