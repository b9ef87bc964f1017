"""``python -m retrysafe.client`` against a real OrderHub: status, replay flag, key and
attempts printed; --key and --operation reuse a key; bad input is one clear line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import RUN_ID
from ..e2e.servers import DemoServer, free_port
from .conftest import orders_by_item

pytestmark = pytest.mark.e2e


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "retrysafe.client", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def fields(stdout: str) -> dict[str, str]:
    head = stdout.split("\n\n", 1)[0]
    return dict(line.split(": ", 1) for line in head.splitlines())


def test_post_prints_status_replay_and_key_and_reuses_a_given_key(orderhub: DemoServer) -> None:
    item = f"{RUN_ID}-cli-key"
    body = f'{{"item": "{item}", "quantity": 1}}'
    first = cli("POST", orderhub.url + "/orders", "--json", body, "--key", f"{item}-k")
    assert first.returncode == 0, first.stderr
    got = fields(first.stdout)
    assert got == {"status": "201", "replayed": "false", "key": f"{item}-k", "attempts": "1"}
    assert f'"item":"{item}"' in first.stdout
    again = cli("post", orderhub.url + "/orders", "--json", body, "--key", f"{item}-k")
    assert fields(again.stdout)["replayed"] == "true"
    assert orders_by_item(orderhub, item) == {item: 1}


def test_operation_reuses_its_journaled_key(orderhub: DemoServer, tmp_path: Path) -> None:
    item = f"{RUN_ID}-cli-op"
    args = ("POST", orderhub.url + "/orders", "--json", f'{{"item": "{item}", "quantity": 3}}')
    first = cli(*args, "--operation", "op-1", cwd=tmp_path)
    second = cli(*args, "--operation", "op-1", cwd=tmp_path)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    a, b = fields(first.stdout), fields(second.stdout)
    assert (a["replayed"], b["replayed"]) == ("false", "true")
    assert a["key"] == b["key"] != "-"
    assert (tmp_path / "retrysafe-operations.db").exists()
    assert orders_by_item(orderhub, item) == {item: 1}


def test_a_4xx_answer_is_printed_and_exits_1(orderhub: DemoServer) -> None:
    result = cli("POST", orderhub.url + "/orders", "--json", '{"item": "no quantity"}')
    assert result.returncode == 1
    assert fields(result.stdout)["status"] == "422"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json", "{not json"), "error: --json is not valid JSON"),
        (("-H", "no-colon"), "error: a header must look like 'Name: value'"),
        (("--key", "k", "--operation", "o"), "error: give --key or --operation, not both"),
        (("--max-attempts", "0"), "error: max_attempts must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = cli("POST", "http://127.0.0.1:9/orders", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_no_server_exhausts_the_retries_and_exits_3() -> None:
    url = f"http://127.0.0.1:{free_port()}/orders"
    result = cli("POST", url, "--json", "{}", "--max-attempts", "2", "--key", "k-3")
    assert result.returncode == 3
    line = result.stderr.strip()
    assert line.startswith("error: no answer after 2 attempt(s)") and "key k-3" in line, line
    assert len(result.stderr.strip().splitlines()) == 1
