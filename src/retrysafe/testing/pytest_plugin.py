"""The pytest plugin of retrysafe: fixtures for testing your own endpoints.

Loaded automatically when retrysafe is installed (entry point ``pytest11``), and inert: it adds
the fixtures below and the ``--retrysafe-disable`` option, and does nothing until a test asks for
a fixture or the option is given.

Fixtures:
    retrysafe_clock: a :class:`~retrysafe.testing.Clock`, fresh per test.
    retrysafe_store: a fresh :class:`~retrysafe.stores.MemoryStore` on ``retrysafe_clock``.
    retrysafe_disabled: idempotency handling off for the test
        (:func:`~retrysafe.testing.idempotency_disabled`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from ..stores.memory import MemoryStore
from . import Clock, idempotency_disabled

__all__ = [
    "pytest_addoption",
    "pytest_configure",
    "retrysafe_clock",
    "retrysafe_disabled",
    "retrysafe_store",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--retrysafe-disable``."""
    group = parser.getgroup("retrysafe")
    group.addoption(
        "--retrysafe-disable",
        action="store_true",
        default=False,
        help="run every test with idempotency handling turned off (requests reach their "
        "handlers as if retrysafe were not installed)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """With ``--retrysafe-disable``, turn idempotency off for the whole run."""
    if config.getoption("retrysafe_disable", default=False):
        block = contextlib.ExitStack()
        block.enter_context(idempotency_disabled())
        config.add_cleanup(block.close)


@pytest.fixture
def retrysafe_clock() -> Clock:
    """A clock that moves only when the test calls ``advance(seconds)``."""
    return Clock()


@pytest.fixture
def retrysafe_store(retrysafe_clock: Clock) -> Iterator[MemoryStore]:
    """A fresh in-process store on the test's clock, closed after the test."""
    store = MemoryStore(clock=retrysafe_clock)
    yield store
    store.close()


@pytest.fixture
def retrysafe_disabled() -> Iterator[None]:
    """Idempotency handling off for this test, on every front."""
    with idempotency_disabled():
        yield
