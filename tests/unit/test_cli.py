"""The retrysafe command on a SQLite store: check, inspect, resolve, purge, schema."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from retrysafe._core.keys import record_id
from retrysafe._core.scope import authorization_scope
from retrysafe.cli import main
from retrysafe.stores import SQLiteStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SQLiteStore]:
    """The store the commands are pointed at, opened by the test too (and closed after it)."""
    opened = SQLiteStore(tmp_path / "s.db")
    yield opened
    opened.close()


def test_inspect_and_resolve_an_outcome_unknown_key(
    tmp_path: Path, store: SQLiteStore, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    rid = record_id(authorization_scope("Bearer alice"), "POST", "/pay", "k1")
    won = store.reserve(rid, "fp", lease=30.0, ttl=60.0)
    assert won.token and store.mark_committed(rid, won.token, lease=30.0)
    assert store.renew(rid, won.token, lease=0.0)  # died after committing: outcome unknown
    args = ["--store", url, "--path", "/pay", "--key", "k1", "--authorization", "Bearer alice"]

    assert main(["inspect", *args]) == 0
    assert "OUTCOME UNKNOWN" in capsys.readouterr().out
    assert main(["resolve", *args]) == 0
    assert "deleted" in capsys.readouterr().out
    assert store.get(rid) is None
    assert main(["resolve", *args]) == 1  # nothing left to resolve
    # A different principal is a different record: the default scope is the header's hash.
    assert main(["inspect", "--store", url, "--path", "/pay", "--key", "k1"]) == 1


def test_resolve_keeps_a_completed_record_unless_forced(tmp_path: Path, store: SQLiteStore) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    rid = record_id("", "POST", "/orders", "done")
    won = store.reserve(rid, "fp", lease=30.0, ttl=60.0)
    assert won.token and store.complete(rid, won.token, b"r", ttl=60.0)
    args = ["--store", url, "--path", "/orders", "--key", "done"]
    assert main(["resolve", *args]) == 1
    assert store.get(rid) is not None
    assert main(["resolve", *args, "--force"]) == 0
    assert store.get(rid) is None


def test_check_schema_and_purge_work_and_bad_urls_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/fresh.db"
    assert main(["schema", "apply", "--store", url]) == 0
    assert main(["check", "--store", url]) == 0
    assert main(["purge", "--store", url]) == 0
    assert "purged 0" in capsys.readouterr().out
    assert main(["check", "--store", "nosuch://x"]) == 2
    assert "unknown store URL scheme" in capsys.readouterr().err
