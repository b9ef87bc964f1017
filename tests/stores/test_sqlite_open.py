"""A SQLite file the store cannot use (not a database) fails the operation, and the connection it
opened to find out is closed at once, not left to the garbage collector (Python 3.13 reports such
a connection as an unclosed database)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from retrysafe import StoreError
from retrysafe.stores import SQLiteStore


def _open_fds(path: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                found.append(fd)
        except OSError:
            continue
    return found


def test_a_file_that_is_not_a_database_leaves_no_connection_open(tmp_path: Path) -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to list open files")
    path = tmp_path / "not-a-database.db"
    path.write_bytes(b"this is not an SQLite file" * 100)
    store = SQLiteStore(path)
    with pytest.raises(StoreError) as failed:
        store.get("k")
    # The traceback (still alive here) holds the failed call's frames: nothing in them may
    # keep the file open.
    assert failed.value is not None
    assert _open_fds(path) == []
    store.close()
