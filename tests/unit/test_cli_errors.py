"""The retrysafe command against stores it cannot reach or use: a non-zero exit, one line on
stderr, no traceback, whatever the command and the store kind. And the demo's flags and the
help text read as a user expects."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from retrysafe.cli import main

from ..e2e.servers import free_port

COMMANDS = {
    "check": ["check"],
    "purge": ["purge"],
    "inspect": ["inspect", "--path", "/orders", "--key", "k1"],
    "resolve": ["resolve", "--path", "/orders", "--key", "k1"],
    "schema": ["schema", "apply"],
}


def _unwritable_sqlite(tmp_path: Path) -> str:
    # A path under a regular file can be created by nobody (not even root, as in CI).
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    return f"sqlite:///{blocker}/store.db"


def _not_a_database(tmp_path: Path) -> str:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a SQLite database file, just text" * 20)
    return f"sqlite:///{junk}"


def _missing_redis_db(redis_url: str) -> str:
    parts = urlsplit(redis_url)
    return urlunsplit(parts._replace(path="/99"))  # a stock Redis has databases 0-15


STORES = {
    "redis-unreachable": lambda request, tmp_path: "redis://127.0.0.1:1/0",
    "redis-no-such-db": lambda request, tmp_path: _missing_redis_db(
        request.getfixturevalue("redis_url")
    ),
    "postgres-unreachable": lambda request, tmp_path: (
        f"postgresql://postgres@127.0.0.1:{free_port()}/test?connect_timeout=2"
    ),
    "sqlite-unwritable": lambda request, tmp_path: _unwritable_sqlite(tmp_path),
    "sqlite-not-a-database": lambda request, tmp_path: _not_a_database(tmp_path),
    "sqlite-bad-option": lambda request, tmp_path: f"sqlite:///{tmp_path}/s.db?busy_timeout=x",
}


@pytest.mark.parametrize("store", list(STORES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_fails_with_one_line_against_a_store_it_cannot_use(
    command: str,
    store: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = STORES[store](request, tmp_path)
    code = main([*COMMANDS[command], "--store", url])
    out, err = capsys.readouterr()
    assert code != 0, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("retrysafe: "), err
    assert "Traceback" not in err
    # Nothing claims success: no "purged 0", "ok: ... reachable", "schema ready".
    assert "purged" not in out and "ok:" not in out and "ready" not in out, out


def test_the_failure_line_says_what_is_wrong(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["purge", "--store", _missing_redis_db(redis_url)]) == 2
    assert "DB index is out of range" in capsys.readouterr().err
    assert main(["purge", "--store", "redis://127.0.0.1:1/0"]) == 2
    assert "refused" in capsys.readouterr().err.lower()
    assert main(["check", "--store", f"sqlite:///{tmp_path}/s.db?busy_timeout=x"]) == 2
    assert "busy_timeout" in capsys.readouterr().err


def test_the_command_line_entry_point_exits_non_zero_without_a_traceback(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "retrysafe", "purge", "--store", _unwritable_sqlite(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "unable to open database file" in done.stderr


@pytest.mark.parametrize("command", [[], *([name] for name in ["demo", *COMMANDS])])
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*command, "apply"] if command == ["schema"] else command
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: retrysafe" in out
    assert "``" not in out and ":func:" not in out and ":class:" not in out, out


def test_demo_with_a_short_ttl_needs_no_lease_flag(tmp_path: Path) -> None:
    """``retrysafe demo --ttl 2`` serves (the lease follows the short TTL), and the record
    really expires after 2 s: the same key then runs again."""
    port = free_port()
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "retrysafe", "demo", "--port", str(port), "--ttl", "2"]
    cmd += ["--store", f"sqlite:///{tmp_path}/demo.db", "--log-level", "warning", "--no-worker"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(base + "/orders?limit=0", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        headers = {"Idempotency-Key": '"short-ttl"'}
        body = {"amount": 5, "currency": "EUR"}
        first = httpx.post(base + "/payments", json=body, headers=headers, timeout=10)
        assert first.status_code == 201, first.text
        replay = httpx.post(base + "/payments", json=body, headers=headers, timeout=10)
        assert replay.headers.get("idempotency-replayed") == "true"
        time.sleep(2.2)
        again = httpx.post(base + "/payments", json=body, headers=headers, timeout=10)
        assert again.status_code == 201 and "idempotency-replayed" not in again.headers
        assert again.json()["id"] != first.json()["id"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_demo_with_an_invalid_store_url_fails_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path}/x.db?busy_timeout=soon"
    assert main(["demo", "--store", url, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("retrysafe: "), err


def test_demo_lease_longer_than_ttl_names_the_flag_to_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--ttl", "2", "--lease", "30", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "--lease: must not be longer than --ttl (2 s), got 30" in err
