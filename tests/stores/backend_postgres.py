"""The PostgreSQL backend of the conformance suite (filled in with the PostgreSQL store)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .conftest import Backend


async def postgres_backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    pytest.skip("the PostgreSQL store is not implemented yet")
    yield  # pragma: no cover
