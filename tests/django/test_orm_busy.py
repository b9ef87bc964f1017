"""The Django ORM store on SQLite while another process holds the database's single write lock:
the same contention rows as the SQLite URL store (:mod:`tests.stores.sqlite_contention`), on its
sync face (the WSGI stack, in a worker thread) and its async face (ASGI). A key with a record is
answered from a read; only a key that needs the write waits, up to the database's ``timeout``.
Each row runs on an event loop of its own (``asyncio.run``), as Django's ORM calls may not run
on the loop's thread.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from retrysafe.contrib.django.store import DjangoStore

from ..stores.sqlite_contention import (
    Face,
    async_face,
    bounded_wait_row,
    holding,
    new_keys_row,
    records_row,
    seed,
    sync_face,
)

pytestmark = pytest.mark.django_db(transaction=True)

FACES = ["django-sync", "django-async"]


def _face(which: str) -> Face:
    store = DjangoStore("default")
    return (
        sync_face(which, store) if which == "django-sync" else async_face(which, store.as_async())
    )


def _path() -> Path:
    return Path(connections["default"].settings_dict["NAME"])


@pytest.mark.parametrize("which", FACES)
def test_keys_with_a_record_are_answered_while_another_process_holds_the_lock(
    which: str,
) -> None:
    expected = seed(DjangoStore("default"))
    with holding(_path()) as holder:
        asyncio.run(records_row(_face(which), holder, expected))


@pytest.mark.parametrize("which", FACES)
def test_new_keys_queue_for_the_lock_without_blocking_the_loop(which: str) -> None:
    seed(DjangoStore("default"))
    with holding(_path()) as holder:
        asyncio.run(new_keys_row(_face(which), holder))


@pytest.mark.parametrize("which", FACES)
def test_a_new_key_waits_at_most_the_database_timeout_then_the_store_is_busy(
    which: str, monkeypatch: Any
) -> None:
    seed(DjangoStore("default"))
    # Every thread's connection wrapper reads this one settings dict; the worker threads of
    # this test open theirs after the change.
    options = connections.settings["default"]["OPTIONS"]
    monkeypatch.setitem(options, "timeout", 0.3)
    with holding(_path()) as holder:
        asyncio.run(bounded_wait_row(_face(which), holder))
