"""The README's Client snippets run as written against a real OrderHub (only the URL and the
journal path are swapped in)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..e2e.servers import DemoServer
from .conftest import orders_by_item

pytestmark = pytest.mark.e2e

README = Path(__file__).resolve().parents[2] / "README.md"


def client_snippets() -> list[str]:
    text = README.read_text()
    section = text.split("\n## Client\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def run(code: str, server: DemoServer, cwd: Path) -> None:
    code = code.replace("http://127.0.0.1:8000", server.url)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=cwd
    )
    assert result.returncode == 0, result.stderr


def test_every_client_snippet_makes_one_order_and_the_journal_one_replays(
    orderhub: DemoServer, tmp_path: Path
) -> None:
    snippets = client_snippets()
    assert len(snippets) == 4  # httpx, httpx async, requests, journal
    for snippet in snippets:
        run(snippet, orderhub, tmp_path)
    assert orders_by_item(orderhub, "tea") == {"tea": 4}
    journal_snippet = next(s for s in snippets if "SQLiteJournal" in s)
    run(journal_snippet, orderhub, tmp_path)  # the same operation id again: a replay
    assert orders_by_item(orderhub, "tea") == {"tea": 4}
    assert (tmp_path / "operations.db").exists()
